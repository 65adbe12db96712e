#!/usr/bin/env python3
"""Warm slots against the cold mode, side by side from one run, on the local control plane.

Each mode gets a fresh local cluster, an operator and a one-slot pool; then:

1. **stream** — ``--batches`` batches of ``--requests`` requests arrive spread over
   ``--over`` seconds. Reported: engine starts (slot pods started), wall time from the first
   submission until every batch completed, and the slot busy fraction = time with at least one
   request in the engine ÷ slot lifetime (from the slots' heartbeats: start of the process to its
   last heartbeat, engine load included), taken when the last batch of the stream completed;
   beside it, the most one slot could be busy for these arrivals (``Run.arrival_bound``: a
   stream that offers its engine less work than its time cannot keep it busier).
2. **first result** — once the stream is done (the warm slot is idle with its model loaded; the
   cold mode has no slot left), ``--first-samples`` 2-request batches one after another:
   create → first output line committed, median.
3. **expedited** — a ``--expedited``-request expedited batch alone, then the same while a
   ``--big``-request standard batch runs on the only slot: create → completed of the expedited
   batch, busy over alone; the standard batch must still complete every request.

Warm mode is the pool's defaults (``idleSeconds: 300``, ``slotConcurrency`` from max_num_seqs);
the cold mode is the degenerate case of the same code, ``idleSeconds: 0``,
``slotConcurrency: 1`` and ``slotQueue: 0`` (a slot per shard, as before warm slots).

    .venv/bin/python benchmarks/bench_slots.py                      # real SmolLM2 on CPU vLLM
    .venv/bin/python benchmarks/bench_slots.py --engine simulated   # control plane only

With the simulated engine ``--max-running`` sets how many requests its engine answers at once
(the rest queue in priority order, as vLLM's scheduler does).

Run it on an idle machine: it measures wall time. Before each mode it imports vLLM and reads
the model once, untimed, so that both modes load engines from a warm page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from bench_operator import kubectl  # type: ignore[import-not-found]  # (run as a script)
from llmbatch.api.slot import SlotHeartbeat
from llmbatch.commands.devstack import CPU_ENGINE_ENV, demo_pool
from llmbatch.core import keys
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.devcluster.controlplane import repo_root
from llmbatch.executor.models import MODELS, cache_dir

POOL = "bench-slots"
TERMINAL = ("completed", "failed", "expired", "cancelled")
NAMESPACE = "bench"


@dataclass
class SlotLife:
    """One slot as its heartbeats showed it."""

    started_at: float
    busy: float = 0.0
    seq: int = 0
    """The last heartbeat's ``seq``: its wall-clock milliseconds, the clock of ``started_at``."""

    @property
    def last_seen(self) -> float:
        return self.seq / 1000


@dataclass
class Run:
    """What one mode measured."""

    mode: str
    slots: dict[str, SlotLife] = field(default_factory=dict)
    slot_jobs: set[str] = field(default_factory=set)
    pod_starts: set[str] = field(default_factory=set)
    stream_seconds: float = 0.0
    completed: int = 0
    first_results: list[float] = field(default_factory=list)
    stream_busy: float = 0.0
    """The busy fraction when the stream's last batch completed."""
    stream_bound: float | None = None
    """The most a single slot could be busy given the stream's arrivals (:meth:`arrival_bound`)."""
    last_arrival: float = 0.0
    """When the stream's last batch was created (wall clock)."""
    expedited_alone: float | None = None
    expedited_busy: float | None = None
    expedited_ok: bool = False
    big_completed: int = 0

    @property
    def busy_fraction(self) -> float:
        life = sum(max(0.0, s.last_seen - s.started_at) for s in self.slots.values())
        return sum(s.busy for s in self.slots.values()) / life if life else 0.0

    def arrival_bound(self, batches: int) -> float | None:
        """The busy fraction a single slot could at most reach on the stream, had its engine
        loaded in no time and no request ever waited: its busy time over a life from its start
        to the last arrival plus one batch's engine time (busy time / batches). It assumes the
        engine takes as long per batch whichever run beside it (a compute-bound CPU engine: the
        batches of one stream take 2.4-2.5 s each alone and four at once alike). None with
        more than one slot (the cold mode)."""
        if len(self.slots) != 1 or not batches:
            return None
        (slot,) = self.slots.values()
        least_life = self.last_arrival - slot.started_at + slot.busy / batches
        return slot.busy / least_life if least_life > 0 else None


