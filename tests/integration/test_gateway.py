"""The gateway process on the real control plane, driven by the official ``openai`` SDK.

No operator runs here: where a test needs the batch to move on, it plays the operator by patching
the Batch status subresource (and writing output BatchFiles plus their bytes) itself.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import pathlib
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from llmbatch.core import keys
from llmbatch.core.ids import batch_object_name
from llmbatch.storage import open_store
from tests.fixtures.gateway import GatewayProcess, Tenant, auth, wait_for_key
from tests.fixtures.operator import paused_operators

pytestmark = pytest.mark.timeout(300)

CHAT = "/v1/chat/completions"
TenantFactory = Callable[..., Tenant]


def line(i: int, url: str = CHAT, model: str = "smollm2", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"hello {i}"}],
        "max_tokens": 16,
    }
    row = {"custom_id": f"request-{i}", "method": "POST", "url": url, "body": body}
    row.update(extra)
    return row


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def upload(client: openai.OpenAI, data: bytes, name: str = "requests.jsonl") -> str:
    return client.files.create(file=(name, data), purpose="batch").id


def create(client: openai.OpenAI, file_id: str, **kwargs: Any) -> Any:
    return client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h", **kwargs
    )


def patch_status(gw: GatewayProcess, namespace: str, batch_id: str, status: dict[str, Any]) -> None:
    gw.kubectl(
        "patch",
        "batches.llmbatch.io",
        batch_object_name(batch_id),
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def eventually(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Poll ``read`` until ``ok``: reads may be served from the gateway's 1 s read cache."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def output_file(gw: GatewayProcess, namespace: str, data: bytes, name: str) -> str:
    """Write an output file as the operator does: bytes in the store plus a BatchFile."""
    file_id = keys.new_file_id()
    key = keys.file_key(namespace, file_id)
    info = open_store(gw.store_uri).put(key, data)
    now = int(time.time())
    gw.kubectl(
        "apply",
        "-f",
        "-",
        obj={
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "BatchFile",
            "metadata": {"name": file_id, "namespace": namespace},
            "spec": {
                "id": file_id,
                "bytes": info.size,
                "filename": name,
                "purpose": "batch_output",
                "sha256": info.sha256,
                "storageKey": key,
                "createdAt": now,
                "expiresAt": now + 7 * 86400,
            },
        },
    )
    return file_id


def batch_cr(gw: GatewayProcess, namespace: str, batch_id: str) -> dict[str, Any]:
    out = gw.kubectl(
        "get", "batches.llmbatch.io", batch_object_name(batch_id), "-n", namespace, "-o", "json"
    )
    obj: dict[str, Any] = json.loads(out)
    return obj


def apply_pool(gw: GatewayProcess, name: str, spec: dict[str, Any]) -> None:
    """``kubectl apply`` of the cluster-scoped BatchPool ``name`` (the test deletes it)."""
    obj = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchPool",
        "metadata": {"name": name},
        "spec": spec,
    }
    gw.kubectl("apply", "-f", "-", obj=obj)


@pytest.fixture
def tenant(tenant_factory: TenantFactory) -> Tenant:
    return tenant_factory()


# --- the happy path ----------------------------------------------------------------------------


def test_upload_create_retrieve_complete_download(
    tenant: Tenant, gateway_process: GatewayProcess
) -> None:
    client = tenant.client()
    data = jsonl([line(i) for i in range(3)])
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert uploaded.id.startswith("file-")
    assert len(uploaded.id) == 37
    assert uploaded.bytes == len(data)
    assert uploaded.purpose == "batch"
    assert uploaded.filename == "requests.jsonl"
    assert uploaded.expires_at == uploaded.created_at + 86400
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert client.files.content(uploaded.id).content == data
    # the bytes live under the id, never under the client's filename
    assert open_store(gateway_process.store_uri).head(keys.file_key(tenant.namespace, uploaded.id))

    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"run": "1"},
        extra_headers={"Idempotency-Key": "support-run-1"},
    )
    assert batch.id.startswith("batch_")
    assert batch.status == "validating"
    assert batch.expires_at == batch.created_at + 86400
    assert batch.request_counts is not None
    assert batch.request_counts.total == 0
    assert batch.metadata == {"run": "1"}
    cr = batch_cr(gateway_process, tenant.namespace, batch.id)
    assert cr["spec"]["inputFileID"] == uploaded.id
    assert cr["spec"]["endpoint"] == CHAT
    assert cr["spec"]["priority"] == "standard"

    again = client.batches.retrieve(batch.id)
    assert again.status == "validating"
    assert again.created_at == batch.created_at

    out_lines = [
        {
            "id": f"batch_req_{i}",
            "custom_id": f"request-{i}",
            "response": {"status_code": 200, "request_id": f"req_{i}", "body": {"ok": i}},
            "error": None,
        }
        for i in range(2)
    ]
    err_lines = [
        {
            "id": "batch_req_2",
            "custom_id": "request-2",
            "response": {"status_code": 400, "request_id": "req_2", "body": {"error": {}}},
            "error": None,
        }
    ]
    out_id = output_file(gateway_process, tenant.namespace, jsonl(out_lines), "out.jsonl")
    err_id = output_file(gateway_process, tenant.namespace, jsonl(err_lines), "err.jsonl")
    now = int(time.time())
    patch_status(
        gateway_process,
        tenant.namespace,
        batch.id,
        {
            "status": "completed",
            "model": "smollm2",
            "createdAt": batch.created_at,
            "expiresAt": batch.expires_at,
            "inProgressAt": now,
            "finalizingAt": now,
            "completedAt": now,
            "requestCounts": {"total": 3, "completed": 2, "failed": 1},
            "usage": {
                "inputTokens": 30,
                "cachedTokens": 0,
                "outputTokens": 12,
                "reasoningTokens": 0,
                "totalTokens": 42,
            },
            "outputFileID": out_id,
            "errorFileID": err_id,
        },
    )
    done = eventually(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert done.status == "completed"
    assert done.completed_at == now
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    assert done.usage is not None
    assert done.usage.total_tokens == 42
    assert done.model == "smollm2"
    assert done.output_file_id == out_id
    assert done.error_file_id == err_id
    assert client.files.content(out_id).text == jsonl(out_lines).decode()
    assert client.files.content(err_id).text == jsonl(err_lines).decode()
    out_meta = client.files.retrieve(out_id)
    assert out_meta.purpose == "batch_output"
    assert out_meta.expires_at is not None

    listed = client.files.list(purpose="batch_output")
    assert {f.id for f in listed.data} == {out_id, err_id}
    assert next(f.id for f in client.files.list(order="asc").data) == uploaded.id

    deleted = client.files.delete(out_id)
    assert deleted.deleted
    assert deleted.id == out_id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(out_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(out_id)
    assert (
        open_store(gateway_process.store_uri).head(keys.file_key(tenant.namespace, out_id)) is None
    )


def test_idempotency_key(tenant: Tenant) -> None:
    client = tenant.client()
    first_file = upload(client, jsonl([line(1)]))
    key = {"Idempotency-Key": f"run-{uuid.uuid4()}"}
    first = create(client, first_file, extra_headers=key)
    retry = create(client, first_file, extra_headers=key)
    assert retry.id == first.id
    assert retry.created_at == first.created_at
    other_file = upload(client, jsonl([line(2)]))
    with pytest.raises(openai.ConflictError) as err:
        create(client, other_file, extra_headers=key)
    assert err.value.status_code == 409
    assert err.value.code == "idempotency_key_reused"
    # a new key is a new batch; no key is always a new batch
    assert create(client, other_file, extra_headers={"Idempotency-Key": "x2"}).id != first.id
    assert create(client, first_file).id != create(client, first_file).id


def test_cancel(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    with paused_operators():  # this test plays the operator
        cancel_as_the_operator_lets_it(tenant, gateway_process)


def cancel_as_the_operator_lets_it(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    client = tenant.client()
    batch = create(client, upload(client, jsonl([line(1)])))
    patch_status(
        gateway_process,
        tenant.namespace,
        batch.id,
        {"status": "in_progress", "createdAt": batch.created_at, "inProgressAt": batch.created_at},
    )
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling"
    assert cancelled.cancelling_at is not None
    assert abs(cancelled.cancelling_at - time.time()) < 60
    assert batch_cr(gateway_process, tenant.namespace, batch.id)["spec"]["cancel"] is True
    assert client.batches.retrieve(batch.id).status == "cancelling"
    assert client.batches.cancel(batch.id).status == "cancelling"  # idempotent
    patch_status(
        gateway_process,
        tenant.namespace,
        batch.id,
        {"status": "cancelled", "cancellingAt": cancelled.cancelling_at, "cancelledAt": 1},
    )
    final = eventually(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "cancelled")
    assert final.status == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_" + "0" * 24)


def test_list_pagination_three_pages(tenant: Tenant) -> None:
    client = tenant.client()
    file_id = upload(client, jsonl([line(1)]))
    created = [create(client, file_id).id for _ in range(7)]
    newest_first = list(reversed(created))
    first = client.batches.list(limit=3)
    assert [b.id for b in first.data] == newest_first[:3]
    assert first.has_more
    raw = client.batches.with_raw_response.list(limit=3).http_response.json()
    assert raw["first_id"] == newest_first[0]
    assert raw["last_id"] == newest_first[2]
    second = client.batches.list(limit=3, after=first.data[-1].id)
    assert [b.id for b in second.data] == newest_first[3:6]
    assert second.has_more
    third = client.batches.list(limit=3, after=second.data[-1].id)
    assert [b.id for b in third.data] == newest_first[6:]
    assert not third.has_more
    # the SDK's auto-pagination walks the same pages
    assert [b.id for b in client.batches.list(limit=3)] == newest_first
    assert len(client.batches.list().data) == 7  # default limit 20
    for bad in (0, 101):
        with pytest.raises(openai.BadRequestError):
            client.batches.list(limit=bad)


def test_inline_requests(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    client = tenant.client()
    rows = [line(i) for i in range(3)]
    batch = client.post(
        "/batches",
        body={"requests": rows, "endpoint": CHAT, "completion_window": "24h"},
        cast_to=openai.types.Batch,
    )
    assert batch.status == "validating"
    spec = batch_cr(gateway_process, tenant.namespace, batch.id)["spec"]
    # the requests are in the store, as an upload's would be; the Batch refers to them
    assert "requests" not in spec
    assert "inputFileID" not in spec
    staged = spec["inlineInput"]
    assert staged["key"] == keys.inline_staging_key(tenant.namespace, batch.id)
    assert staged["requests"] == 3
    data = open_store(gateway_process.store_uri).get(staged["key"])
    assert [json.loads(x) for x in data.splitlines()] == rows
    assert staged["bytes"] == len(data)
    assert staged["sha256"] == hashlib.sha256(data).hexdigest()
    # both, or neither, of input_file_id and requests: 400
    file_id = upload(client, jsonl(rows))
    for body in (
        {"requests": rows, "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
        {"endpoint": CHAT, "completion_window": "24h"},
    ):
        with pytest.raises(openai.BadRequestError):
            client.post("/batches", body=body, cast_to=openai.types.Batch)
    dup = [line(1), line(1)]
    with pytest.raises(openai.BadRequestError) as err:
        client.post(
            "/batches",
            body={"requests": dup, "endpoint": CHAT, "completion_window": "24h"},
            cast_to=openai.types.Batch,
        )
    assert err.value.code == "duplicate_custom_id"


def test_a_thousand_inline_requests_leave_the_batch_small(
    tenant: Tenant, gateway_process: GatewayProcess
) -> None:
    """Issue #30: a Batch carrying 1,000 inline requests is what listings, watches and etcd
    move; it stays a few KB, the requests are one object in the store."""
    rows = [line(i) for i in range(1000)]
    batch = tenant.client().post(
        "/batches",
        body={"requests": rows, "endpoint": CHAT, "completion_window": "24h"},
        cast_to=openai.types.Batch,
    )
    cr = batch_cr(gateway_process, tenant.namespace, batch.id)
    assert len(json.dumps(cr)) < 4096, len(json.dumps(cr))
    assert cr["spec"]["inlineInput"]["requests"] == 1000
    data = open_store(gateway_process.store_uri).get(cr["spec"]["inlineInput"]["key"])
    assert len(data.splitlines()) == 1000


def test_both_route_prefixes(tenant: Tenant) -> None:
    v1 = tenant.client("/v1")
    azure_style = tenant.client("/openai/v1")
    rows = [line(i, url="/openai/v1/chat/completions") for i in range(2)]
    file_id = azure_style.files.create(file=("r.jsonl", jsonl(rows)), purpose="batch").id
    batch = azure_style.batches.create(
        input_file_id=file_id,
        endpoint="/openai/v1/chat/completions",  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"tier": "flex"},
    )
    assert batch.endpoint == CHAT
    assert v1.batches.retrieve(batch.id).id == batch.id
    assert v1.files.retrieve(file_id).id == file_id
    assert [b.id for b in azure_style.batches.list().data] == [batch.id]
    assert batch.expires_at == batch.created_at + 72 * 3600  # flex window


def test_models_catalog(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    model = f"model-{uuid.uuid4().hex[:6]}"
    apply_pool(
        gateway_process,
        pool,
        {
            "models": [{"name": model, "source": "/models/x", "revision": "abc"}],
            "tiers": {
                "standard": {
                    "drainTargetSeconds": 43200,
                    "pricing": {"inputPerMillion": "0.22", "outputPerMillion": "0.44"},
                },
                "flex": {
                    "drainTargetSeconds": 172800,
                    "pricing": {"inputPerMillion": "0.15", "outputPerMillion": "0.30"},
                },
                "expedited": {"drainTargetSeconds": 600},
            },
        },
    )
    try:
        client = tenant.client()
        models = {m.id: m for m in client.models.list().data}
        assert model in models
        entry = models[model].model_dump()
        assert entry["object"] == "model"
        assert entry["owned_by"]
        assert entry["batch"]["pool"] == pool
        assert entry["batch"]["revision"] == "abc"
        assert entry["batch"]["tiers"]["standard"]["input_per_million"] == "0.22"
        assert entry["batch"]["tiers"]["flex"]["input_per_million"] == "0.15"
        assert client.models.retrieve(model).id == model
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
    finally:
        gateway_process.kubectl("delete", "batchpool", pool, "--wait=false", check=False)


# --- bad input ---------------------------------------------------------------------------------

_GOOD = [line(1), line(2)]


def _row(**extra: Any) -> bytes:
    return json.dumps(line(3, **extra)).encode() + b"\n"


def _without(field: str) -> bytes:
    return json.dumps({k: v for k, v in line(3).items() if k != field}).encode() + b"\n"


_DEEP = b'{"custom_id": "request-3", "x": ' + b"[" * 70 + b"]" * 70 + b"}\n"
_HUGE = json.dumps(line(3)).replace('"max_tokens": 16', '"max_tokens": 1e400').encode() + b"\n"
_BAD_LINES: list[tuple[str, bytes]] = [
    ("invalid_json_line", b'{"custom_id": "x", nope}\n'),
    ("invalid_json_line", b"[1, 2, 3]\n"),
    ("invalid_encoding", b'{"custom_id": "\xff\xfe"}\n'),
    ("nesting_too_deep", _DEEP),
    ("number_out_of_range", _HUGE),
    ("missing_custom_id", _without("custom_id")),
    ("invalid_custom_id", _row(custom_id=7)),
    ("duplicate_custom_id", json.dumps(line(1)).encode() + b"\n"),
    ("invalid_method", _row(method="GET")),
    ("missing_url", _without("url")),
    ("mismatched_url", _row(url="/v1/embeddings")),
    ("invalid_body", _row(body="text")),
    ("missing_model", _row(body={"messages": []})),
    ("mismatched_model", json.dumps(line(3, model="other")).encode() + b"\n"),
    ("stream_not_supported", _row(body={"model": "smollm2", "stream": True})),
    ("invalid_output_token_limit", _row(body={"model": "smollm2", "max_tokens": -1})),
    # seed 000: no pool relaxes it for this model, so every row bounds its output
    ("missing_output_token_limit", _row(body={"model": "smollm2", "messages": []})),
]


@pytest.mark.parametrize(
    ("code", "bad"), _BAD_LINES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(_BAD_LINES)]
)
def test_bad_line_is_400_naming_the_line(
    tenant: Tenant, gateway_process: GatewayProcess, code: str, bad: bytes
) -> None:
    client = tenant.client()
    data = jsonl(_GOOD) + bad + jsonl([line(9)])
    with pytest.raises(openai.BadRequestError) as err:
        upload(client, data)
    assert err.value.code == code
    assert "Line 3" in err.value.message
    assert err.value.param
    body = err.value.body
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}
    # nothing was published in the store, no BatchFile exists
    store = open_store(gateway_process.store_uri)
    assert not list(store.list(f"files/{tenant.namespace}/"))
    assert client.files.list().data == []


def test_file_level_errors(tenant: Tenant) -> None:
    client = tenant.client()
    with pytest.raises(openai.BadRequestError) as err:
        upload(client, b"\n\n")
    assert err.value.code == "empty_file"
    with pytest.raises(openai.BadRequestError) as err:
        upload(client, jsonl([line(1, url="/v1/images/generations")]))
    assert err.value.code == "unsupported_endpoint"
    # blank lines, a BOM and CRLF are fine
    ok = b"\xef\xbb\xbf" + jsonl([line(1)]).replace(b"\n", b"\r\n") + b"\n\n"
    assert upload(client, ok).startswith("file-")


def test_a_body_cut_before_its_closing_boundary_is_400(
    tenant: Tenant, gateway_process: GatewayProcess
) -> None:
    """Issue #13: cut at a line boundary, the file part is valid JSONL; it must not be stored."""
    client = tenant.client()
    before = {f.id for f in client.files.list().data}
    stored = set(gateway_process.store_root.rglob("file-*"))
    body = (
        b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        + jsonl([line(1), line(2)])
    )
    headers = {**auth(tenant.key), "Content-Type": "multipart/form-data; boundary=bnd"}
    resp = httpx.post(tenant.base_url + "/v1/files", headers=headers, content=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_body"
    assert {f.id for f in client.files.list().data} == before
    assert set(gateway_process.store_root.rglob("file-*")) == stored
    whole = httpx.post(
        tenant.base_url + "/v1/files",
        headers=headers,
        content=body + b"\r\n--bnd--\r\n",
        timeout=30,
    )
    assert whole.status_code == 200, whole.text


def test_a_create_body_over_the_cap_is_413(tenant: Tenant) -> None:
    from llmbatch.gateway.bodylimit import MAX_CREATE_BODY_BYTES

    rows = [line(i) for i in range(600)]
    for row in rows:
        row["body"]["messages"][0]["content"] = "x" * 2000
    body = {"requests": rows, "endpoint": CHAT, "completion_window": "24h"}
    assert len(json.dumps(body)) > MAX_CREATE_BODY_BYTES
    with pytest.raises(openai.APIStatusError) as err:
        tenant.client().post("/batches", body=body, cast_to=openai.types.Batch)
    assert err.value.status_code == 413
    assert err.value.code == "request_too_large"
    assert tenant.client().batches.list().data == []


def test_upload_over_the_cap_is_413(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    client = tenant.client()
    row = json.dumps(line(0)).encode() + b"\n"
    data = row * (gateway_process.max_upload_bytes // len(row) + 2)
    with pytest.raises(openai.APIStatusError) as err:
        upload(client, data)
    assert err.value.status_code == 413
    assert err.value.code == "file_too_large"
    # a chunked upload without Content-Length is cut off as well
    headers = {**auth(tenant.key)}

    def body() -> Any:
        yield b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
        for _ in range(len(data) // 65536 + 1):
            yield data[:65536]

    headers["Content-Type"] = "multipart/form-data; boundary=bnd"
    try:
        resp = httpx.post(
            tenant.base_url + "/v1/files", headers=headers, content=body(), timeout=30
        )
        assert resp.status_code == 413
    except httpx.TransportError:
        pass  # the server may close the connection before the client finishes sending


def test_unknown_ids_are_404(tenant: Tenant) -> None:
    client = tenant.client()
    for bad in ("file-" + "0" * 32, "file-nope", "../../etc/passwd", "file-%2e%2e"):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(bad)
        with pytest.raises(openai.NotFoundError):
            client.files.content(bad)
        with pytest.raises(openai.NotFoundError):
            client.files.delete(bad)
    with pytest.raises(openai.NotFoundError):
        create(client, "file-" + "0" * 32)
    for bad in ("batch_" + "0" * 24, "batch_NOPE", "nope"):
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve(bad)


def test_batch_on_an_output_file_is_400(tenant: Tenant, gateway_process: GatewayProcess) -> None:
    client = tenant.client()
    out = output_file(gateway_process, tenant.namespace, jsonl([line(1)]), "out.jsonl")
    with pytest.raises(openai.BadRequestError) as err:
        create(client, out)
    assert err.value.param == "input_file_id"


def test_wrong_endpoint_and_window(tenant: Tenant) -> None:
    client = tenant.client()
    file_id = upload(client, jsonl([line(1)]))
    for endpoint in ("/v1/images/generations", "/v2/chat/completions", ""):
        with pytest.raises(openai.BadRequestError) as err:
            client.batches.create(
                input_file_id=file_id,
                endpoint=endpoint,  # type: ignore[arg-type]
                completion_window="24h",
            )
        assert err.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
    assert err.value.code == "mismatched_endpoint"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=file_id,
            endpoint=CHAT,
            completion_window="48h",  # type: ignore[arg-type]
        )
    assert err.value.param == "completion_window"


def test_metadata_limits(tenant: Tenant) -> None:
    client = tenant.client()
    file_id = upload(client, jsonl([line(1)]))
    assert create(client, file_id, metadata={f"k{i}": "v" for i in range(16)}).metadata
    for metadata in (
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            create(client, file_id, metadata=metadata)
        assert (err.value.param or "").startswith("metadata")
    assert create(client, file_id, metadata={"k" * 64: "v" * 512}).metadata


def test_expedited_and_queue_limits(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess
) -> None:
    closed = tenant_factory(
        annotations={
            "llmbatch.io/expedited-disabled": "true",
            "llmbatch.io/max-queued-requests": "5",
        }
    )
    client = closed.client()
    # The queued batch must stay unfinished whether or not an operator runs in this session:
    # one on another store than this gateway's fails the batch at once (the input, an upload or
    # staged inline requests, is not in its store). So the session's operators are paused
    # while it counts, and its model's only pool wants more GPUs per slot than a node has.
    pool, model = f"pool-{uuid.uuid4().hex[:6]}", f"model-{uuid.uuid4().hex[:6]}"
    apply_pool(
        gateway_process,
        pool,
        {
            "models": [{"name": model, "source": "simulated"}],
            "gpusPerSlot": 16,
            "executor": {"engine": "simulated"},
        },
    )
    try:
        rows = [line(i, model=model) for i in range(3)]
        file_id = upload(client, jsonl(rows))
        with pytest.raises(openai.BadRequestError) as err:
            create(client, file_id, extra_body={"priority": "expedited"})
        assert err.value.code == "expedited_not_allowed"
        assert err.value.param == "priority"
        with paused_operators():
            queued = client.post(
                "/batches",
                body={"requests": rows, "endpoint": CHAT, "completion_window": "24h"},
                cast_to=openai.types.Batch,
            )
            assert queued.id
            with pytest.raises(openai.RateLimitError) as limited:
                create(client, file_id)  # 3 queued + 3 > 5
        assert limited.value.status_code == 429
    finally:
        gateway_process.kubectl("delete", "batchpool", pool, "--wait=false", check=False)
    open_tenant = tenant_factory()
    oc = open_tenant.client()
    batch = create(oc, upload(oc, jsonl([line(1)])), extra_body={"priority": "expedited"})
    assert batch.model_dump()["priority"] == "expedited"
    with pytest.raises(openai.BadRequestError):
        create(oc, upload(oc, jsonl([line(1)])), extra_body={"priority": "urgent"})


def test_malformed_json_body(tenant: Tenant) -> None:
    for content in (b"{bad json", b"[]", b'"text"', b"", b'{"endpoint": 5}'):
        resp = httpx.post(
            tenant.base_url + "/v1/batches",
            headers={**auth(tenant.key), "Content-Type": "application/json"},
            content=content,
        )
        assert resp.status_code == 400, resp.text
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


# --- auth and tenancy --------------------------------------------------------------------------


def test_missing_wrong_and_revoked_keys(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess
) -> None:
    base = gateway_process.base_url
    for headers in ({}, {"Authorization": "Bearer sk-llmb-wrong"}, {"Authorization": "Basic x"}):
        resp = httpx.get(base + "/v1/batches", headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="sk-llmb-nope", base_url=base + "/v1").batches.list()

    tenant = tenant_factory()
    client = tenant.client()
    assert client.batches.list().data == []
    gateway_process.kubectl(
        "delete", "secret", tenant.secret_name, "-n", gateway_process.gateway_namespace
    )
    started = time.monotonic()
    wait_for_key(base, tenant.key, accepted=False, timeout=10)
    assert time.monotonic() - started < 10
    with pytest.raises(openai.AuthenticationError):
        client.batches.list()


def test_read_only_key(tenant_factory: TenantFactory) -> None:
    writer = tenant_factory()
    file_id = upload(writer.client(), jsonl([line(1)]))
    reader = tenant_factory(scopes="inference:read", namespace=writer.namespace)
    client = reader.client()
    assert [f.id for f in client.files.list().data] == [file_id]
    with pytest.raises(openai.PermissionDeniedError) as err:
        create(client, file_id)
    assert err.value.status_code == 403
    with pytest.raises(openai.PermissionDeniedError):
        upload(client, jsonl([line(1)]))
    with pytest.raises(openai.PermissionDeniedError):
        client.files.delete(file_id)


@pytest.mark.parametrize(
    "path",
    [
        "//v1/files",
        "/v1//files",
        "/v1/./files",
        "/v1/../v1/files",
        "/v1/files/",
        "/v1%2Ffiles",
        "/v1/files%2F",
        "/openai/v1/../../v1/files",
        "/healthz/../v1/files",
        "/metrics/../v1/batches",
        "/V1/files",
        "/v1/files?x=/healthz",
        "/v1/files#/healthz",
    ],
)
def test_path_tricks_never_bypass_auth(gateway_process: GatewayProcess, path: str) -> None:
    parsed = urllib.parse.urlsplit(gateway_process.base_url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=10)
    try:
        conn.request("GET", path)  # sent verbatim: no client-side normalisation
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status in (401, 404, 400), (path, resp.status, body)
    assert "error" in json.loads(body)


def test_tenant_isolation(tenant_factory: TenantFactory, gateway_process: GatewayProcess) -> None:
    a, b = tenant_factory(), tenant_factory()
    ca, cb = a.client(), b.client()
    file_id = upload(ca, jsonl([line(1)]))
    batch = create(ca, file_id, extra_headers={"Idempotency-Key": "shared-key"})
    for call in (
        lambda: cb.files.retrieve(file_id),
        lambda: cb.files.content(file_id),
        lambda: cb.files.delete(file_id),
        lambda: cb.batches.retrieve(batch.id),
        lambda: cb.batches.cancel(batch.id),
        lambda: create(cb, file_id),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.status_code == 404
    assert cb.files.list().data == []
    assert cb.batches.list().data == []
    with pytest.raises(openai.BadRequestError):
        cb.batches.list(after=batch.id)
    # the same idempotency key in another tenant is another batch
    own = create(cb, upload(cb, jsonl([line(1)])), extra_headers={"Idempotency-Key": "shared-key"})
    assert own.id != batch.id
    # A's objects are untouched
    assert ca.files.retrieve(file_id).id == file_id
    assert ca.batches.retrieve(batch.id).status == "validating"


def test_health_and_metrics(gateway_process: GatewayProcess) -> None:
    base = gateway_process.base_url
    assert httpx.get(base + "/healthz").status_code == 200
    assert httpx.get(base + "/readyz").status_code == 200
    metrics = httpx.get(gateway_process.metrics_url).text
    assert "llmbatch_gateway_requests_total" in metrics
    assert "llmbatch_gateway_api_keys" in metrics
    on_api = httpx.get(base + "/metrics")  # issue #18: never on the API port
    assert on_api.status_code == 404
    assert on_api.json()["error"]["code"] == "unknown_url"


def test_defaults_serve_no_docs_and_metrics_apart(
    gateway_process: GatewayProcess, tmp_path: pathlib.Path
) -> None:
    """A gateway started without LLMBATCH_GATEWAY_DOCS: no /docs, /redoc, /openapi.json."""
    proc = GatewayProcess(
        gateway_process.kubeconfig,
        tmp_path / "store",
        tmp_path / "gateway.log",
        gateway_namespace=gateway_process.gateway_namespace,
        docs=None,
    )
    proc.start()
    try:
        for path in ("/docs", "/redoc", "/openapi.json", "/metrics"):
            resp = httpx.get(proc.base_url + path)
            assert resp.status_code == 404, (path, resp.text)
            assert resp.json()["error"]["code"] == "unknown_url"
        assert "llmbatch_gateway_requests_total" in httpx.get(proc.metrics_url).text
    finally:
        proc.stop()


def test_keys_cli_create_list_revoke(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess
) -> None:
    import subprocess
    import sys

    namespace = tenant_factory().namespace
    name = f"cli-{uuid.uuid4().hex[:8]}"
    common = [
        "--gateway-namespace",
        gateway_process.gateway_namespace,
        "--kubeconfig",
        gateway_process.kubeconfig,
    ]

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "llmbatch", "keys", *args, *common],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return done.stdout

    key = cli("create", "--namespace", namespace, "--name", name, "--scopes", "inference:read")
    key = key.strip()
    assert key.startswith("sk-llmb-")
    assert len(key) == len("sk-llmb-") + 43
    secret = json.loads(
        gateway_process.kubectl(
            "get", "secret", name, "-n", gateway_process.gateway_namespace, "-o", "json"
        )
    )
    assert key not in json.dumps(secret)  # only the hash is stored
    wait_for_key(gateway_process.base_url, key, accepted=True)
    reader = openai.OpenAI(api_key=key, base_url=gateway_process.base_url + "/v1", max_retries=0)
    assert reader.batches.list().data == []
    with pytest.raises(openai.PermissionDeniedError):
        upload(reader, jsonl([line(1)]))
    assert f"{name}\t{namespace}\tinference:read" in cli("list")
    cli("revoke", name)
    wait_for_key(gateway_process.base_url, key, accepted=False, timeout=10)


# --- issue #16: file expiry and the output-token limit of seed 000 ------------------------------


def test_files_expires_after_sets_expires_at(
    tenant: Tenant, gateway_process: GatewayProcess
) -> None:
    client = tenant.client()
    data = jsonl([line(1)])
    for seconds in (3600, 2592000):
        f = client.files.create(
            file=("r.jsonl", data),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": seconds},
        )
        assert f.expires_at == f.created_at + seconds
        assert client.files.retrieve(f.id).expires_at == f.created_at + seconds
        obj = json.loads(
            gateway_process.kubectl(
                "get", "batchfiles.llmbatch.io", f.id, "-n", tenant.namespace, "-o", "json"
            )
        )
        assert obj["spec"]["expiresAfterSeconds"] == seconds
    plain = client.files.create(file=("r.jsonl", data), purpose="batch")
    assert plain.expires_at == plain.created_at + 86400  # seed 000's 24 h default


@pytest.mark.parametrize(
    ("expires_after", "param"),
    [
        ({"anchor": "created_at", "seconds": 3599}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2592001}, "expires_after.seconds"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
    ],
)
def test_files_expires_after_out_of_range_is_400_and_stores_nothing(
    tenant: Tenant, gateway_process: GatewayProcess, expires_after: Any, param: str
) -> None:
    client = tenant.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(
            file=("r.jsonl", jsonl([line(1)])), purpose="batch", expires_after=expires_after
        )
    assert err.value.param == param
    body = err.value.body
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}
    assert client.files.list().data == []
    assert not list(open_store(gateway_process.store_uri).list(f"files/{tenant.namespace}/"))


def _pool(gw: GatewayProcess, model: str, **spec: Any) -> str:
    name = f"pool-{uuid.uuid4().hex[:6]}"
    manifest = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchPool",
        "metadata": {"name": name},
        "spec": {"models": [{"name": model, "source": "/models/x"}], **spec},
    }
    gw.kubectl("apply", "-f", "-", obj=manifest)
    return name


def test_rows_without_an_output_limit_are_400_unless_the_pool_relaxes_it(
    tenant: Tenant, gateway_process: GatewayProcess
) -> None:
    """Seed 000: every row sets an output-token limit unless the pool relaxes the rule in its
    spec — a private (GPUTime) pool, or a catalog one (seed 002's sample rows set none; such a
    pool runs them with its billing.defaultOutputTokens as their limit)."""
    catalog, private = (f"model-{uuid.uuid4().hex[:6]}" for _ in range(2))
    relaxed = {"requireOutputTokenLimit": False}
    pools = [
        _pool(gateway_process, catalog),
        _pool(gateway_process, private, billing={"mode": "GPUTime"}, limits=relaxed),
    ]
    try:
        client = tenant.client()
        bare = line(2, model=catalog)
        del bare["body"]["max_tokens"]
        with pytest.raises(openai.BadRequestError) as err:
            upload(client, jsonl([line(1, model=catalog), bare]))
        assert err.value.code == "missing_output_token_limit"
        assert "Line 2" in err.value.message
        assert err.value.param == "body.max_completion_tokens"
        # completions are bounded by max_tokens only
        prompt = {"model": catalog, "prompt": "hi", "max_completion_tokens": 8}
        completion = {"custom_id": "c", "method": "POST", "url": "/v1/completions"}
        with pytest.raises(openai.BadRequestError) as err:
            upload(client, jsonl([{**completion, "body": prompt}]))
        assert (err.value.code, err.value.param) == (
            "missing_output_token_limit",
            "body.max_tokens",
        )
        assert client.files.list().data == []
        # inline requests: the same rule at creation, naming the request
        inline = {"requests": [line(1, model=catalog), bare], "endpoint": CHAT}
        with pytest.raises(openai.BadRequestError) as err:
            client.post(
                "/batches", body={**inline, "completion_window": "24h"}, cast_to=openai.types.Batch
            )
        assert err.value.code == "missing_output_token_limit"
        assert err.value.param == "requests[1].body.max_completion_tokens"
        assert client.batches.list().data == []
        # the private pool relaxed it: accepted, the rows without a limit recorded
        rows = [line(1, model=private), line(2, model=private)]
        for row in rows:
            del row["body"]["max_tokens"]
        file_id = upload(client, jsonl(rows))
        obj = json.loads(
            gateway_process.kubectl(
                "get", "batchfiles.llmbatch.io", file_id, "-n", tenant.namespace, "-o", "json"
            )
        )
        assert obj["spec"]["requestsWithoutOutputLimit"] == 2
        relaxed_inline = {"requests": rows, "endpoint": CHAT, "completion_window": "24h"}
        batch = client.post("/batches", body=relaxed_inline, cast_to=openai.types.Batch)
        assert batch.status == "validating"
        # a catalog pool may relax it too: the rows are then accepted
        gateway_process.kubectl(
            "patch",
            "batchpool",
            pools[0],
            "--type=merge",
            "-p",
            json.dumps({"spec": {"limits": relaxed}}),
        )
        relaxed_catalog = [line(1, model=catalog), bare]
        assert upload(client, jsonl(relaxed_catalog)).startswith("file-")
    finally:
        for pool in pools:
            gateway_process.kubectl("delete", "batchpool", pool, "--wait=false", check=False)
