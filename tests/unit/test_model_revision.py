"""A pinned model revision reaches the engine as the weights folder it names (seed 000:
"submission pins the model revision"): a Hugging Face cache repository resolves a ref or commit
to its snapshot, a snapshot or a folder with a REVISION file must hold the pin, and other weights
never start under the pinned name. The pool's revision is carried in every slot spec."""

from __future__ import annotations

import logging
import pathlib

import pytest

from llmbatch.api.shard import ModelRef, ShardSpec
from llmbatch.api.slot import SlotSpec
from llmbatch.core import keys
from llmbatch.executor import revision
from llmbatch.executor.engines.base import EngineConfigError
from llmbatch.executor.engines.vllm import engine_argv, pinned_weights
from llmbatch.storage.slotchannel import SlotChannel
from tests.fixtures.builders import MODEL, TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

OLD = "0123456789abcdef0123456789abcdef01234567"
NEW = "fedcba9876543210fedcba9876543210fedcba98"


def cache_repo(root: pathlib.Path) -> pathlib.Path:
    """``models--org--name`` with two snapshots; refs/main at NEW, refs/v1 at OLD."""
    repo = root / "models--org--tiny"
    for commit in (OLD, NEW):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(NEW + "\n")
    (repo / "refs" / "v1").write_text(OLD)
    return repo


@pytest.mark.parametrize(
    ("pin", "commit"),
    [(None, NEW), ("main", NEW), ("v1", OLD), (OLD, OLD), (OLD[:7], OLD), (NEW[:12], NEW)],
)
def test_a_cache_repository_resolves_the_pin_to_its_snapshot(
    tmp_path: pathlib.Path, pin: str | None, commit: str
) -> None:
    repo = cache_repo(tmp_path)
    weights = revision.resolve(str(repo), pin)
    assert weights == revision.Weights(repo / "snapshots" / commit, commit, True)


@pytest.mark.parametrize("pin", ["v2", OLD[:6], "0" * 40, "../refs/main", "/etc/passwd"])
def test_a_pin_the_cache_does_not_hold_is_refused_naming_what_it_has(
    tmp_path: pathlib.Path, pin: str
) -> None:
    repo = cache_repo(tmp_path)
    with pytest.raises(revision.RevisionMismatch) as info:
        revision.resolve(str(repo), pin)
    assert repr(pin) in str(info.value)


def test_a_snapshot_folder_must_be_the_pinned_commit(tmp_path: pathlib.Path) -> None:
    snapshot = cache_repo(tmp_path) / "snapshots" / OLD
    assert revision.resolve(str(snapshot), None).revision == OLD
    assert revision.resolve(str(snapshot), "v1").folder == snapshot  # the ref points at it
    assert revision.resolve(str(snapshot), OLD[:8]).verified
    with pytest.raises(revision.RevisionMismatch, match="is snapshot"):
        revision.resolve(str(snapshot), "main")