def pool_manifest(engine: str, mode: str, max_running: int) -> dict[str, Any]:
    if engine == "vllm":
        model = MODELS["smollm2"]
        if not model.is_prepared():
            raise SystemExit("SmolLM2 is not prepared: run `make models` first")
        pool = demo_pool(str(model.folder()), str(cache_dir()))
    else:
        pool = demo_pool("simulated", str(cache_dir()))
        pool["spec"]["models"] = [{"name": "smollm2", "source": "simulated"}]
        pool["spec"]["executor"] = {
            "engine": "simulated",
            "engineArgs": [
                "--latency-seconds=0.2",
                "--max-num-seqs=64",
                f"--max-running={max_running}",
            ],
            "flushSeconds": 1,
        }
    pool["metadata"]["name"] = POOL
    pool["spec"]["maxSlots"] = 1
    pool["spec"]["throughputPerSlot"] = "100"
    if mode == "cold":
        pool["spec"]["idleSeconds"] = 0
        pool["spec"]["slotConcurrency"] = 1
        pool["spec"]["slotQueue"] = 0
    return pool


def batch_manifest(name: str, requests: int, priority: str = "standard") -> dict[str, Any]:
    rows = [
        {
            "customID": f"r{j}",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2",
                "messages": [{"role": "user", "content": f"Say one word about the number {j}."}],
                "max_tokens": 16,
            },
        }
        for j in range(requests)
    ]
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"endpoint": "/v1/chat/completions", "requests": rows, "priority": priority},
    }


