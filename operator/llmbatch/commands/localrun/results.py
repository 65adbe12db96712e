"""The results of ``llmbatch run``: chunks merged into OpenAI output and error files, a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import orjson

from llmbatch.api.shard import ShardSpec
from llmbatch.executor.runner import ShardRunner
from llmbatch.storage.base import ObjectStore
from llmbatch.storage.shardresults import list_chunks


def merge_results(
    store: ObjectStore, specs: list[ShardSpec], output: Path, errors: Path
) -> tuple[int, int]:
    """Concatenate every shard's chunks into ``output`` and ``errors``; their line counts."""
    counts = {"output": 0, "errors": 0}
    for kind, path in (("output", output), ("errors", errors)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as handle:
            for spec in specs:
                for key in list_chunks(store, spec.output_prefix, kind):  # type: ignore[arg-type]
                    data = store.get(key)
                    counts[kind] += data.count(b"\n")
                    handle.write(data)
        tmp.replace(path)
    return counts["output"], counts["errors"]


def print_summary(
    console: Any,
    counts: tuple[int, int],
    total: int,
    runners: list[ShardRunner],
    elapsed: float,
    engine_seconds: float,
) -> None:
    """Requests completed and failed, tokens, and output tokens per second after engine start."""
    completed, failed = counts
    out_tokens = sum(r.stats.output_tokens for r in runners)
    in_tokens = sum(r.stats.input_tokens for r in runners)
    run_seconds = max(elapsed - engine_seconds, 1e-9)
    console.print(
        f"completed [green]{completed}[/], failed [red]{failed}[/] of {total}; "
        f"tokens in {in_tokens} / out {out_tokens}; "
        f"{out_tokens / run_seconds:.1f} output tokens/s over {run_seconds:.1f} s "
        f"(+{engine_seconds:.1f} s engine start)"
    )


def echo_answers(*paths: Path) -> None:
    """Each result line of ``paths`` as ``custom_id: answer``."""
    for path in paths:
        for raw in path.read_bytes().splitlines():
            line = orjson.loads(raw)
            click.echo(f"{line['custom_id']}: {summarise_answer(line)}")


def summarise_answer(line: dict[str, Any]) -> str:
    """One line for a result: the error, the first choice's (or the response's) text, or the
    embeddings' shape."""
    body = (line.get("response") or {}).get("body") or {}
    if "error" in body:
        return f"ERROR {line['response']['status_code']}: {body['error'].get('message')}"
    choices = body.get("choices") or []
    if choices:
        first = choices[0]
        text = (
            (first.get("message") or {}).get("content") if "message" in first else first.get("text")
        )
        return str(text).strip()
    if body.get("object") == "response":  # /v1/responses: the message items' output text
        texts = [
            part.get("text", "")
            for item in body.get("output") or []
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        ]
        return "".join(texts).strip()
    data = body.get("data") or []
    if data:
        return f"{len(data)} embedding(s) of {len(data[0].get('embedding', []))} dims"
    return json.dumps(body)[:200]