def test_a_plain_folder_is_checked_against_its_revision_file(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    assert revision.resolve(str(folder), None) == revision.Weights(folder, None, False)
    assert revision.resolve(str(folder), "r7") == revision.Weights(folder, "r7", False)
    (folder / revision.MARKER).write_text("r7\nnotes\n")
    assert revision.resolve(str(folder), None) == revision.Weights(folder, "r7", True)
    assert revision.resolve(str(folder), "r7").verified
    with pytest.raises(revision.RevisionMismatch, match="holds revision 'r7'"):
        revision.resolve(str(folder), "r8")


def test_the_engine_loads_the_pinned_snapshot_and_refuses_other_weights(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = cache_repo(tmp_path)
    model = pinned_weights(ModelRef(name="tiny", path=str(repo), revision="v1"))
    assert engine_argv(model, ["tiny"], {})[:2] == ["--model", str(repo / "snapshots" / OLD)]
    assert model.revision == OLD
    with pytest.raises(EngineConfigError, match="not in the model cache"):
        pinned_weights(ModelRef(name="tiny", path=str(repo), revision="v9"))
    plain = tmp_path / "plain"
    plain.mkdir()
    with caplog.at_level(logging.WARNING):
        assert pinned_weights(ModelRef(name="p", path=str(plain), revision="x")).path == str(plain)
    assert "served unchecked" in caplog.text


def pool_harness(tmp_path: pathlib.Path, revision: str | None, **spec: object) -> ReconcilerHarness:
    """The reconciler harness with pool-a serving MODEL at ``revision`` (None: unpinned)."""
    h = ReconcilerHarness(tmp_path)
    pool = make_pool(scaleDownCooldownSeconds=0, **spec)
    if revision is not None:
        pool["spec"]["models"][0]["revision"] = revision
    h.kube.add("batchpools", pool)
    return h


def set_revision(h: ReconcilerHarness, revision: str) -> None:
    """`kubectl edit batchpool pool-a`: the model's revision moves on, nothing else."""
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    pool["spec"]["models"][0]["revision"] = revision


def submit(h: ReconcilerHarness, name: str, digit: str, requests: int) -> dict[str, object]:
    """Create batch ``batch-`` + ``name`` * 24 of ``requests`` lines; its status once accepted."""
    batch, file_id = "batch-" + name * 24, "file-" + digit * 32
    h.kube.add("batchfiles", make_input_file(h.store, file_id, requests))
    h.kube.add("batches", make_batch(batch, input_file_id=file_id))
    return h.step_until(batch, "in_progress")


def test_the_pools_revision_is_in_the_slot_spec(tmp_path: pathlib.Path) -> None:
    h = pool_harness(tmp_path, "v1")
    submit(h, "r", "0", 2)
    h.step("batch-" + "r" * 24)
    h.pool_round()
    (job,) = h.jobs()
    spec_key = f"{keys.slot_prefix('pool-a', job['metadata']['name'])}/spec.json"
    spec = SlotSpec.model_validate_json(h.store.get(spec_key))
    assert (spec.model.name, spec.model.revision) == (MODEL, "v1")


def test_acceptance_pins_the_revision_and_every_shard_runs_it_across_a_pool_edit(
    tmp_path: pathlib.Path,
) -> None:
    h = pool_harness(tmp_path, "v1", shardRequests=2)
    name = "batch-" + "p" * 24
    status = submit(h, "p", "1", 6)
    assert status["modelRevision"] == "v1"
    assert any("(revision v1)" in message for _, _, message in h.events)
    # `kubectl edit batchpool`: the model's revision moves on; the shards keep the pinned one
    set_revision(h, "v2")
    h.step(name)
    uid = h.batch(name)["metadata"]["uid"]
    pinned = [
        ShardSpec.model_validate_json(h.store.get(keys.shard_spec_key(TENANT, uid, i))).model
        for i in range(3)
    ]
    assert [m.revision for m in pinned] == ["v1"] * 3
    # a batch accepted after the edit gets the new revision
    assert submit(h, "q", "2", 2)["modelRevision"] == "v2"


def test_a_pool_without_a_revision_pins_none(tmp_path: pathlib.Path) -> None:
    h = pool_harness(tmp_path, None)
    assert "modelRevision" not in submit(h, "n", "3", 2)
    assert not any("revision" in message for _, _, message in h.events)


def _slot_model(h: ReconcilerHarness, job: dict[str, object]) -> tuple[str, str | None]:
    name = job["metadata"]["name"]  # type: ignore[index]
    spec = SlotSpec.model_validate_json(
        h.store.get(f"{keys.slot_prefix('pool-a', name)}/spec.json")
    )
    return spec.model.name, spec.model.revision


def test_a_revision_edit_keeps_a_slot_of_the_old_one_for_the_batches_pinned_to_it(
    tmp_path: pathlib.Path,
) -> None:
    """The pool moves its model from v1 to v2 while a batch pinned to v1 runs: the v1 slot is
    not retired (the edit changed nothing else), it keeps taking that batch's shards and no
    other; the batch accepted after the edit starts a slot of v2; both complete, each from one
    revision."""
    h = pool_harness(tmp_path, "v1", maxSlots=2, slotConcurrency=1)
    first, second = "batch-" + "s" * 24, "batch-" + "t" * 24
    submit(h, "s", "4", 4)
    h.pool_round()
    (old,) = h.jobs()
    assert _slot_model(h, old) == (MODEL, "v1")
    set_revision(h, "v2")
    h.pool_round()
    assert "SlotOutdated" not in h.reasons()
    submit(h, "t", "5", 2)
    ran: dict[str, tuple[str, str | None]] = {}  # work key -> the model its slot served
    for _ in range(8):
        h.pool_round()
        for job in h.live_slots():
            prefix = keys.slot_prefix("pool-a", job["metadata"]["name"])
            for key in SlotChannel(h.store, prefix).assignments():
                ran[key] = _slot_model(h, job)
            h.run_slot(job)
        h.pool_round()
        for name in (first, second):
            h.step(name)
    served: dict[str, set[tuple[str, str | None]]] = {}
    for name in (first, second):
        assert h.status(name)["status"] == "completed"
        uid = h.batch(name)["metadata"]["uid"]
        served[name] = {model for key, model in ran.items() if uid in key}
    # the batch pinned to v1 ran on v1 slots only (a new one after the edit, too), the later on v2
    assert served == {first: {(MODEL, "v1")}, second: {(MODEL, "v2")}}


def test_a_model_removed_from_the_pool_ends_its_waiting_shards_with_an_error_line_each(
    tmp_path: pathlib.Path,
) -> None:
    """A batch pinned to MODEL@v1 has run one of its three shards when MODEL is removed from
    the pool: the shards still waiting are given up at the next round (no slot of another model
    runs them), the batch completes with the first shard's results and a shard_failed line
    naming the removal for each unrun request, and only the run requests count as used."""
    h = ReconcilerHarness(tmp_path)
    pool = make_pool(
        models=(MODEL, "other"),
        scaleDownCooldownSeconds=0,
        maxSlots=1,
        slotConcurrency=1,
        slotQueue=0,
    )
    pool["spec"]["models"][0]["revision"] = "v1"
    h.kube.add("batchpools", pool)
    name = "batch-" + "g" * 24
    submit(h, "g", "6", 6)
    h.step(name)
    h.pool_round()
    (job,) = h.jobs()
    h.run_slot(job, only={0})
    edited = h.kube.get("batchpools", None, "pool-a")  # `kubectl edit batchpool`
    assert edited is not None
    edited["spec"]["models"] = [m for m in edited["spec"]["models"] if m["name"] != MODEL]
    for _ in range(4):
        h.pool_round()
        for slot in h.live_slots():
            assert _slot_model(h, slot) == (MODEL, "v1")  # only the slot started before
            h.run_slot(slot)
        h.step(name)
    status = h.step_until(name, "completed")
    assert status["requestCounts"] == {"total": 6, "completed": 2, "failed": 4}
    assert sorted(line["custom_id"] for line in h.file_lines(status["outputFileID"])) == [
        "req-0",
        "req-1",
    ]
    errors = h.file_lines(status["errorFileID"])
    assert sorted(e["custom_id"] for e in errors) == [f"req-{i}" for i in range(2, 6)]
    for line in errors:
        assert line["error"]["code"] == "shard_failed"
        assert "no longer serves model 'm' (revision v1)" in line["error"]["message"], line
    assert "ModelRemoved" in h.reasons()
    assert status["usage"]["outputTokens"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"]
        for line in h.file_lines(status["outputFileID"])
    )
