#!/usr/bin/env python3
"""The operator under load on the local control plane, with the simulated engine.

Creates N Batches at once (default 200, 10 requests each, inline; 32 create requests in flight)
against one pool of 16 warm slots (``minSlots``: started and loaded before the batches come) and
reports, each batch timed from the moment its create request was sent: → its first shard granted
to a slot (the lease's ``grantedAt``) p50/p95, → first result (its first result chunk committed
in the store) p50/p95, → ``completed`` p50/p95; the slots started, the operator's peak RSS, and
API-server requests per batch (all clients, and the llmbatch.io resources alone), read from the
API server's own ``apiserver_request_total`` counter, and the CPU time the control plane, the
operator and the slots used from the first create until all completed (from ``/proc``: on a
small machine they share the cores, and the latencies are what that sharing leaves; the
requests are counted once every batch's ``Validated`` and ``Completed`` Events are posted, as
they trail the burst, and the CPU spent meanwhile is printed beside). The
operator runs with its production intervals (reconcile 2 s, progress fold 5 s, slot poll 0.5 s).

Before the burst, ``--warmup`` batches (default 1) run to completion in a namespace of their own,
as a long-running operator and cluster have done before any burst: the operator's first batch
imports the modules of each step, the API server's first create of a Batch fetches and parses
the group's OpenAPI schema for the finalizer policy (each of the first concurrent creates did,
~0.35 s of CPU in the profile), the slots open their first shard. ``--warmup 0`` measures a
fresh operator and cluster, as the figures before 2026-12-05 did.

    .venv/bin/python benchmarks/bench_operator.py [--batches 200] [--requests 10]
        [--slot-concurrency N]  # shards per slot; default: the pool default (unset)
        [--warmup N]  # batches run before the burst (default 1; 0: a fresh operator)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from llmbatch.api.slot import ShardLease
from llmbatch.core import keys
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes, kubectl_binary
from llmbatch.devcluster.controlplane import repo_root
from llmbatch.kube import KubeClient

MODEL = "sim-model"


def kubectl(kubeconfig: pathlib.Path, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(kubectl_binary()), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return result.stdout


def request_counts(kubeconfig: pathlib.Path) -> dict[str, float]:
    """API requests served so far by ``verb resource[/subresource]`` (every code)."""
    text = kubectl(kubeconfig, "get", "--raw", "/metrics")
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        kind = labels.get("resource", "?")
        if labels.get("subresource"):
            kind += "/" + labels["subresource"]
        if labels.get("group") == "llmbatch.io":
            kind += ".llmbatch.io"
        key = f"{labels.get('verb', '?')} {kind}"
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def event_reasons(kubeconfig: pathlib.Path) -> collections.Counter[str]:
    """The Events about the benchmark's Batches, by reason (each counted as often as it was
    posted, ``count`` included)."""
    events = json.loads(kubectl(kubeconfig, "get", "events", "-n", "bench", "-o", "json"))
    reasons: collections.Counter[str] = collections.Counter()
    for event in events["items"]:
        reasons[event.get("reason") or "?"] += int(event.get("count") or 1)
    return reasons


def events_settled(
    kubeconfig: pathlib.Path, batches: int, timeout: float = 60
) -> tuple[collections.Counter[str], float]:
    """The Events about the Batches once each has its ``Validated`` and ``Completed`` (the
    operator holds Events back while new batches wait to be accepted, so they trail the
    burst), and how long after the call that took. Counted from the API server, so that the
    requests per batch include their posts."""
    began = time.time()
    while True:
        reasons = event_reasons(kubeconfig)
        posted = min(reasons["Validated"], reasons["Completed"]) >= batches
        if posted or time.time() - began > timeout:
            return reasons, time.time() - began
        time.sleep(0.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def first_commits(
    kubeconfig: pathlib.Path, store: pathlib.Path
) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float]]:
    """Per batch, when it was accepted (``status.inProgressAt``: validated, its shards queued),
    when its first shard spec was written (the file's mtime: the same step, to the millisecond),
    when its first shard was granted to a slot (the lease's ``grantedAt``) and when its first
    result chunk was committed (the chunk file's mtime in the store): the first result as the
    store has it, without the status fold's delay or polling."""
    batches = json.loads(kubectl(kubeconfig, "get", "batches", "-n", "bench", "-o", "json"))
    accepted, queued, granted, firsts = {}, {}, {}, {}
    for batch in batches["items"]:
        name, uid = batch["metadata"]["name"], batch["metadata"]["uid"]
        if (batch.get("status") or {}).get("inProgressAt"):
            accepted[name] = float(batch["status"]["inProgressAt"])
        spec = store / keys.shard_spec_key("bench", uid, 0)
        if spec.exists():
            queued[name] = spec.stat().st_mtime
        work = store / keys.work_prefix("bench", uid)
        times = [p.stat().st_mtime for p in work.glob("shards/*/output-*")]
        if times:
            firsts[name] = min(times)
        lease = store / keys.shard_lease_key(keys.shard_prefix("bench", uid, 0))
        if lease.exists():
            granted[name] = ShardLease.model_validate_json(lease.read_bytes()).granted_at
    return accepted, queued, granted, firsts


async def create_at_once(
    kubeconfig: pathlib.Path, batches: list[dict[str, Any]], namespace: str = "bench"
) -> dict[str, float]:
    """Create the Batches concurrently (32 requests in flight, as many clients would), each
    timed from just before its request is sent: the API server, not one client's sequence of
    POSTs, sets the pace."""
    kube = await KubeClient.connect(str(kubeconfig))
    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(32)

    async def create(body: dict[str, Any]) -> None:
        async with gate:
            sent[body["metadata"]["name"]] = time.time()
            await kube.create_custom("batches", namespace, body)

    try:
        await asyncio.gather(*(create(b) for b in batches))
    finally:
        await kube.close()
    return sent


class KubectlWatch:
    """Each object of ``resource`` in ``namespace`` as a ``kubectl get --watch`` started before
    the creates shows it: when it was first seen (``seen``) and first seen ``completed``
    (``done``). The API server sends each change once as it happens, where polling listed all N
    Batches (inline requests and all) every second — a LIST of 200 objects a second on the API
    server the operator shares two cores with, and a completion seen up to a second late — and
    a kubectl started every second to list the slot Jobs took 0.08 s of CPU each time from
    those two cores, unseen (a process that exits before the CPU is read is not counted). The
    API server may close a watch that falls behind in a burst (kubectl then exits): the watch
    is started again, its first listing shows what changed meanwhile (timed when seen: late),
    and the restarts are counted and reported."""

    def __init__(
        self, kubeconfig: pathlib.Path, resource: str, namespace: str, log: pathlib.Path
    ) -> None:
        self.seen: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.log = log
        """kubectl's stderr: why a watch ended."""
        self.restarts = 0
        self._command = [
            str(kubectl_binary()),
            f"--kubeconfig={kubeconfig}",
            "get",
            resource,
            "-n",
            namespace,
            "--watch",
            "-o",
            r"jsonpath={.metadata.name} {.status.status}{'\n'}",
        ]
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            with self._lock:  # stop() sees the process started, or none starts after it
                if self._stopped.is_set():
                    return
                with self.log.open("a") as errors:
                    self._process = subprocess.Popen(
                        self._command, stdout=subprocess.PIPE, stderr=errors, text=True
                    )
            assert self._process.stdout is not None
            for line in self._process.stdout:
                name, _, phase = line.strip().partition(" ")
                self.seen.setdefault(name, time.time())
                if phase == "completed":
                    self.done.setdefault(name, time.time())
            self._process.wait()
            if not self._stopped.is_set():
                self.restarts += 1
                time.sleep(0.2)

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            if self._process is not None:
                self._process.terminate()
        self._reader.join(timeout=30)


def run_warmup(kubeconfig: pathlib.Path, count: int, timeout: float = 120) -> None:
    """Run ``count`` batches in namespace ``warmup`` until every one has completed."""
    if count <= 0:
        return
    names = [f"batch-warmup{i:03d}" for i in range(count)]
    bodies = [batch(name, "warmup", 10, priority=None) for name in names]
    asyncio.run(create_at_once(kubeconfig, bodies, "warmup"))
    deadline = time.time() + timeout
    while time.time() < deadline:
        phases = kubectl(
            kubeconfig, "get", "batches", "-n", "warmup", "-o", "jsonpath={.items[*].status.status}"
        ).split()
        if len(phases) == count and all(phase == "completed" for phase in phases):
            time.sleep(1)  # their completion's writes and Events settle before the burst
            return
        time.sleep(0.5)
    raise RuntimeError(f"the warm-up batches did not complete within {timeout:.0f} s")


def inline(requests: int) -> list[dict[str, Any]]:
    """``requests`` inline chat requests for the simulated model."""
    return [
        {
            "customID": f"r{j}",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
        }
        for j in range(requests)
    ]


def batch(
    name: str, namespace: str, requests: int, priority: str | None = "standard"
) -> dict[str, Any]:
    """A Batch of ``requests`` inline requests (``priority`` None: the field left out)."""
    spec: dict[str, Any] = {"endpoint": "/v1/chat/completions", "requests": inline(requests)}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def wait_warm(store: pathlib.Path, slots: int, timeout: float = 300) -> None:
    """Until the pool's minSlots slots have loaded their engines (ready heartbeats): the
    benchmark measures a warm pool, not sixteen slot processes starting at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready = 0
        for path in (store / "slots" / "bench").glob("*/heartbeat.json"):
            try:
                ready += json.loads(path.read_bytes()).get("state") == "ready"
            except (OSError, ValueError):
                continue
        if ready >= slots:
            return
        time.sleep(1)
    raise SystemExit(f"the pool's {slots} slots were not ready in {timeout:g} s")


def peak_rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(operator_pid: int) -> dict[int, tuple[str, float]]:
    """CPU time (user + system) each process has used so far, from ``/proc``, with the part of
    the run it belongs to: the control plane (the ``testcluster`` process: API server, etcd,
    controllers), the operator, the slot processes and everything else."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[str, float]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        program = pathlib.Path(argv[0].decode(errors="replace")).name
        command = b" ".join(argv)
        if int(entry.name) == operator_pid:
            part = "operator"
        elif program == "testcluster":
            part = "control plane"
        elif b"llmbatch" in command and b"slot" in command:
            part = "slots"
        else:
            part = "other"
        used[int(entry.name)] = (part, (int(fields[11]) + int(fields[12])) / tick)
    return used


def cpu_by_part(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU time each part used between the two readings: the processes alive at the second
    (one that exited in between, such as a kubectl call, is not counted)."""
    spent: dict[str, float] = {}
    for pid, (part, seconds) in after.items():
        earlier = before.get(pid, (part, 0.0))[1]
        spent[part] = spent.get(part, 0.0) + max(0.0, seconds - earlier)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--slot-concurrency", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--warmup", type=int, default=1, help="batches run before the burst")
    parser.add_argument(
        "--timeline", type=pathlib.Path, help="write each batch's moments (epoch s) as JSON here"
    )
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-operator-"))
    cluster = DevCluster.start(
        ClusterConfig(state_dir=work / "cluster", nodes=gpu_nodes(2, gpus=args.slots)),
        detach=False,
    )
    operator: subprocess.Popen[bytes] | None = None
    watch: KubectlWatch | None = None
    jobs: KubectlWatch | None = None
    try:
        kc = cluster.kubeconfig
        kubectl(kc, "apply", "-R", "-f", str(repo_root() / "crds"))  # with crds/admission
        kubectl(kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
            for n in ("llmbatch-workers", "bench", "warmup")
        ]
        objects.append(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "ClusterKopfPeering",
                "metadata": {"name": "llmbatch"},
            }
        )
        objects.append(
            {
                "apiVersion": "llmbatch.io/v1alpha1",
                "kind": "BatchPool",
                "metadata": {"name": "bench"},
                "spec": {
                    "models": [{"name": MODEL, "source": "simulated"}],
                    "workerNamespace": "llmbatch-workers",
                    "maxSlots": args.slots,
                    "minSlots": args.slots,  # a warm pool: the slots start before the batches
                    "shardRequests": args.requests,
                    "throughputPerSlot": "1000",
                    "executor": {
                        "engine": "simulated",
                        "engineArgs": ["--latency-seconds=0.01"],
                        "flushSeconds": 1,
                    },
                },
            }
        )
        if args.slot_concurrency is not None:
            objects[-1]["spec"]["slotConcurrency"] = args.slot_concurrency
        kubectl(kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))
        env = {
            **os.environ,
            "KUBECONFIG": str(kc),
            "LLMBATCH_STORE_URI": f"file://{work / 'store'}",
            "LLMBATCH_METRICS_PORT": "0",
            # first results are read from the chunks: keep finished batches' work areas
            "LLMBATCH_RETENTION_INTERVAL": "86400",
        }
        operator = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", "operator", "--liveness-port", "0"],
            env=env,
            stdout=(work / "operator.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        wait_warm(work / "store", args.slots)
        run_warmup(kc, args.warmup)
        batches = [
            batch(f"batch-bench{i:05d}", "bench", args.requests, priority=None)
            for i in range(args.batches)
        ]
        before = request_counts(kc)
        cpu_before = cpu_seconds(operator.pid)
        watch = KubectlWatch(kc, "batches", "bench", work / "watch.log")
        jobs = KubectlWatch(kc, "jobs", "llmbatch-workers", work / "jobs-watch.log")
        time.sleep(1)  # their first listings are done: from now on they see every change
        started = time.time()
        sent = asyncio.run(create_at_once(kc, batches))
        print(f"created {len(sent)} batches in {max(sent.values()) - started:.1f} s (32 at a time)")
        done = watch.done
        while len(done) < args.batches and time.time() - started < args.timeout:
            time.sleep(0.2)
        watch.stop()
        jobs.stop()
        slots = jobs.seen
        cpu = cpu_seconds(operator.pid)
        wall = time.time() - started
        reasons, trailing = events_settled(kc, args.batches)
        after = request_counts(kc)  # the trailing Events' posts included
        cpu_settled = cpu_seconds(operator.pid)
        rss = peak_rss_mib(operator.pid)
        accepted, queued, granted, first_result = first_commits(kc, work / "store")
        if args.timeline is not None:
            moments = {"sent": sent, "queued": queued, "granted": granted}
            moments |= {"first_result": first_result, "completed_seen": done}
            timeline = {
                name: {moment: times[name] for moment, times in moments.items() if name in times}
                for name in sent
            }
            args.timeline.write_text(json.dumps(timeline, indent=1))
        to_accept = [t - sent[name] for name, t in accepted.items()]
        to_grant = [t - sent[name] for name, t in granted.items()]
        to_result = [t - sent[name] for name, t in first_result.items()]
        to_done = [t - sent[name] for name, t in done.items()]
        print(
            f"{args.batches} batches x {args.requests} requests, {args.slots} slots x "
            f"{args.slot_concurrency or 'default'} shards, "
            f"simulated engine, {args.warmup} warm-up batches before; completion from a watch, "
            "first results from the store"
        )
        print(
            f"completed: {len(done)}/{args.batches} in {max(to_done, default=0):.0f} s "
            f"(completion watch restarted {watch.restarts} times: {watch.log})"
        )
        print(f"slots started         {len(slots)}")
        if to_accept:
            print(
                f"create -> accepted    p50 {percentile(to_accept, 0.5):6.1f} s   "
                f"p95 {percentile(to_accept, 0.95):6.1f} s   (whole seconds)"
            )
        if to_grant:
            print(
                f"create -> 1st grant   p50 {percentile(to_grant, 0.5):6.1f} s   "
                f"p95 {percentile(to_grant, 0.95):6.1f} s"
            )
        if to_result:
            print(
                f"create -> 1st result  p50 {percentile(to_result, 0.5):6.1f} s   "
                f"p95 {percentile(to_result, 0.95):6.1f} s"
            )
        if to_done:
            print(
                f"create -> completed   p50 {percentile(to_done, 0.5):6.1f} s   "
                f"p95 {percentile(to_done, 0.95):6.1f} s"
            )
        print(f"operator peak RSS     {rss:6.1f} MiB")
        spent = {kind: n - before.get(kind, 0.0) for kind, n in after.items()}
        ours = sum(n for kind, n in spent.items() if kind.endswith(".llmbatch.io"))
        print(
            f"API requests / batch  {sum(spent.values()) / args.batches:6.1f} (all clients), "
            f"{ours / args.batches:6.1f} on llmbatch.io resources; the most:"
        )
        for kind, n in sorted(spent.items(), key=lambda item: -item[1])[:8]:
            print(f"    {n / args.batches:6.2f}  {kind}")
        print(
            "Events / batch        "
            + ",  ".join(f"{reason} {n / args.batches:.2f}" for reason, n in reasons.most_common())
            + f"  (the last posted {trailing:.1f} s after the last completion)"
        )
        print(f"mean batch duration   {statistics.mean(to_done) if to_done else 0:6.1f} s")
        cores = os.cpu_count() or 1
        spent_cpu = cpu_by_part(cpu_before, cpu)
        print(
            f"CPU while measured    {sum(spent_cpu.values()):6.1f} s of {cores} cores x "
            f"{wall:.0f} s wall = {cores * wall:.0f} s:  "
            + ",  ".join(f"{part} {t:.1f} s" for part, t in sorted(spent_cpu.items()))
        )
        later = cpu_by_part(cpu, cpu_settled)
        print(
            f"  then, until the Events were posted: {sum(later.values()):.1f} s more:  "
            + ",  ".join(f"{part} {t:.1f} s" for part, t in sorted(later.items()))
        )
    finally:
        for running in (watch, jobs):  # a run cut short leaves no kubectl watching a stopped one
            if running is not None:
                running.stop()
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        cluster.stop()


if __name__ == "__main__":
    main()
