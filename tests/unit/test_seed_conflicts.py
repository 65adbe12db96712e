"""Where the product documents disagree, the project's choices (docs/gateway.md, "Where the
documents disagree"), each pinned by a test:

1. Seed 004's "no completion deadline on either tier" against seed 000's 24-hour window and
   seed 004's own ``expires_at``: every tier has a window (24 h; flex 72 h) and work unfinished
   at ``expires_at`` expires (``batch_expired`` lines, finished results kept); "no deadline"
   means no tier promises completion by a time, expedited included.
2. Seed 002's "files up to 200 MB" against seed 000's 256 MiB: the limit is 256 MiB, so every
   file seed 002 promises (up to 200 MB) is accepted.
3. Seed 000's "a 429 can mean the batch is too large" against the 400 for a batch over the
   per-batch cap: a batch that can never fit (over the pool's per-batch caps) is 400 — retrying
   cannot help, and the openai SDK retries a 429 on its own; a batch too large for what is left
   now (the tenant's or the pool's queue) is 429 with ``Retry-After``.
4. Seed 000's "each row needs an output-token limit" against seed 002's sample rows without one:
   a pool decides (required by default); a catalog pool that accepts such rows runs them with
   its ``billing.defaultOutputTokens`` as their limit (tests/unit/test_seed_promises.py runs
   seed 002's file on seed 002's pool).
5. Seed 004's ``priority: standard | expedited`` against seed 002's flex tier and seed 004's own
   "the tier this batch runs and is billed at": a flex batch reads ``flex``.
6. Seed 000's pinned revision against seed 004's "Model id, settled from the input file": the
   model is the id, the revision ``model_revision``.
7. Seed 000's "cancellation stops unfinished work" against seed 002's "running requests finish":
   nothing new starts, what runs finishes — a request between retry attempts included
   (tests/unit/test_executor_retries.py::test_a_request_between_attempts_at_a_cancel_finishes).
"""

from __future__ import annotations

import pathlib
from typing import Any

import openai
import pytest
import yaml

from llmbatch.api.resources import BatchPoolSpec, BatchSpec, PoolLimits
from llmbatch.core.admission import check_batch_size, default_output_limit, output_limit_required
from llmbatch.gateway.mapping import batch_to_openai
from llmbatch.gateway.settings import DEFAULT_MAX_UPLOAD_BYTES
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.gateway import FakeGateway, auth
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_gateway_admission import add_pool, rows

ROOT = pathlib.Path(__file__).resolve().parents[2]
NS = "team-a"
BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"
DAY = 86400


# --- 1. the window --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "window"), [("expedited", DAY), ("standard", DAY), ("flex", 3 * DAY)]
)
def test_every_tier_has_a_window_and_unfinished_work_expires_at_it(
    tmp_path: pathlib.Path, priority: str, window: int
) -> None:
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool())
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 3))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE, priority=priority))
    status = h.step_until(BATCH, "in_progress")
    assert status["expiresAt"] == status["createdAt"] + window
    h.now = status["expiresAt"] - 1  # not yet: nothing expires before the window closes
    assert h.step_until(BATCH, "in_progress")["status"] == "in_progress"
    h.now = status["expiresAt"] + 1
    status = h.step_until(BATCH, "expired")
    errors = h.file_lines(status["errorFileID"])
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 3


@pytest.mark.parametrize("priority", ["expedited", "standard"])
def test_the_wire_expires_at_is_created_at_plus_24h_on_both_tiers(
    fake_gateway: FakeGateway, priority: str
) -> None:
    add_pool(fake_gateway)
    key = fake_gateway.key(NS)
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": rows(1)}
    resp = fake_gateway.client.post(
        "/v1/batches", headers=auth(key), json={**body, "priority": priority}
    )
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    assert batch["expires_at"] == batch["created_at"] + DAY


# --- 2. the file size -----------------------------------------------------------------------------


