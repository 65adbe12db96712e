"""``llmbatch run``'s one-line summary of each result, for every endpoint's body."""

from __future__ import annotations

from llmbatch.commands.localrun.results import summarise_answer


def _line(body: dict[str, object], status: int = 200) -> dict[str, object]:
    return {"custom_id": "r", "response": {"status_code": status, "body": body}}


def test_each_endpoint_gets_its_text_or_shape() -> None:
    chat = {"choices": [{"message": {"content": " hi "}}]}
    completion = {"choices": [{"text": "ok"}]}
    response = {
        "object": "response",
        "output": [
            {"type": "reasoning", "content": []},
            {"type": "message", "content": [{"type": "output_text", "text": "Hello "}]},
            {"type": "message", "content": [{"type": "output_text", "text": "there."}]},
        ],
    }
    embeddings = {"data": [{"embedding": [0.1, 0.2, 0.3]}]}
    error = {"error": {"message": "too long"}}
    assert summarise_answer(_line(chat)) == "hi"
    assert summarise_answer(_line(completion)) == "ok"
    assert summarise_answer(_line(response)) == "Hello there."
    assert summarise_answer(_line(embeddings)) == "1 embedding(s) of 3 dims"
    assert summarise_answer(_line(error, 400)) == "ERROR 400: too long"
