"""The crash sweep's iteration, shared by the stack ``llmbatch dev up`` starts
(``test_devstack_sweep.py``) and the chart install (``tests/integration/test_chart_install.py``):
submit a batch through the official SDK, SIGKILL one victim chosen by a seeded generator at a
random moment while the batch runs, wait for the end and check every invariant of
docs/reliability.md.

``LLMBATCH_CRASH_ITERATIONS`` (default 3: the short sweep of ``make test``; ``make soak`` runs
more) and ``LLMBATCH_CRASH_SEED`` (default: random, printed) choose the run; a failure prints
the line that replays it. ``LLMBATCH_CRASH_VICTIMS`` (comma-separated) narrows the victims.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import openai

from tests.faults.invariants import TERMINAL, check_batch
from tests.faults.test_sweep import ClientLog, _download, _input, _leftovers, _with_retries

ITERATIONS = int(os.environ.get("LLMBATCH_CRASH_ITERATIONS", "3"))
SEED = int(os.environ.get("LLMBATCH_CRASH_SEED") or random.SystemRandom().randrange(1 << 30))
BATCH_TIMEOUT = 240.0
KILL_WINDOW = (0.0, 10.0)
"""Seconds after the batch's creation within which the victim is killed (the simulated engine's
batches of 6-24 requests run for roughly 5-15 s on this stack)."""
VICTIM_WAIT = 15.0
"""How long a kill waits for its victim to exist (an executor pod between two shards)."""
HEAL_TIMEOUT = 120.0
VICTIMS = ("operator", "gateway", "executor", "apiserver", "node-agent")
"""Every part a crash sweep kills, on either stack."""
ONLY_VICTIMS = [v for v in os.environ.get("LLMBATCH_CRASH_VICTIMS", "").split(",") if v]


def http_ok(url: str) -> bool:
    """Whether ``url`` answers below 400 within 3 s (a restarted part serves again)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status < 400)
    except OSError:
        return False


def supervised_pid(status: dict[str, Any], victim: str) -> list[int]:
    """The pid of a part the dev supervisor runs (``apiserver`` is its control plane)."""
    pid = status.get("controlplane_pid") if victim == "apiserver" else None
    pid = pid or (status.get("components") or {}).get(victim)
    return [pid] if isinstance(pid, int) else []


def kill_all(pids: list[int]) -> list[int]:
    """SIGKILL each pid; the ones that were still there."""
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


class CrashStack(Protocol):
    """A running stack the sweep can break: where its gateway is, what it can kill."""

    name: str
    base_url: str
    key: str
    tenant: str
    victims: tuple[str, ...]

    def get_json(self, *args: str) -> Any:
        """``kubectl get ARGS -o json`` on the stack's cluster."""
        ...

    def kill(self, victim: str, batch_uid: str) -> list[int]:
        """SIGKILL ``victim`` (the processes of the batch's executor pods for ``executor``);
        the pids killed, empty when there was none to kill right now."""
        ...

    def healthy(self) -> list[str]:
        """What is not (yet) back to serving: empty once every killed part was restarted."""
        ...

    def explain(self) -> str:
        """Log tails and status for a failure message."""
        ...


@dataclass
class Kill:
    """What one iteration's kill did."""

    victim: str
    at: float
    pids: list[int] = field(default_factory=list)
    batch_running: bool = False
    """The batch had not ended when the victim died (the kill hit a running batch)."""


@dataclass
class Outcome:
    kill: Kill
    violations: list[str]
    seconds: float


