#!/usr/bin/env python3
"""A batch step's status write on the local control plane: the PUT of the status the step's
patch makes (``kube.status_replacement``, what the operator sends) against the JSON merge patch
of the status subresource it sent before, from one run.

Creates ``--batches`` Batches (200; a stored input, the status of a running batch as the
operator writes it: phase, counts, one shard, billing, conditions), then ``--rounds`` rounds
(default 6); each round writes one progress change to every Batch both ways, in alternating
order (patch first, then PUT; then PUT first), ``--concurrency`` writes in flight (16, the
operator's reconcile workers). Each write carries the ``resourceVersion`` it was decided on, as
the operator's do. Prints, per write, the control plane's CPU (the ``testcluster`` process: API
server, etcd, controllers; from ``/proc``), the client's (this process: building, sending and
parsing, as the operator would) and the wall time of the round, median [range] of the rounds,
side by side.

    .venv/bin/python benchmarks/bench_status_write.py [--batches 200] [--rounds 6]
        [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench_operator import cpu_by_part, cpu_seconds, kubectl  # type: ignore[import-not-found]
from llmbatch.api.resources import API_VERSION, GROUP, VERSION
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.devcluster.controlplane import repo_root
from llmbatch.kube import KubeClient, status_replacement

NAMESPACE = "bench"

Write = Callable[[KubeClient, dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any] | None]]


def manifest(i: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Batch",
        "metadata": {
            "name": f"batch-status{i:05d}",
            "namespace": NAMESPACE,
            "labels": {"llmbatch.io/pool": "bench", "llmbatch.io/tier": "standard"},
            "finalizers": ["llmbatch.io/batch"],
        },
        "spec": {
            "endpoint": "/v1/chat/completions",
            "inputFileID": f"file-{i:024d}",
            "completionWindow": "24h",
            "pool": "bench",
            "metadata": {"job": "bench", "owner": f"team-{i % 7}"},
        },
    }


def running_status(i: int) -> dict[str, Any]:
    """A running batch's status as the operator writes it (one shard on a slot)."""
    now = int(time.time())
    return {
        "status": "in_progress",
        "model": "sim-model",
        "pool": "bench",
        "workerNamespace": "llmbatch-workers",
        "gpusPerSlot": 1,
        "requestCounts": {"total": 10, "completed": 0, "failed": 0},
        "inputKey": f"files/{NAMESPACE}/file-{i:024d}",
        "inputBytes": 2480,
        "createdAt": now,
        "inProgressAt": now,
        "expiresAt": now + 86400,
        "shards": [
            {
                "index": 0,
                "start": 0,
                "end": 2480,
                "firstLine": 1,
                "lineCount": 10,
                "requestCount": 10,
                "phase": "Running",
                "job": "slot-bench-3",
            }
        ],
        "billing": {"mode": "Tokens", "estimatedTokens": 5120, "reserved": "0.0512"},
        "conditions": [
            {
                "type": "Validated",
                "status": "True",
                "reason": "InputValid",
                "message": "10 requests in 1 shard",
                "lastTransitionTime": "2026-12-07T00:00:00Z",
            }
        ],
        "observedGeneration": 1,
    }


def progress(body: dict[str, Any], step: int) -> dict[str, Any]:
    """One fold of progress: the step's patch."""
    done = min(10, step)
    return {
        "requestCounts": {"completed": done},
        "shards": [{**body["status"]["shards"][0], "completed": done, "runSeconds": step}],
    }


async def by_patch(api: KubeClient, body: dict[str, Any], patch: dict[str, Any]) -> Any:
    """The write the operator sent before: a merge patch of the status subresource with the
    version it was decided on as precondition (``metadata.resourceVersion`` in the patch)."""
    meta = body["metadata"]
    return await api.call_json(
        api.custom.patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        meta["namespace"],
        "batches",
        meta["name"],
        {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch},
        _content_type="application/merge-patch+json",
        retry_5xx=False,
    )


async def by_put(api: KubeClient, body: dict[str, Any], patch: dict[str, Any]) -> Any:
    """What the operator sends now: the status that patch makes, PUT on that version."""
    meta = body["metadata"]
    replacement = status_replacement(body, patch, api_version=API_VERSION, kind="Batch")
    return await api.replace_custom_status("batches", meta["namespace"], meta["name"], replacement)


async def write_all(
    api: KubeClient,
    bodies: dict[str, dict[str, Any]],
    write: Write,
    step: int,
    concurrency: int,
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with gate:
            body = bodies[name]
            written = await write(api, body, progress(body, step))
            assert written is not None, name
            bodies[name] = written

    await asyncio.gather(*(one(name) for name in list(bodies)))


async def run(kubeconfig: pathlib.Path, args: argparse.Namespace) -> dict[str, list[float]]:
    api = await KubeClient.connect(str(kubeconfig))
    figures: dict[str, list[float]] = {
        f"{way} {figure}": [] for way in ("patch", "put") for figure in ("cpu", "client", "wall")
    }
    try:
        sets: dict[str, dict[str, dict[str, Any]]] = {"patch": {}, "put": {}}
        for i in range(args.batches):
            for way, bodies in sets.items():
                body = manifest(i)
                body["metadata"]["name"] += f"-{way}"
                created = await api.create_custom("batches", NAMESPACE, body)
                name = body["metadata"]["name"]
                status = {**created, "status": running_status(i)}
                written = await api.replace_custom_status("batches", NAMESPACE, name, status)
                assert written is not None
                bodies[name] = written
        ways: dict[str, Write] = {"patch": by_patch, "put": by_put}
        for step in range(1, args.rounds + 1):
            order = ["patch", "put"] if step % 2 else ["put", "patch"]
            for way in order:
                await asyncio.sleep(0.5)  # the previous round's watch fan-out settles
                before = cpu_seconds(-1)
                started, client = time.perf_counter(), time.process_time()
                await write_all(api, sets[way], ways[way], step, args.concurrency)
                wall = time.perf_counter() - started
                client = time.process_time() - client
                spent = cpu_by_part(before, cpu_seconds(-1)).get("control plane", 0.0)
                figures[f"{way} cpu"].append(spent / args.batches * 1000)
                figures[f"{way} wall"].append(wall / args.batches * 1000)
                figures[f"{way} client"].append(client / args.batches * 1000)
        for way, bodies in sets.items():  # both ways wrote the same statuses
            sample = next(iter(bodies.values()))
            assert sample["status"]["requestCounts"]["completed"] == min(10, args.rounds), way
    finally:
        await api.close()
    return figures


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-status-"))
    cluster = DevCluster.start(
        ClusterConfig(state_dir=work / "cluster", nodes=gpu_nodes(1, gpus=1)), detach=False
    )
    try:
        kc = cluster.kubeconfig
        kubectl(kc, "apply", "-R", "-f", str(repo_root() / "crds"))
        kubectl(kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        kubectl(kc, "apply", "-f", "-", stdin=json.dumps(namespace))
        figures = asyncio.run(run(kc, args))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.batches} Batches per way, {args.rounds} rounds of one progress write each, "
        f"{args.concurrency} in flight; per write, median [range] of the rounds"
    )
    print(f"{'':28} {'PUT (ours)':>22} {'merge patch (before)':>24}")
    rows = {"control plane CPU, ms": "cpu", "client CPU, ms": "client", "wall, ms": "wall"}
    for label, figure in rows.items():
        put, patch = summary(figures[f"put {figure}"]), summary(figures[f"patch {figure}"])
        print(f"{label:28} {put:>22} {patch:>24}")


if __name__ == "__main__":
    main()
