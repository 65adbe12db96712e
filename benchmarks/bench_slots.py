#!/usr/bin/env python3
"""Warm slots against the cold mode, side by side from one run, on the local control plane.

Each mode gets a fresh local cluster, an operator and a one-slot pool; then:

1. **stream** — ``--batches`` batches of ``--requests`` requests arrive spread over
   ``--over`` seconds. Reported: engine starts (slot pods started), wall time from the first
   submission until every batch completed, and the slot busy fraction = time with at least one
   request in the engine ÷ slot lifetime (from the slots' heartbeats: start of the process to its
   last heartbeat, engine load included), taken when the last batch of the stream completed.
2. **first result** — once the stream is done (the warm slot is idle with its model loaded; the
   cold mode has no slot left), a 2-request batch: create → first output line committed.

Warm mode is the pool's defaults (``idleSeconds: 300``, ``slotConcurrency`` from max_num_seqs);
the cold mode is the degenerate case of the same code, ``idleSeconds: 0`` and
``slotConcurrency: 1`` (a slot per shard, as before warm slots).

    .venv/bin/python benchmarks/bench_slots.py                      # real SmolLM2 on CPU vLLM
    .venv/bin/python benchmarks/bench_slots.py --engine simulated   # control plane only

Run it on an idle machine: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from bench_operator import kubectl  # type: ignore[import-not-found]  # (run as a script)
from llmbatch.api.slot import SlotHeartbeat
from llmbatch.commands.devstack import demo_pool
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.devcluster.controlplane import repo_root
from llmbatch.executor.models import MODELS, cache_dir

POOL = "bench-slots"
NAMESPACE = "bench"


@dataclass
class SlotLife:
    """One slot as its heartbeats showed it."""

    started_at: float
    busy: float = 0.0
    last_seen: float = 0.0


@dataclass
class Run:
    """What one mode measured."""

    mode: str
    slots: dict[str, SlotLife] = field(default_factory=dict)
    slot_jobs: set[str] = field(default_factory=set)
    pod_starts: set[str] = field(default_factory=set)
    stream_seconds: float = 0.0
    completed: int = 0
    first_result: float | None = None
    stream_busy: float = 0.0
    """The busy fraction when the stream's last batch completed."""

    @property
    def busy_fraction(self) -> float:
        life = sum(max(0.0, s.last_seen - s.started_at) for s in self.slots.values())
        return sum(s.busy for s in self.slots.values()) / life if life else 0.0


def pool_manifest(engine: str, mode: str) -> dict[str, Any]:
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
            "engineArgs": ["--latency-seconds=0.2", "--max-num-seqs=64"],
            "flushSeconds": 1,
        }
    pool["metadata"]["name"] = POOL
    pool["spec"]["maxSlots"] = 1
    pool["spec"]["throughputPerSlot"] = "100"
    if mode == "cold":
        pool["spec"]["idleSeconds"] = 0
        pool["spec"]["slotConcurrency"] = 1
    return pool


def batch_manifest(name: str, requests: int) -> dict[str, Any]:
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
        "spec": {"endpoint": "/v1/chat/completions", "requests": rows},
    }


def observe(kc: pathlib.Path, store: pathlib.Path, run: Run) -> dict[str, dict[str, Any]]:
    """Record slot Jobs, slot pods and heartbeats; the batches' statuses by name."""
    jobs = json.loads(kubectl(kc, "get", "jobs", "-n", "llmbatch-workers", "-o", "json"))
    run.slot_jobs |= {j["metadata"]["name"] for j in jobs["items"]}
    pods = json.loads(kubectl(kc, "get", "pods", "-n", "llmbatch-workers", "-o", "json"))
    run.pod_starts |= {p["metadata"]["uid"] for p in pods["items"]}
    now = time.time()
    for path in (store / "slots" / POOL).glob("*/heartbeat.json"):
        try:
            beat = SlotHeartbeat.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        life = run.slots.setdefault(beat.slot, SlotLife(started_at=beat.started_at))
        life.busy = max(life.busy, beat.busy_seconds)
        life.last_seen = min(now, path.stat().st_mtime) if beat.state == "exited" else now
    batches = json.loads(kubectl(kc, "get", "batches", "-n", NAMESPACE, "-o", "json"))
    return {b["metadata"]["name"]: b.get("status") or {} for b in batches["items"]}


