#!/usr/bin/env python3
"""Fair shares across tenants on the local control plane (#33), with the simulated engine.

(a) One slot of two seats: tenant A queues ``--backlog`` batches (default 40), then tenant B
    creates one. Reports how many of A's shards were granted between B's create and B's grant,
    and B's wait (target: at most 2; the per-batch round-robin granted 34).
(b) One slot of ``--seats`` seats (default 4, no slot queue): tenants X, Y, Z with weights
    1 : 1 : 2 (namespace annotations) keep continuous backlogs for ``--minutes`` (default 10).
    Reports each tenant's share of the seat-seconds against its weight (target: within ±10 %).
    Seat-seconds are sampled from the store: every 0.5 s, the shards whose lease is granted.

With ``--reference DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/ref
7cbda50~1`` for the per-batch round-robin) the same runs go through that tree's operator on a
fresh cluster, printed beside ours. Reuses bench_backlog's harness (cluster, operator process,
batch bodies, lease reading).

    .venv/bin/python benchmarks/bench_fairness.py [--minutes 10] [--backlog 40]
        [--part a|b|both] [--reference /tmp/ref]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import tempfile
import time
from collections import Counter
from typing import Any

from bench_backlog import (  # type: ignore[import-not-found]  # (run as a script)
    Operator,
    batch,
    create_all,
    grant_time,
    uid_of,
    wait_warm,
)
from bench_operator import kubectl  # type: ignore[import-not-found]
from llmbatch.api.slot import ShardLease
from llmbatch.core.scheduling import WEIGHT_ANNOTATION
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.devcluster.controlplane import repo_root

MODEL = "sim-model"
POOL = "fair"
WEIGHTS = {"fx": 1.0, "fy": 1.0, "fz": 2.0}


def setup(kc: pathlib.Path, repo: pathlib.Path, seats: int, queue: int | None) -> None:
    """CRDs, tenant namespaces (weights annotated) and a pool of one warm slot."""
    kubectl(kc, "apply", "-R", "-f", str(repo_root() / "crds"))  # with crds/admission
    kubectl(kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in ("llmbatch-workers", "fa", "fb")
    ]
    objects += [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": n, "annotations": {WEIGHT_ANNOTATION: f"{w:g}"}},
        }
        for n, w in WEIGHTS.items()
    ]
    objects.append(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "llmbatch"},
        }
    )
    pool: dict[str, Any] = {
        "models": [{"name": MODEL, "source": "simulated"}],
        "workerNamespace": "llmbatch-workers",
        "maxSlots": 1,
        "minSlots": 1,
        "slotConcurrency": seats,
        "shardRequests": 1000,
        "throughputPerSlot": "1",
        "executor": {
            "engine": "simulated",
            "engineArgs": ["--latency-seconds=1.5"],
            "flushSeconds": 1,
            "terminationGraceSeconds": 2,
            "env": [{"name": "PYTHONPATH", "value": str(repo / "operator")}],
        },
    }
    if queue is not None:
        pool["slotQueue"] = queue
    objects.append(
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "BatchPool",
            "metadata": {"name": POOL},
            "spec": pool,
        }
    )
    kubectl(kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))


def leases(store: pathlib.Path, namespace: str) -> list[ShardLease]:
    found = []
    for path in (store / "work" / namespace).glob("*/shards/*/lease.json"):
        try:
            found.append(ShardLease.model_validate_json(path.read_bytes()))
        except (OSError, ValueError):
            continue  # being written
    return found


def part_a(kc: pathlib.Path, store: pathlib.Path, backlog: int) -> dict[str, float]:
    """A's backlog, then B's one batch: A's grants between B's create and B's grant."""
    names = [f"batch-a{i:04d}" for i in range(backlog)]
    asyncio.run(create_all(kc, [batch(n, "fa", 10) for n in names]))
    deadline = time.time() + 300
    while sum(1 for lease in leases(store, "fa") if lease.granted_at) < 4:
        if time.time() > deadline:
            raise SystemExit("A's first shards were not granted in 300 s")
        time.sleep(0.5)
    sent = asyncio.run(create_all(kc, [batch("batch-b0000", "fb", 10)]))["batch-b0000"]
    uid, granted = "", None
    while granted is None and time.time() < sent + 600:
        uid = uid or uid_of(kc, "fb", "batch-b0000")
        granted = grant_time(store, "fb", uid, ended=True) if uid else None
        time.sleep(0.2)
    if granted is None:
        raise SystemExit("B's batch was not granted in 600 s")
    between = sum(1 for lease in leases(store, "fa") if sent < lease.granted_at < granted)
    return {"a_between": float(between), "b_wait_s": granted - sent}