@dataclass
class SweepFigures:
    """Totals of a sweep, printed at its end (docs/reliability.md's figures)."""

    stack: str
    iterations: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    misses: Counter[str] = field(default_factory=Counter)
    violations: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.iterations += 1
        kill = outcome.kill
        (self.hits if kill.pids and kill.batch_running else self.misses)[kill.victim] += 1
        self.violations += len(outcome.violations)
        self.seconds.append(outcome.seconds)

    def summary(self) -> str:
        median = sorted(self.seconds)[len(self.seconds) // 2] if self.seconds else 0.0
        return (
            f"crash-sweep summary stack={self.stack} seed={SEED} iterations={self.iterations} "
            f"victims_hit={dict(sorted(self.hits.items()))} "
            f"missed={dict(sorted(self.misses.items()))} violations={self.violations} "
            f"wall={sum(self.seconds):.0f}s median_iteration={median:.1f}s"
        )


def _client(stack: CrashStack, log: ClientLog) -> openai.OpenAI:
    http = httpx.Client(event_hooks={"response": [log.hook]}, timeout=30)
    return openai.OpenAI(
        api_key=stack.key, base_url=stack.base_url + "/v1", max_retries=8, http_client=http
    )


def _phase(stack: CrashStack, name: str) -> str | None:
    try:
        status = stack.get_json("batch", name, "-n", stack.tenant).get("status") or {}
    except Exception:  # the API server may be the victim
        return None
    return status.get("status")


def _kill_when_due(stack: CrashStack, kill: Kill, uid: str, name: str) -> None:
    """Wait for the kill's moment, then kill its victim (waiting a little for one to exist)."""
    time.sleep(kill.at)
    deadline = time.monotonic() + VICTIM_WAIT
    while True:
        running = _phase(stack, name) not in TERMINAL
        kill.pids = stack.kill(kill.victim, uid)
        kill.batch_running = running
        if kill.pids or not running or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _wait_healthy(stack: CrashStack) -> list[str]:
    deadline = time.monotonic() + HEAL_TIMEOUT
    while True:
        problems = stack.healthy()
        if not problems or time.monotonic() > deadline:
            return [f"not restarted within {HEAL_TIMEOUT:g}s: {p}" for p in problems]
        time.sleep(0.5)


def run_iteration(stack: CrashStack, rng: random.Random) -> Outcome:
    """One batch, one victim SIGKILLed while it runs; the violations found."""
    began = time.monotonic()
    log = ClientLog()
    client = _client(stack, log)
    data, ids = _input(rng)
    victims = [v for v in stack.victims if not ONLY_VICTIMS or v in ONLY_VICTIMS]
    kill = Kill(rng.choice(victims), rng.uniform(*KILL_WINDOW))
    upload = _with_retries(
        lambda: client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    )
    batch = _with_retries(
        lambda: client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    )
    name = batch.id.replace("batch_", "batch-", 1)
    uid = str(stack.get_json("batch", name, "-n", stack.tenant)["metadata"]["uid"])
    killer = threading.Thread(target=_kill_when_due, args=(stack, kill, uid, name), daemon=True)
    killer.start()
    deadline = time.monotonic() + BATCH_TIMEOUT
    while True:
        current = _with_retries(lambda: client.batches.retrieve(batch.id), seconds=180)
        if current.status in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1)
    killer.join(timeout=KILL_WINDOW[1] + VICTIM_WAIT + 30)
    found = _wait_healthy(stack)
    output = _download(client, current.output_file_id)
    errors = _download(client, current.error_file_id)
    status = stack.get_json("batch", name, "-n", stack.tenant).get("status") or {}
    found += check_batch(input_ids=ids, status=status, output=output, errors=errors)
    found += [f"client saw {bad}" for bad in log.bad]
    found += [f"left behind: {left}" for left in _leftovers(stack, uid)]
    return Outcome(kill, found, time.monotonic() - began)


def sweep_iteration(stack: CrashStack, figures: SweepFigures, iteration: int, test: str) -> None:
    """Run iteration ``iteration`` of the seeded sweep (pytest node id ``test``), print its
    line, fail with the line that replays it."""
    rng = random.Random(f"{SEED}/{stack.name}/{iteration}")
    outcome = run_iteration(stack, rng)
    figures.add(outcome)
    kill = outcome.kill
    print(
        f"crash-sweep stack={stack.name} seed={SEED} iteration={iteration} victim={kill.victim} "
        f"at={kill.at:.1f}s pids={kill.pids} batch_running={kill.batch_running} "
        f"seconds={outcome.seconds:.1f} violations={len(outcome.violations)}"
    )
    assert not outcome.violations, (
        f"replay: LLMBATCH_CRASH_SEED={SEED} LLMBATCH_CRASH_ITERATIONS={iteration + 1} "
        f"pytest '{test}' (victim {kill.victim} at {kill.at:.1f}s):\n"
        + "\n".join(outcome.violations)
        + f"\n{stack.explain()}"
    )
