"""One tenant's flood does not hold up another's work, on the real control plane with the session
operator (its 16 workers), counted in the order the operator took its steps, not in seconds.

The operator is paused (SIGSTOP) while one tenant's expedited batch finishes its shard and
another tenant creates 200 flex batches, then a third tenant one flex batch; resumed, it finds
all of that at once. The expedited batch's finalisation and the third tenant's acceptance each
come within the first few dozen steps (the workers already busy when they were queued), not
after the flood — which is where the work queue put them before tenants took turns and a
batch's later steps ranked by tier.
"""

from __future__ import annotations

import json
import pathlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llmbatch.core import keys
from llmbatch.storage.shardresults import read_progress
from tests.fixtures.operator import OperatorProcess, paused_operators, simulated_pool
from tests.integration.test_operator import (
    _POOLS,
    MODEL,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    batch_manifest,
    batch_uid,
    chat_requests,
    get_batch,
    make_batch,
    store_of,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
FLOOD = 200
#: A step the operator logs: ``batch <namespace>/<name> → <phase> (<reason>): ...``.
TRANSITION = re.compile(r"batch (?P<ns>[a-z0-9-]+)/(?P<name>batch-[0-9a-f]+) → (?P<phase>\w+) ")


@pytest.fixture
def tenants(cluster: Any) -> Iterator[list[str]]:
    """Two more tenant namespaces (deleted after the test, with their batches)."""
    made = [f"t-flood-{uuid.uuid4().hex[:6]}", f"t-other-{uuid.uuid4().hex[:6]}"]
    for name in made:
        cluster.kubectl("create", "namespace", name)
    yield made
    for name in made:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pool(cluster: Any, tmp_path: pathlib.Path, **spec: Any) -> str:
    name = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(name)
    apply(cluster, tmp_path, simulated_pool(name, MODEL, **spec))
    return name


def flex_batch(namespace: str, pool_name: str) -> dict[str, Any]:
    spec = {"endpoint": "/v1/chat/completions", "pool": pool_name, "metadata": {"tier": "flex"}}
    return batch_manifest(namespace, {**spec, "requests": chat_requests(1)})


def steps_after(operator: OperatorProcess, offset: int) -> list[tuple[str, str, str]]:
    """(namespace, name, phase) of every transition the operator logged past ``offset``."""
    log = sorted(operator.log_dir.glob("*.log"))[-1]
    text = log.read_bytes()[offset:].decode(errors="replace")
    return [(m["ns"], m["name"], m["phase"]) for m in TRANSITION.finditer(text)]


def test_a_flood_of_flex_batches_does_not_hold_up_other_tenants(
    cluster: Any,
    namespace: str,
    tenants: list[str],
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
) -> None:
    flooder, other = tenants
    fast = pool(cluster, tmp_path, maxSlots=1, executor={"engineArgs": ["--latency-seconds=2"]})
    # the flood's pool never starts a slot (no node matches): its batches are accepted and wait
    stuck = pool(cluster, tmp_path, maxSlots=1, nodeSelector={"llmbatch.io/test-none": "true"})
    expedited = make_batch(
        cluster, tmp_path, namespace, pool=fast, requests=chat_requests(1), priority="expedited"
    )
    wait_for(
        lambda: [s.get("phase") for s in (get_batch(cluster, namespace, expedited).get("status")
                                          or {}).get("shards") or []] == ["Running"],
        120,
        "the expedited batch's shard running",
    )  # fmt: skip
    prefix = keys.shard_prefix(namespace, batch_uid(cluster, namespace, expedited), 0)
    flood = [flex_batch(flooder, stuck) for _ in range(FLOOD)]
    late = flex_batch(other, stuck)
    log = sorted(operator_process.log_dir.glob("*.log"))[-1]
    with paused_operators():
        done = wait_for(
            lambda: (p := read_progress(store_of(operator_process), prefix)) and p.done,
            60,
            "the expedited shard's run done",
        )
        assert done
        listing = tmp_path / "flood.json"
        listing.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": flood}))
        cluster.kubectl("apply", "-f", str(listing))
        apply(cluster, tmp_path, late)
        offset = log.stat().st_size
    wait_status(cluster, operator_process, namespace, expedited, {"completed"}, 240)
    late_name = late["metadata"]["name"]
    wait_status(cluster, operator_process, other, late_name, {"in_progress"}, 240)

    def flood_accepted() -> bool:
        accepted = [s for s in steps_after(operator_process, offset) if s[2] == "in_progress"]
        return sum(1 for ns, _, _ in accepted if ns == flooder) == FLOOD

    wait_for(flood_accepted, 300, "the flood accepted")
    steps = steps_after(operator_process, offset)
    acceptances = [(ns, name) for ns, name, phase in steps if phase == "in_progress"]
    finished = steps.index((namespace, expedited, "completed"))
    before_finish = sum(
        1 for ns, _, phase in steps[:finished] if ns == flooder and phase == "in_progress"
    )
    late_place = acceptances.index((other, late_name)) + 1
    print(f"flood acceptances before the expedited finalisation: {before_finish}; "
          f"the other tenant's acceptance at place {late_place} of {len(acceptances)}")  # fmt: skip
    assert before_finish < FLOOD // 4
    assert late_place < FLOOD // 4