def part_b(kc: pathlib.Path, store: pathlib.Path, minutes: float) -> dict[str, float]:
    """Continuous backlogs of X, Y, Z for ``minutes``: each one's share of seat-seconds."""
    made: Counter[str] = Counter()

    def top_up() -> None:  # keep 8 batches of each tenant waiting or running
        bodies = []
        for tenant in WEIGHTS:
            unfinished = sum(1 for lease in leases(store, tenant) if lease.state != "done")
            for _ in range(max(0, 8 - unfinished)):
                bodies.append(batch(f"batch-{tenant}{made[tenant]:05d}", tenant, 10))
                made[tenant] += 1
        if bodies:
            asyncio.run(create_all(kc, bodies))

    top_up()
    time.sleep(20)  # the first grants
    seat_seconds: Counter[str] = Counter()
    end, last_top_up = time.time() + 60 * minutes, 0.0
    while time.time() < end:
        if time.time() - last_top_up > 5:
            top_up()
            last_top_up = time.time()
        for tenant in WEIGHTS:
            seat_seconds[tenant] += 0.5 * sum(
                1 for lease in leases(store, tenant) if lease.state == "granted"
            )
        time.sleep(0.5)
    total = sum(seat_seconds.values()) or 1.0
    return {f"{t}_share": seat_seconds[t] / total for t in WEIGHTS} | {"seat_s": total}


def run_side(name: str, repo: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    for part in ("a", "b"):
        if args.part not in (part, "both"):
            continue
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench-fairness-{name}-{part}-"))
        cluster = DevCluster.start(
            ClusterConfig(state_dir=work / "cluster", nodes=gpu_nodes(1, gpus=4)), detach=False
        )
        store = work / "store"
        operator = Operator(repo, cluster.kubeconfig, store, work / "operator.log")
        try:
            kc = cluster.kubeconfig
            setup(kc, repo, 2 if part == "a" else args.seats, None if part == "a" else 0)
            operator.start()
            wait_warm(store, pool=POOL)
            if part == "a":
                figures |= part_a(kc, store, args.backlog)
            else:
                figures |= part_b(kc, store, args.minutes)
            print(f"[{name}] part {part}: {figures}", flush=True)
        finally:
            operator.stop()
            cluster.stop()
    return figures


def report(sides: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    names = list(sides)
    print(f"\n{'metric':44}" + "".join(f"{n:>12}" for n in names) + "  target")
    rows: list[tuple[str, str, str, str]] = [
        (
            f"(a) A's shards before B's ({args.backlog} queued)",
            "a_between",
            "{:.0f}",
            "<= 2",
        ),
        ("(a) B's wait (s)", "b_wait_s", "{:.1f}", ""),
    ]
    weight_sum = sum(WEIGHTS.values())
    for tenant, weight in WEIGHTS.items():
        rows.append(
            (
                f"(b) {tenant} share of seat-seconds (weight {weight:g})",
                f"{tenant}_share",
                "{:.1%}",
                f"{weight / weight_sum:.0%} ±10 %",
            )
        )
    rows.append(("(b) seat-seconds sampled", "seat_s", "{:.0f}", f"({args.minutes:g} min)"))
    for label, key, fmt, target in rows:
        cells = "".join(
            f"{fmt.format(sides[n][key]) if key in sides[n] else '-':>12}" for n in names
        )
        print(f"{label:44}{cells}  {target}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--backlog", type=int, default=40)
    parser.add_argument("--seats", type=int, default=4)
    parser.add_argument("--part", choices=["a", "b", "both"], default="both")
    parser.add_argument("--reference", type=pathlib.Path)
    args = parser.parse_args()
    sides = {"this tree": run_side("this", repo_root(), args)}
    if args.reference:
        sides["reference"] = run_side("reference", args.reference.resolve(), args)
    report(sides, args)


if __name__ == "__main__":
    main()