def run_mode(engine: str, mode: str, args: argparse.Namespace) -> Run:
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench-slots-{mode}-"))
    store = work / "store"
    cluster = DevCluster.start(
        ClusterConfig(state_dir=work / "cluster", nodes=gpu_nodes(1, gpus=1)), detach=False
    )
    operator: subprocess.Popen[bytes] | None = None
    run = Run(mode)
    try:
        kc = cluster.kubeconfig
        kubectl(kc, "apply", "-f", str(repo_root() / "crds"))
        kubectl(kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
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
        objects.append(pool_manifest(engine, mode))
        kubectl(kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))
        env = {
            **os.environ,
            "KUBECONFIG": str(kc),
            "LLMBATCH_STORE_URI": f"file://{store}",
            "LLMBATCH_METRICS_PORT": "0",
            "LLMBATCH_RECONCILE_INTERVAL": "1",
            "LLMBATCH_PROGRESS_INTERVAL": "1",
            "LLMBATCH_SLOT_HEARTBEAT_SECONDS": "1",
        }
        operator = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", "operator", "--liveness-port", "0"],
            env=env,
            stdout=(work / "operator.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(3)
        names = [f"batch-stream{i:05d}" for i in range(args.batches)]
        gap = args.over / max(1, args.batches - 1)
        started = time.time()
        submitted = 0
        deadline = started + args.timeout
        statuses: dict[str, dict[str, Any]] = {}
        while time.time() < deadline:
            while submitted < len(names) and time.time() >= started + submitted * gap:
                manifest = batch_manifest(names[submitted], args.requests)
                kubectl(kc, "create", "-f", "-", stdin=json.dumps(manifest))
                submitted += 1
            statuses = observe(kc, store, run)
            run.completed = sum(
                1 for n in names if statuses.get(n, {}).get("status") == "completed"
            )
            if run.completed == len(names):
                break
            time.sleep(1)
        run.stream_seconds = time.time() - started
        run.stream_busy = run.busy_fraction
        time.sleep(3)  # the warm slot sits idle with its model loaded
        created = time.time()
        kubectl(kc, "create", "-f", "-", stdin=json.dumps(batch_manifest("batch-first00000", 2)))
        while time.time() < deadline:
            status = observe(kc, store, run).get("batch-first00000", {})
            if (status.get("requestCounts") or {}).get("completed", 0) >= 1:
                run.first_result = time.time() - created
                break
            time.sleep(0.25)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        cluster.stop()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "simulated"], default="vllm")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--over", type=float, default=60.0, help="seconds the arrivals span")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per mode")
    parser.add_argument("--modes", default="warm,cold")
    args = parser.parse_args()
    runs = [run_mode(args.engine, mode, args) for mode in args.modes.split(",")]
    print(
        f"{args.batches} batches x {args.requests} requests over {args.over:g} s, one slot, "
        f"{args.engine} engine"
    )
    print(f"{'':28}" + "".join(f"{r.mode:>14}" for r in runs))
    rows = [
        ("batches completed", [f"{r.completed}/{args.batches}" for r in runs]),
        ("engine starts (slot pods)", [str(len(r.pod_starts)) for r in runs]),
        ("slot Jobs", [str(len(r.slot_jobs)) for r in runs]),
        ("wall time, stream (s)", [f"{r.stream_seconds:.0f}" for r in runs]),
        ("slot busy fraction, stream", [f"{r.stream_busy:.2f}" for r in runs]),
        (
            "create -> first result (s)",
            [f"{r.first_result:.1f}" if r.first_result is not None else "-" for r in runs],
        ),
    ]
    for label, values in rows:
        print(f"{label:28}" + "".join(f"{v:>14}" for v in values))
    if len(runs) == 2 and runs[1].stream_seconds:
        print(f"wall time warm / cold: {runs[0].stream_seconds / runs[1].stream_seconds:.2f}")


if __name__ == "__main__":
    main()