def test_the_input_limit_is_256_mib_so_every_200_mb_file_fits() -> None:
    assert DEFAULT_MAX_UPLOAD_BYTES == 256 * 1024 * 1024 == PoolLimits().max_bytes
    pool = BatchPoolSpec.model_validate({"models": [{"name": "m", "source": "/m"}]})
    assert check_batch_size("p", pool, 1, 200_000_000, "input_file_id") is None  # seed 002
    assert check_batch_size("p", pool, 1, 256 * 1024 * 1024, "input_file_id") is None
    over = check_batch_size("p", pool, 1, 256 * 1024 * 1024 + 1, "input_file_id")
    assert over is not None
    assert (over.kind, over.code) == ("too_large", "file_too_large")


# --- 3. 400 or 429 --------------------------------------------------------------------------------


def sdk(gw: FakeGateway, key: str, sent: list[str], retries: int) -> openai.OpenAI:
    gw.client.event_hooks = {"request": [lambda request: sent.append(request.url.path)]}
    return openai.OpenAI(
        api_key=key,
        base_url="http://testserver/v1",
        http_client=gw.client,
        max_retries=retries,
    )


def create_inline(client: openai.OpenAI, requests: list[dict[str, Any]]) -> Any:
    return client.post(
        "/batches",
        body={"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": requests},
        cast_to=openai.types.Batch,
    )


def test_over_the_per_batch_cap_is_400_and_the_sdk_does_not_retry(
    fake_gateway: FakeGateway,
) -> None:
    add_pool(fake_gateway, {"limits": {"maxRequests": 2}})
    sent: list[str] = []
    client = sdk(fake_gateway, fake_gateway.key(NS), sent, retries=2)
    with pytest.raises(openai.BadRequestError) as err:
        create_inline(client, rows(3))
    assert err.value.code == "too_many_requests"
    assert err.value.param == "requests"
    assert sent.count("/v1/batches") == 1  # not retried: it can never fit


def test_too_large_for_what_is_left_now_is_429_with_retry_after(
    fake_gateway: FakeGateway,
) -> None:
    add_pool(fake_gateway)
    fake_gateway.kube.namespaces[NS] = {"llmbatch.io/max-queued-requests": "4"}
    sent: list[str] = []
    client = sdk(fake_gateway, fake_gateway.key(NS), sent, retries=0)
    create_inline(client, rows(3))
    with pytest.raises(openai.RateLimitError) as err:
        create_inline(client, rows(2))  # 3 queued + 2 > 4
    assert err.value.code == "queue_full"
    assert err.value.response.headers["retry-after"] == "60"


# --- 4. the output-token limit --------------------------------------------------------------------


def test_a_pool_decides_whether_rows_need_an_output_limit() -> None:
    default = BatchPoolSpec.model_validate({"models": [{"name": "m", "source": "/m"}]})
    assert output_limit_required(default)  # seed 000's rule unless the pool relaxes it
    assert default_output_limit(default) is None
    manifest = yaml.safe_load((ROOT / "examples" / "pool-qwen3.8-27b-batch.yaml").read_text())
    seed_002 = BatchPoolSpec.model_validate(manifest["spec"])
    assert not output_limit_required(seed_002)
    assert default_output_limit(seed_002) == seed_002.billing.default_output_tokens == 1024
    private = BatchPoolSpec.model_validate(
        {
            "models": [{"name": "m", "source": "/m"}],
            "billing": {"mode": "GPUTime"},
            "limits": {"requireOutputTokenLimit": False},
        }
    )
    assert default_output_limit(private) is None  # billed by time: the engine's own bound


# --- 5. and 6. the tier and the model a batch reads -----------------------------------------------


def test_a_flex_batch_reads_flex_and_its_model_is_the_id() -> None:
    obj = make_batch(BATCH, input_file_id=FILE, metadata={"tier": "flex"})
    obj["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    obj["status"] = {"status": "in_progress", "model": "m", "modelRevision": "r7"}
    wire = batch_to_openai(obj)
    assert wire.priority == "flex"
    assert (wire.model, wire.model_revision) == ("m", "r7")


# --- 7. a cancel --------------------------------------------------------------------------------


def test_a_cancel_lets_what_runs_finish() -> None:
    text = " ".join((BatchSpec.model_fields["cancel"].description or "").split())
    assert "requests already running finish (a request between retry attempts included)" in text