class Stack:
    """A fresh local cluster, an operator and the one-slot pool of one mode."""

    def __init__(self, engine: str, mode: str, args: argparse.Namespace) -> None:
        self.work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench-slots-{mode}-"))
        self.store = self.work / "store"
        self.run = Run(mode)
        self.deadline = time.time() + args.timeout
        self.cluster = DevCluster.start(
            ClusterConfig(state_dir=self.work / "cluster", nodes=gpu_nodes(1, gpus=1)),
            detach=False,
        )
        self.kc = self.cluster.kubeconfig
        self.operator: subprocess.Popen[bytes] | None = None
        kubectl(self.kc, "apply", "-R", "-f", str(repo_root() / "crds"))  # with crds/admission
        kubectl(self.kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
            for n in ("llmbatch-workers", NAMESPACE)
        ]
        objects.append(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "ClusterKopfPeering",
                "metadata": {"name": "llmbatch"},
            }
        )
        objects.append(pool_manifest(engine, mode, args.max_running))
        kubectl(self.kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kc),
            "LLMBATCH_STORE_URI": f"file://{self.store}",
            "LLMBATCH_METRICS_PORT": "0",
            # first results are read from the chunks: keep finished batches' work areas
            "LLMBATCH_RETENTION_INTERVAL": "86400",
            "LLMBATCH_RECONCILE_INTERVAL": "1",
            "LLMBATCH_PROGRESS_INTERVAL": "1",
            "LLMBATCH_SLOT_HEARTBEAT_SECONDS": "1",
        }
        self.operator = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", "operator", "--liveness-port", "0"],
            env=env,
            stdout=(self.work / "operator.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(3)

    def close(self) -> None:
        if self.operator is not None:
            self.operator.terminate()
            self.operator.wait(timeout=30)
        self.cluster.stop()

    def create(self, name: str, requests: int, priority: str = "standard") -> float:
        kubectl(
            self.kc, "create", "-f", "-", stdin=json.dumps(batch_manifest(name, requests, priority))
        )
        return time.time()

    def observe(self) -> dict[str, dict[str, Any]]:
        """Record slot Jobs, slot pods and heartbeats; the batches by name.

        Two kubectl calls a poll and a once-a-second poll: the benchmark must not take the CPU
        the engine is measured on.
        """
        run = self.run
        workers = json.loads(
            kubectl(self.kc, "get", "jobs,pods", "-n", "llmbatch-workers", "-o", "json")
        )
        for item in workers["items"]:
            if item["kind"] == "Job":
                run.slot_jobs.add(item["metadata"]["name"])
            else:
                run.pod_starts.add(item["metadata"]["uid"])
        for path in (self.store / "slots" / POOL).glob("*/heartbeat.json"):
            try:
                beat = SlotHeartbeat.model_validate_json(path.read_bytes())
            except (OSError, ValueError):
                continue
            life = run.slots.setdefault(beat.slot, SlotLife(started_at=beat.started_at))
            if beat.seq > life.seq:
                # busy time and lifetime as of one instant, the heartbeat's own write (``seq``
                # is its wall-clock milliseconds, the clock of ``started_at``): timed to now,
                # the lifetime would gain up to a heartbeat interval the busy time cannot show.
                life.seq = beat.seq
                life.busy = beat.busy_seconds
        batches = json.loads(kubectl(self.kc, "get", "batches", "-n", NAMESPACE, "-o", "json"))
        return {b["metadata"]["name"]: b for b in batches["items"]}

    def wait(self, name: str) -> dict[str, Any]:
        """The batch once it is terminal."""
        while time.time() < self.deadline:
            batch = self.observe().get(name, {})
            if (batch.get("status") or {}).get("status") in TERMINAL:
                return batch
            time.sleep(1)
        raise SystemExit(f"{self.run.mode}: {name} did not finish before --timeout")

    def first_commit(self, batch: dict[str, Any]) -> float:
        """When the batch's first result chunk was committed (its file's mtime in the store)."""
        work = self.store / keys.work_prefix(NAMESPACE, batch["metadata"]["uid"])
        return min(p.stat().st_mtime for p in work.glob("shards/*/output-*"))

    @staticmethod
    def run_seconds(batch: dict[str, Any]) -> float:
        """created_at -> completed_at of a batch (the operator's clock, whole seconds)."""
        status = batch["status"]
        return float(status["completedAt"] - status["createdAt"])

    def stream(self, args: argparse.Namespace) -> None:
        """Phase 1: batches arriving spread over ``--over`` seconds, until all completed."""
        run = self.run
        names = [f"batch-stream{i:05d}" for i in range(args.batches)]
        gap = args.over / max(1, args.batches - 1)
        started = time.time()
        submitted = 0
        while time.time() < self.deadline:
            while submitted < len(names) and time.time() >= started + submitted * gap:
                run.last_arrival = self.create(names[submitted], args.requests)
                submitted += 1
            batches = self.observe()
            run.completed = sum(
                1
                for n in names
                if (batches.get(n, {}).get("status") or {}).get("status") == "completed"
            )
            if run.completed == len(names):
                break
            time.sleep(1)
        run.stream_seconds = time.time() - started
        run.stream_busy = run.busy_fraction
        run.stream_bound = run.arrival_bound(args.batches)

    def first_results(self, samples: int) -> None:
        """Phase 2: create -> first committed result of 2-request batches, one after another."""
        for i in range(samples):
            time.sleep(3)  # the warm slot sits idle with its model loaded
            name = f"batch-first{i:05d}"
            created = self.create(name, 2)
            batch = self.wait(name)
            self.run.first_results.append(self.first_commit(batch) - created)

    def expedited(self, args: argparse.Namespace) -> None:
        """Phase 3: an expedited batch alone, then while a big standard batch runs."""
        run = self.run
        self.create("batch-expalone", args.expedited, "expedited")
        run.expedited_alone = self.run_seconds(self.wait("batch-expalone"))
        self.create("batch-big00000", args.big)
        while time.time() < self.deadline:  # until the big batch runs on the slot
            big = self.observe().get("batch-big00000", {})
            if ((big.get("status") or {}).get("requestCounts") or {}).get("completed", 0):
                break
            time.sleep(1)
        self.create("batch-expbusy", args.expedited, "expedited")
        busy = self.wait("batch-expbusy")
        run.expedited_busy = self.run_seconds(busy)
        run.expedited_ok = busy["status"]["requestCounts"]["completed"] == args.expedited
        big = self.wait("batch-big00000")
        run.big_completed = big["status"]["requestCounts"]["completed"]


def warm_page_cache(engine: str) -> None:
    """Import vLLM and read the model once, untimed, before a mode starts: both modes then load
    engines from the page cache. A VM that reclaims idle page cache (DAMON) otherwise makes the
    first engine start read torch and vLLM from disk: 61 s instead of ~25 s, counted against
    whichever mode comes first."""
    if engine != "vllm":
        return
    started = time.time()
    subprocess.run(
        [sys.executable, "-c", "import vllm"],
        env={**os.environ, **CPU_ENGINE_ENV},
        check=True,
        capture_output=True,
    )
    for path in MODELS["smollm2"].folder().rglob("*"):
        if path.is_file():
            path.read_bytes()
    print(f"page cache warmed in {time.time() - started:.0f} s", flush=True)


def run_mode(engine: str, mode: str, args: argparse.Namespace) -> Run:
    warm_page_cache(engine)
    stack = Stack(engine, mode, args)
    try:
        stack.stream(args)
        stack.first_results(args.first_samples)
        if args.expedited:
            stack.expedited(args)
    finally:
        stack.close()
    return stack.run


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def report(runs: list[Run], args: argparse.Namespace) -> None:
    print(
        f"{args.batches} batches x {args.requests} requests over {args.over:g} s, one slot, "
        f"{args.engine} engine"
    )
    print(f"{'':40}" + "".join(f"{r.mode:>14}" for r in runs))
    rows = [
        ("batches completed", [f"{r.completed}/{args.batches}" for r in runs]),
        ("engine starts (slot pods)", [str(len(r.pod_starts)) for r in runs]),
        ("slot Jobs", [str(len(r.slot_jobs)) for r in runs]),
        ("wall time, stream (s)", [f"{r.stream_seconds:.0f}" for r in runs]),
        ("slot busy fraction, stream", [f"{r.stream_busy:.2f}" for r in runs]),
        (
            "  ... at most, for these arrivals",
            [f"{r.stream_bound:.2f}" if r.stream_bound else "-" for r in runs],
        ),
        (
            f"create -> first result, median of {args.first_samples} (s)",
            [
                _seconds(statistics.median(r.first_results) if r.first_results else None)
                for r in runs
            ],
        ),
    ]
    if args.expedited:
        rows += [
            (f"expedited {args.expedited} alone (s)", [_seconds(r.expedited_alone) for r in runs]),
            (f"  ... beside {args.big} standard (s)", [_seconds(r.expedited_busy) for r in runs]),
            (
                "  busy / alone",
                [
                    f"{r.expedited_busy / r.expedited_alone:.2f}"
                    if r.expedited_busy and r.expedited_alone
                    else "-"
                    for r in runs
                ],
            ),
            (
                "  standard batch completed",
                [f"{r.big_completed}/{args.big}" for r in runs],
            ),
        ]
    for label, values in rows:
        print(f"{label:40}" + "".join(f"{v:>14}" for v in values))
    if len(runs) == 2 and runs[1].stream_seconds:
        print(f"wall time warm / cold: {runs[0].stream_seconds / runs[1].stream_seconds:.2f}")
    for r in runs:
        print(f"{r.mode}: first results {[round(v, 1) for v in r.first_results]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "simulated"], default="vllm")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--over", type=float, default=60.0, help="seconds the arrivals span")
    parser.add_argument("--first-samples", type=int, default=5)
    parser.add_argument("--expedited", type=int, default=20, help="0: skip phase 3")
    parser.add_argument("--big", type=int, default=400)
    parser.add_argument("--max-running", type=int, default=64, help="simulated engine only")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per mode")
    parser.add_argument("--modes", default="warm,cold")
    args = parser.parse_args()
    runs = [run_mode(args.engine, mode, args) for mode in args.modes.split(",")]
    report(runs, args)


if __name__ == "__main__":
    main()
