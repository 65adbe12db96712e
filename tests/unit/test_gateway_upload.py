"""The upload path without a cluster: UploadChecker, and the app on an in-memory Kubernetes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from llmbatch.core.validation import ValidationLimits
from llmbatch.gateway.uploadcheck import BadLine, UploadChecker
from tests.fixtures.gateway import FakeGateway, auth


def _line(i: int, url: str = "/v1/chat/completions") -> bytes:
    row = {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": url,
        "body": {"model": "m", "max_tokens": 8},
    }
    return json.dumps(row).encode() + b"\n"


def _check(data: bytes, chunk: int = 7) -> UploadChecker:
    checker = UploadChecker(ValidationLimits())
    for start in range(0, len(data), chunk):
        checker.feed(data[start : start + chunk])
    checker.finish()
    return checker


@pytest.mark.parametrize("url", ["/v1/embeddings", "/openai/v1/embeddings"])
def test_endpoint_comes_from_the_first_line(url: str) -> None:
    data = b"\xef\xbb\xbf\n  \n" + _line(1, url) + _line(2, "/v1/embeddings")
    assert _check(data).endpoint == "/v1/embeddings"


def test_a_later_line_with_another_endpoint_names_its_line() -> None:
    with pytest.raises(BadLine) as err:
        _check(_line(1) + _line(2) + _line(3, "/v1/embeddings"))
    assert err.value.problem.line == 3
    assert err.value.problem.code == "mismatched_url"


def test_unsupported_endpoint_on_the_first_line() -> None:
    with pytest.raises(BadLine) as err:
        _check(b"\n" + _line(1, "/v1/audio/speech"))
    assert err.value.problem.code == "unsupported_endpoint"
    assert err.value.problem.line == 2


def test_empty_and_broken_first_lines() -> None:
    with pytest.raises(BadLine) as err:
        _check(b"\n\n")
    assert err.value.problem.code == "empty_file"
    with pytest.raises(BadLine) as err:
        _check(b"{nope\n" + _line(2))
    assert err.value.problem.code == "invalid_json_line"
    assert err.value.problem.line == 1
    assert _check(_line(1).rstrip(b"\n")).endpoint == "/v1/chat/completions"  # no final newline


@pytest.mark.parametrize(
    ("blank", "mebibytes", "piece"),
    [(b"\n", 2, 1 << 16), (b" " * 4095 + b"\n", 64, 1 << 20), (b"\t\r\n", 1, 1000)],
)
def test_a_blank_head_is_scanned_in_linear_time(blank: bytes, mebibytes: int, piece: int) -> None:
    """Issue #13: the head was rescanned from its start on every piece until a non-blank line
    completed (8 MiB of newlines: 7 s; 256 MiB: hours). Each byte is now looked at at most
    twice, however many pieces the head arrives in; blank lines are not held either."""
    head = blank * ((mebibytes << 20) // len(blank))
    checker = UploadChecker(ValidationLimits(max_bytes=300 << 20))
    for start in range(0, len(head), piece):
        checker.feed(head[start : start + piece])
        assert checker.endpoint is None
    assert checker.scanned <= 2 * len(head)
    assert checker.scanned >= len(head)
    lines = head.count(b"\n")
    checker.feed(_line(1, "/v1/embeddings"))
    assert checker.endpoint == "/v1/embeddings"
    assert checker.scanned <= 2 * (len(head) + len(_line(1)))
    with pytest.raises(BadLine) as err:
        checker.feed(b"{oops\n")
    assert err.value.problem.line == lines + 2  # line numbers count the blank head


def test_lines_after_a_blank_head_are_held_to_the_first_lines_endpoint() -> None:
    """The blank head reaches the validator before the endpoint is known; every later line is
    still checked against the endpoint the first line settles."""
    with pytest.raises(BadLine) as err:
        _check(b"\n \r\n\t\n" + _line(1, "/v1/embeddings") + _line(2), chunk=3)
    assert err.value.problem.code == "mismatched_url"
    assert err.value.problem.line == 5


@pytest.mark.parametrize("cut", [1, 2])
def test_a_split_bom_is_still_a_bom(cut: int) -> None:
    data = b"\xef\xbb\xbf" + _line(1, "/v1/embeddings")
    checker = UploadChecker(ValidationLimits())
    checker.feed(data[:cut])
    checker.feed(data[cut:])
    assert checker.finish().request_count == 1
    assert checker.endpoint == "/v1/embeddings"
    broken = UploadChecker(ValidationLimits())  # a BOM's first byte, then no BOM: content
    broken.feed(b"\xef")
    with pytest.raises(BadLine) as err:
        broken.feed(b"\n" + _line(2))
    assert err.value.problem.line == 1


# --- the app on FakeKube ------------------------------------------------------------------------


def _upload(gw: FakeGateway, key: str, data: bytes) -> Any:
    return gw.client.post(
        "/v1/files", headers=auth(key), files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}
    )


def _create(gw: FakeGateway, key: str, file_id: str, **extra: Any) -> Any:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    headers = {**auth(key), **extra.pop("headers", {})}
    return gw.client.post("/v1/batches", headers=headers, json={**body, **extra})


def test_upload_errors_and_purpose(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key("team-a")
    bad = _upload(fake_gateway, key, _line(1) + b"[]\n")
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_json_line"
    assert "Line 2" in bad.json()["error"]["message"]
    assert not list((fake_gateway.store_root).rglob("file-*"))
    wrong = fake_gateway.client.post(
        "/v1/files",
        headers=auth(key),
        files={"file": ("r.jsonl", _line(1))},
        data={"purpose": "fine-tune"},
    )
    assert wrong.status_code == 400
    assert wrong.json()["error"]["param"] == "purpose"
    missing = fake_gateway.client.post(
        "/v1/files", headers=auth(key), files={"file": ("r.jsonl", _line(1))}
    )
    assert missing.status_code == 400
    no_file = fake_gateway.client.post("/v1/files", headers=auth(key), data={"purpose": "batch"})
    assert no_file.status_code == 400
    not_multipart = fake_gateway.client.post("/v1/files", headers=auth(key), content=b"x")
    assert not_multipart.status_code == 400
    big = _upload(fake_gateway, key, _line(1) * 20000)  # > the fixture's 1 MB cap
    assert big.status_code == 413
    assert not list((fake_gateway.store_root).rglob("file-*"))


def test_idempotency_scopes_and_revocation(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key = fake_gateway.key("team-a", name="writer")
    file_a = _upload(fake_gateway, key, _line(1)).json()["id"]
    file_b = _upload(fake_gateway, key, _line(2)).json()["id"]
    first = _create(fake_gateway, key, file_a, headers={"Idempotency-Key": "k"})
    again = _create(fake_gateway, key, file_a, headers={"Idempotency-Key": "k"})
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    conflict = _create(fake_gateway, key, file_b, headers={"Idempotency-Key": "k"})
    assert conflict.status_code == 409
    reader = fake_gateway.key("team-a", scopes="inference:read")
    assert fake_gateway.client.get("/v1/batches", headers=auth(reader)).status_code == 200
    assert _create(fake_gateway, reader, file_a).status_code == 403
    fake_gateway.kube.delete_secret("writer")
    deadline = time.monotonic() + 5
    while fake_gateway.client.get("/v1/files", headers=auth(key)).status_code != 401:
        assert time.monotonic() < deadline, "revoked key still accepted"
        time.sleep(0.01)


def test_queue_limit_counts_non_terminal_batches(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key = fake_gateway.key("team-q")
    fake_gateway.kube.namespaces["team-q"] = {"llmbatch.io/max-queued-requests": "3"}
    file_id = _upload(fake_gateway, key, _line(1) + _line(2)).json()["id"]
    first = _create(fake_gateway, key, file_id)
    assert first.status_code == 200
    assert _create(fake_gateway, key, file_id).status_code == 429
    name = "batch-" + first.json()["id"].removeprefix("batch_")
    fake_gateway.kube.objects[("batches", "team-q", name)]["status"] = {"status": "completed"}
    assert _create(fake_gateway, key, file_id).status_code == 200


# --- MultipartUpload on a synthetic request stream (many pipe hand-offs) ----------------------


class _Request:
    def __init__(self, body: bytes, chunk: int = 65536) -> None:
        self.body = body
        self.chunk = chunk
        self.headers = {"content-type": "multipart/form-data; boundary=bnd"}
        self.read = 0

    async def stream(self) -> Any:
        for start in range(0, len(self.body), self.chunk):
            self.read += self.chunk
            yield self.body[start : start + self.chunk]


def _multipart(data: bytes) -> bytes:
    return (
        b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        + data
        + b"\r\n--bnd--\r\n"
    )


def _run_upload(tmp_path: Any, data: bytes, max_bytes: int = 100_000_000) -> Any:
    from llmbatch.gateway.upload import MultipartUpload
    from llmbatch.storage import open_store

    store = open_store(f"file://{tmp_path}/store")
    request = _Request(_multipart(data))
    upload = MultipartUpload(request, store, "files/t/file-1", max_bytes)  # type: ignore[arg-type]
    result = asyncio.run(upload.run())
    return result, store, request


def test_large_upload_streams_through_many_handoffs(tmp_path: Any) -> None:
    data = b"".join(
        _line(i) for i in range(40_000)
    )  # ~3.4 MB: several 2 MiB hand-offs (50,000 is the request cap)
    result, store, _ = _run_upload(tmp_path, data)
    assert result.result.request_count == 40_000
    assert result.info.size == len(data)
    assert store.get("files/t/file-1") == data


@pytest.mark.parametrize("where", ["start", "end"])
def test_bad_line_in_a_large_upload_publishes_nothing(tmp_path: Any, where: str) -> None:
    from llmbatch.gateway.errors import APIError

    good = b"".join(_line(i) for i in range(40_000))
    data = b"{oops\n" + good if where == "start" else good + b"{oops\n"
    with pytest.raises(APIError) as err:
        _run_upload(tmp_path, data)
    assert err.value.status == 400
    assert err.value.code == "invalid_json_line"
    line = 1 if where == "start" else 40_001
    assert f"Line {line} " in err.value.message
    assert not list((tmp_path / "store").rglob("file-1*"))


def test_file_part_over_the_cap_is_413(tmp_path: Any) -> None:
    from llmbatch.gateway.errors import APIError

    data = b"".join(_line(i) for i in range(40_000))
    with pytest.raises(APIError) as err:
        _run_upload(tmp_path, data, max_bytes=1_000_000)
    assert err.value.status == 413
    assert not list((tmp_path / "store").rglob("file-1*"))


# --- truncated and oversized bodies (issue #13) -------------------------------------------------


@pytest.mark.parametrize("tail", [b"", b"\r\n", b"\r\n--bnd", b"\r\n--bnd-"])
def test_a_body_without_its_closing_boundary_stores_nothing(tmp_path: Any, tail: bytes) -> None:
    """Cut at a line boundary, the file part is valid JSONL: without the closing boundary it
    must not be stored as a complete (shorter) file."""
    from llmbatch.gateway.errors import APIError
    from llmbatch.gateway.upload import MultipartUpload
    from llmbatch.storage import open_store

    body = _multipart(b"".join(_line(i) for i in range(40_000)))
    cut = body.rindex(b"\r\n--bnd--")
    store = open_store(f"file://{tmp_path}/store")
    request = _Request(body[:cut] + tail)
    upload = MultipartUpload(request, store, "files/t/file-1", 100_000_000)  # type: ignore[arg-type]
    with pytest.raises(APIError) as err:
        asyncio.run(upload.run())
    assert err.value.status == 400
    assert err.value.code == "invalid_body"
    assert "closing boundary" in err.value.message
    assert not list((tmp_path / "store").rglob("file-1*"))


def test_truncated_upload_is_400_and_creates_nothing(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key("team-t")
    body = _multipart(_line(1) + _line(2))
    headers = {**auth(key), "Content-Type": "multipart/form-data; boundary=bnd"}
    resp = fake_gateway.client.post(
        "/v1/files", headers=headers, content=body[: body.rindex(b"\r\n--bnd--")]
    )
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert resp.json()["error"]["code"] == "invalid_body"
    assert not list(fake_gateway.store_root.rglob("file-*"))
    assert not [k for k in fake_gateway.kube.objects if k[0] == "batchfiles"]
    whole = fake_gateway.client.post("/v1/files", headers=headers, content=body)
    assert whole.status_code == 200, whole.text  # the same body, complete, is fine


def test_an_oversized_part_header_is_400(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key("team-t")
    headers = {**auth(key), "Content-Type": "multipart/form-data; boundary=bnd"}
    long_name = b"x" * 10_000
    body = (
        b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="'
        + long_name
        + b'"\r\n\r\n'
        + _line(1)
        + b"\r\n--bnd--\r\n"
    )
    resp = fake_gateway.client.post("/v1/files", headers=headers, content=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_body"
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(20))
    body = b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n' + many + b"\r\nbatch"
    resp = fake_gateway.client.post("/v1/files", headers=headers, content=body + b"\r\n--bnd--\r\n")
    assert resp.status_code == 400, resp.text
    assert not list(fake_gateway.store_root.rglob("file-*"))


def test_a_create_body_over_the_cap_is_413(fake_gateway: FakeGateway) -> None:
    from llmbatch.gateway.bodylimit import MAX_CREATE_BODY_BYTES

    key = fake_gateway.key("team-t")
    padding = "x" * MAX_CREATE_BODY_BYTES
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "pad": padding}
    data = json.dumps(body).encode()
    headers = {**auth(key), "Content-Type": "application/json"}
    sized = fake_gateway.client.post("/v1/batches", headers=headers, content=data)

    def pieces() -> Any:  # no Content-Length: cut off as it passes the cap
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    chunked = fake_gateway.client.post("/v1/batches", headers=headers, content=pieces())
    for resp in (sized, chunked):
        assert resp.status_code == 413, resp.text
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "request_too_large"
        assert str(MAX_CREATE_BODY_BYTES) in error["message"]
    assert not [k for k in fake_gateway.kube.objects if k[0] == "batches"]


# --- seed 000: an output-token limit on every row, as the model's pool asks ----------------------


def _bare(i: int, model: str) -> bytes:
    row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**row, "body": {"model": model}}).encode() + b"\n"


def test_the_first_lines_model_decides_whether_rows_need_a_limit() -> None:
    asked: list[str | None] = []

    def requires(base: ValidationLimits, model: str | None) -> ValidationLimits:
        asked.append(model)
        return replace(base, require_output_token_limit=model != "private")

    relaxed = UploadChecker(ValidationLimits(), requires)
    relaxed.feed(b"\n" + _bare(1, "private") + _bare(2, "private"))
    assert relaxed.finish().requests_without_output_limit == 2
    strict = UploadChecker(ValidationLimits(), requires)
    with pytest.raises(BadLine) as err:
        strict.feed(_line(1) + _bare(2, "m"))
    assert (err.value.problem.code, err.value.problem.line) == ("missing_output_token_limit", 2)
    assert asked == ["private", "m"]


def test_output_limit_required_follows_the_pool() -> None:
    from llmbatch.gateway.admission import output_limit_required

    def pool(name: str, **spec: Any) -> dict[str, Any]:
        models = [{"name": name, "source": "/m"}]
        return {"metadata": {"name": f"pool-{name}"}, "spec": {"models": models, **spec}}

    relaxed = {"requireOutputTokenLimit": False}
    pools = [
        pool("catalog"),
        pool("private", billing={"mode": "GPUTime"}, limits=relaxed),
        pool("strict-private", billing={"mode": "GPUTime"}),
        pool("catalog-relaxed", limits=relaxed),  # its rows run with its default limit
    ]
    assert output_limit_required(pools, "catalog")
    assert not output_limit_required(pools, "private")
    assert output_limit_required(pools, "strict-private")
    assert not output_limit_required(pools, "catalog-relaxed")
    assert output_limit_required(pools, "unknown")
    assert output_limit_required(pools, None)


# --- expires_after ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"}, "seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"}, "seconds"),
        ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "anchor"),
        ({"expires_after[seconds]": "3600"}, "anchor"),
        ({"expires_after[anchor]": "created_at"}, "seconds"),
        ({"expires_after[days]": "1", "expires_after[anchor]": "created_at"}, "days"),
    ],
)
def test_expires_after_is_checked_naming_the_param(fields: dict[str, str], param: str) -> None:
    from llmbatch.gateway.errors import APIError
    from llmbatch.gateway.uploadcheck import expires_after_seconds

    with pytest.raises(APIError) as err:
        expires_after_seconds(fields)
    assert (err.value.status, err.value.param) == (400, f"expires_after.{param}")


def test_expires_after_bounds_are_inclusive() -> None:
    from llmbatch.gateway.uploadcheck import expires_after_seconds

    anchor = {"expires_after[anchor]": "created_at", "purpose": "batch"}
    assert expires_after_seconds({"purpose": "batch"}) is None
    for seconds in (3600, 2592000):
        assert expires_after_seconds({**anchor, "expires_after[seconds]": str(seconds)}) == seconds
