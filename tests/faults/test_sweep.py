"""The fault sweep: each iteration submits a batch through the official SDK, injects one fault
chosen by a seeded random generator — a store fault through the S3 server or Toxiproxy, or a
component killed with SIGKILL — and checks every invariant of docs/reliability.md once the batch
has ended.

``LLMBATCH_FAULT_ITERATIONS`` (default 6: the short sweep of ``make test``; ``make soak`` runs
200) and ``LLMBATCH_FAULT_SEED`` (default: random, printed) choose the run; a failure prints
the seed and iteration that replay it.
"""

from __future__ import annotations

import io
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.faults.conftest import MAX_SLOTS, MODEL, POOL, FaultStack
from tests.faults.invariants import TERMINAL, check_batch, lines
from tests.fixtures.cluster import pids_with_environ

ITERATIONS = int(os.environ.get("LLMBATCH_FAULT_ITERATIONS", "6"))
SEED = int(os.environ.get("LLMBATCH_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
BATCH_TIMEOUT = 240.0

# Keys as the S3 server sees them (path style: /<bucket>/<key>).
TARGETS: dict[str, tuple[list[str], str]] = {
    "upload": (["PUT", "POST"], r"/files/[^/]+/file-"),
    "input-read": (["GET"], r"/(files/[^/]+/file-|work/.*/input\.jsonl)"),
    "chunk-commit": (["PUT"], r"/(output|errors)-\d+"),
    "progress-write": (["PUT"], r"/progress\.json"),
    "shard-spec": (["PUT"], r"/spec\.json"),
    "merge": (["POST", "PUT"], r"/(files/[^/]+/file-|/final/)"),
    "download": (["GET"], r"/files/[^/]+/file-"),
}


@dataclass
class Fault:
    """One fault: what it is, when it starts (after submission) and how long it lasts."""

    name: str
    start: float
    duration: float
    inject: Callable[[FaultStack], None]
    during_upload: bool = False
    during_download: bool = False
    notes: list[str] = field(default_factory=list)


def http_fault(rng: random.Random) -> Fault:
    target = rng.choice(sorted(TARGETS))
    methods, key = TARGETS[target]
    status, code = rng.choice([(503, "SlowDown"), (500, "InternalError")])
    burst = rng.randint(2, 12)
    rule = {"status": status, "code": code, "methods": methods, "key": key, "count": burst}
    rule["probability"] = rng.choice([1.0, 0.5])
    return Fault(
        f"s3-{status}-{code}-x{burst}-{target}",
        start=0.0,
        duration=0.0,  # the burst's count bounds it: it stays armed until its target is hit
        inject=lambda stack: stack.store_faults([rule]),
        during_upload=target == "upload",
        during_download=target == "download",
    )


def tcp_fault(rng: random.Random) -> Fault:
    kind = rng.choice(["latency", "bandwidth", "reset_peer", "timeout", "down"])
    attributes: dict[str, int] = {
        "latency": {"latency": rng.randint(100, 800), "jitter": 100},
        "bandwidth": {"rate": rng.choice([16, 64, 256])},
        "reset_peer": {"timeout": rng.randint(0, 500)},
        "timeout": {"timeout": rng.randint(500, 3000)},
        "down": {},
    }[kind]
    toxicity = 1.0 if kind in ("latency", "bandwidth", "down") else rng.choice([0.2, 0.5])
    stream = rng.choice(["upstream", "downstream"])

    def inject(stack: FaultStack) -> None:
        if kind == "down":
            stack.toxiproxy.set_enabled(stack.proxy, False)
        else:
            stack.toxiproxy.add_toxic(
                stack.proxy, kind, attributes, stream=stream, toxicity=toxicity
            )

    return Fault(
        f"tcp-{kind}-{stream}-{toxicity}",
        start=rng.uniform(0, 6),
        duration=rng.uniform(2, 10),
        inject=inject,
        during_upload=rng.random() < 0.3,
    )


def _pids_of_slots(pool: str = POOL) -> list[int]:
    """The executor processes of the pool's slot pods (the node agent runs pods as processes):
    with warm slots a batch's shards run there, next to other batches' shards."""
    return pids_with_environ(b"LLMBATCH_SLOT=" + pool.encode() + b"-slot-")


def crash_fault(rng: random.Random, uid_of: Callable[[], str | None]) -> Fault:
    victim = rng.choice(["operator", "gateway", "executor", "executor-pod-delete"])
    pause = rng.uniform(0, 3)

    def inject(stack: FaultStack) -> None:
        if victim == "operator":
            stack.operator.kill()
            time.sleep(pause)
            stack.operator.start()
        elif victim == "gateway":
            assert stack.gateway.proc is not None
            stack.gateway.proc.send_signal(signal.SIGKILL)
            stack.gateway.proc.wait()
            time.sleep(pause)
            stack.gateway.start()
        else:
            uid = uid_of()
            if uid is None:
                return
            if victim == "executor":
                for pid in _pids_of_slots():
                    os.kill(pid, signal.SIGKILL)
            else:
                stack.kubectl(
                    "delete", "pods", "-n", "llmbatch-workers", "-l",
                    f"llmbatch.io/pool={POOL}", "--grace-period=0", "--force", "--wait=false",
                    check=False,
                )  # fmt: skip

    return Fault(f"kill-{victim}", start=rng.uniform(0.5, 6), duration=0.0, inject=inject)


class ClientLog:
    """Every HTTP answer the SDK got: a 5xx other than 503 with Retry-After is a violation."""

    def __init__(self) -> None:
        self.bad: list[str] = []

    def hook(self, response: httpx.Response) -> None:
        if response.status_code >= 500 and not (
            response.status_code == 503 and response.headers.get("retry-after")
        ):
            self.bad.append(f"{response.request.method} {response.request.url.path} -> "
                            f"{response.status_code}")  # fmt: skip


def _client(stack: FaultStack, log: ClientLog) -> openai.OpenAI:
    http = httpx.Client(event_hooks={"response": [log.hook]}, timeout=30)
    return openai.OpenAI(
        api_key=stack.key, base_url=stack.gateway.base_url + "/v1", max_retries=8, http_client=http
    )


def _with_retries(fn: Callable[[], Any], seconds: float = 120) -> Any:
    """Call ``fn`` again while the gateway is away (restarting after a kill)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except (openai.APIConnectionError, openai.InternalServerError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _input(rng: random.Random) -> tuple[bytes, list[str]]:
    count = rng.randint(6, 24)
    ids = [f"req-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
    rows = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": rng.randint(4, 16),
            },
        }
        for i, cid in enumerate(ids)
    ]
    return b"".join(orjson.dumps(row) + b"\n" for row in rows), ids


def _pick(rng: random.Random, uid_of: Callable[[], str | None]) -> Fault:
    kind = rng.choice(["http", "http", "tcp", "tcp", "crash"])
    if kind == "http":
        return http_fault(rng)
    if kind == "tcp":
        return tcp_fault(rng)
    return crash_fault(rng, uid_of)


def _leftovers(stack: Any, uid: str) -> list[str]:
    """What the batch left behind some seconds after it ended: work still placed on a slot
    (where the stack can read its store), or more slot Jobs than the pool allows (slots
    themselves stay warm between batches by design)."""
    pool = getattr(stack, "pool", POOL)
    deadline = time.monotonic() + 30
    while True:
        assignments_of = getattr(stack, "assignments_of", None)
        left = list(assignments_of(uid)) if assignments_of is not None else []
        slots = stack.get_json("jobs", "-n", "llmbatch-workers", "-l", f"llmbatch.io/pool={pool}")
        active = [j for j in slots["items"] if not (j.get("status") or {}).get("conditions")]
        if len(active) > MAX_SLOTS:
            left.append(f"{len(active)} slot Jobs > maxSlots {MAX_SLOTS}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def run_iteration(stack: FaultStack, rng: random.Random) -> tuple[str, list[str]]:
    """One batch under one fault; (the fault's name, the violations found)."""
    log = ClientLog()
    client = _client(stack, log)
    data, ids = _input(rng)
    batch_uid: dict[str, str] = {}

    def uid_of() -> str | None:
        return batch_uid.get("uid")

    fault = _pick(rng, uid_of)
    timers: list[threading.Timer] = []

    def schedule() -> None:
        start = threading.Timer(fault.start, fault.inject, args=(stack,))
        start.start()
        timers.append(start)
        if fault.duration:
            stop = threading.Timer(fault.start + fault.duration, stack.clear)
            stop.start()
            timers.append(stop)

    if fault.during_upload:
        schedule()
    upload = _with_retries(
        lambda: client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    )
    batch = _with_retries(
        lambda: client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    )
    name = batch.id.replace("batch_", "batch-", 1)
    batch_uid["uid"] = stack.get_json("batch", name, "-n", stack.tenant)["metadata"]["uid"]
    if not fault.during_upload and not fault.during_download:
        schedule()
    deadline = time.monotonic() + BATCH_TIMEOUT
    while True:
        current = _with_retries(lambda: client.batches.retrieve(batch.id))
        if current.status in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1)
    for timer in timers:
        timer.join(timeout=fault.start + fault.duration + 5)
    if fault.during_download:
        schedule()
    output = _download(client, current.output_file_id)
    errors = _download(client, current.error_file_id)
    for timer in timers:
        timer.cancel()
    stack.clear()
    status = stack.get_json("batch", name, "-n", stack.tenant).get("status") or {}
    found = check_batch(input_ids=ids, status=status, output=output, errors=errors)
    found += [f"client saw {bad}" for bad in log.bad]
    found += [f"left behind: {left}" for left in _leftovers(stack, batch_uid["uid"])]
    return fault.name, found


def _download(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return lines(_with_retries(lambda: client.files.content(file_id).read()))


@pytest.mark.parametrize("iteration", range(ITERATIONS))
def test_fault_sweep(fault_stack: FaultStack, iteration: int) -> None:
    rng = random.Random(f"{SEED}/{iteration}")
    started = time.monotonic()
    errors_before = fault_stack.store_faults(None)
    try:
        fault, violations = run_iteration(fault_stack, rng)
    finally:
        fault_stack.clear()
    s3_errors = fault_stack.store_faults(None) - errors_before
    elapsed = time.monotonic() - started
    print(f"fault-sweep seed={SEED} iteration={iteration} fault={fault} s3_errors={s3_errors} "
          f"seconds={elapsed:.1f} violations={len(violations)}")  # fmt: skip
    assert not violations, (
        f"replay: LLMBATCH_FAULT_SEED={SEED} (iteration {iteration}, fault {fault}):\n"
        + "\n".join(violations)
        + f"\noperator log tail:\n{fault_stack.operator.logs()[-4000:]}"
    )
