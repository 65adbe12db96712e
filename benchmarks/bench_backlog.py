#!/usr/bin/env python3
"""A deep backlog on one operator (#30): what queued batches cost while nothing happens.

On the local control plane with the simulated engine: N queued batches of R inline requests
across T tenant namespaces, on a pool of one slot whose one seat runs a shard that never ends
(so the backlog stays queued). Reports, for the operator under test and, with ``--reference
DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/ref 62b34ae``), for that
tree's operator in the same run, on a fresh cluster each:

- acceptance throughput (create → every batch's shard spec written, from the store), and the CPU
  each part (operator, API server, gateway, this script) spent per accepted batch meanwhile;
- with nothing changing, over ``--window`` seconds: the operator's and the API server's CPU
  (cores), API requests/s by verb and resource (the API server's own counter, less this
  script's readings), the operator's RSS;
- an expedited batch created into the backlog → its shard granted (the lease's ``grantedAt``),
  ``--samples`` times (each then cancelled to free the express seat), p50/p95;
- the operator killed and started again → a new expedited batch granted;
- the etcd database size;
- the Batch transitions the operator logged (each batch accepted once?);
- with a gateway of the tree beside it (a key per tenant): ``GET /v1/batches?limit=20`` p50/p99
  over the tenants, and the official SDK auto-paging through all of one tenant's batches.

The queued batches are created through that gateway (``POST /v1/batches`` with inline
``requests``, as a client would), or with ``--create direct`` as Batch objects carrying
``spec.requests`` (kubectl's way).

    .venv/bin/python benchmarks/bench_backlog.py [--batches 2000] [--tenants 20]
        [--reference /tmp/ref] [--window 60] [--samples 10] [--create gateway|direct]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from bench_operator import (  # type: ignore[import-not-found]  # (run as a script)
    batch,
    cpu_by_part,
    cpu_seconds,
    inline,
    kubectl,
    percentile,
    request_counts,
)
from llmbatch.api.slot import ShardLease
from llmbatch.core import keys
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.devcluster.controlplane import repo_root
from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
from llmbatch.kube import KubeClient

MODEL = "sim-model"
POOL = "backlog"


@dataclass
class Figures:
    """What one side of the run measured."""

    name: str
    accepted: int = 0
    accept_seconds: float = 0.0
    operator_cores: float = 0.0
    apiserver_cores: float = 0.0
    requests_per_second: float = 0.0
    top_requests: list[tuple[str, float]] = field(default_factory=list)
    rss_mib: float = 0.0
    expedited: list[float] = field(default_factory=list)
    expedited_idle: list[float] = field(default_factory=list)
    restart_to_grant: float | None = None
    etcd_mib: float = 0.0
    transitions: Counter[str] = field(default_factory=Counter)
    list_ms: list[float] = field(default_factory=list)
    autopage_seconds: float | None = None
    autopage_count: int = 0
    gateway_cores: float = 0.0
    accepting_ms: dict[str, float] = field(default_factory=dict)
    """CPU per accepted batch (ms) while the batches arrived, by part."""
    notes: list[str] = field(default_factory=list)


async def create_all(kubeconfig: pathlib.Path, bodies: list[dict[str, Any]]) -> dict[str, float]:
    """Create the Batches, 32 requests in flight; when each create was sent."""
    kube = await KubeClient.connect(str(kubeconfig))
    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(32)

    async def create(body: dict[str, Any]) -> None:
        async with gate:
            sent[body["metadata"]["name"]] = time.time()
            await kube.create_custom("batches", body["metadata"]["namespace"], body)

    try:
        await asyncio.gather(*(create(b) for b in bodies))
    finally:
        await kube.close()
    return sent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wire_requests(requests: int) -> list[dict[str, Any]]:
    return [
        {"custom_id": r["customID"], "method": "POST", "url": r["url"], "body": r["body"]}
        for r in inline(requests)
    ]


async def create_through(gateway: Gateway, tenants: int, count: int, requests: int) -> None:
    """``POST /v1/batches`` with inline requests, 16 in flight, tenants in turn."""
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h",
            "requests": wire_requests(requests)}  # fmt: skip
    gate = asyncio.Semaphore(16)
    failures: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:

        async def create(i: int) -> None:
            tenant = f"t{i % tenants:03d}"
            async with gate:
                for _ in range(5):
                    answer = await client.post("/v1/batches", json=body,
                                               headers=gateway.auth(tenant))  # fmt: skip
                    if answer.status_code == 200:
                        return
                    failures[f"{answer.status_code} {answer.text[:120]}"] += 1
                    await asyncio.sleep(1)

        await asyncio.gather(*(create(i) for i in range(count)))
    if failures:
        print(f"  gateway create retries: {dict(failures.most_common(3))}")


class Gateway:
    """A gateway process of one tree, with an API key per tenant."""

    NAMESPACE = "llmbatch-system"

    def __init__(self, repo: pathlib.Path, kubeconfig: pathlib.Path, store: pathlib.Path,
                 log: pathlib.Path) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: dict[str, str] = {}
        self.log = log
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": str(repo / "operator"),
            "LLMBATCH_STORE_URI": f"file://{store}",
            "LLMBATCH_GATEWAY_NAMESPACE": self.NAMESPACE,
            "LLMBATCH_GATEWAY_METRICS_PORT": str(free_port()),
        }
        self.repo = repo
        self.proc: subprocess.Popen[bytes] | None = None

    def add_keys(self, kc: pathlib.Path, tenants: int) -> None:
        secrets = []
        for i in range(tenants):
            tenant = f"t{i:03d}"
            self.keys[tenant] = new_api_key()
            scopes = ["inference:write", "inference:read"]
            digest = hash_key(self.keys[tenant])
            secrets.append(key_secret(f"key-{tenant}", digest, tenant, scopes, self.NAMESPACE))
        kubectl(kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in secrets))

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def start(self, timeout: float = 300) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", "gateway", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, cwd=self.repo,
        )  # fmt: skip
        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the gateway did not get ready in {timeout:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def measure_listing(figures: Figures, gateway: Gateway, tenants: int, calls: int = 200) -> None:
    """``GET /v1/batches?limit=20`` over the tenants in turn; the SDK paging one tenant."""
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        for tenant in ("t000", "t001"):  # warm the connection and the routes
            client.get("/v1/batches", params={"limit": 20}, headers=gateway.auth(tenant))
        for i in range(calls):
            tenant = f"t{i % tenants:03d}"
            began = time.perf_counter()
            answer = client.get("/v1/batches", params={"limit": 20}, headers=gateway.auth(tenant))
            figures.list_ms.append((time.perf_counter() - began) * 1000)
            answer.raise_for_status()
    sdk = openai.OpenAI(api_key=gateway.keys["t001"], base_url=gateway.url + "/v1")
    began = time.perf_counter()
    figures.autopage_count = sum(1 for _ in sdk.batches.list(limit=100))
    figures.autopage_seconds = time.perf_counter() - began


def wait_warm(store: pathlib.Path, timeout: float = 300, pool: str = POOL) -> None:
    """Until the pool's slot has loaded its engine (a ready heartbeat)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for path in (store / "slots" / pool).glob("*/heartbeat.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_bytes()).get("state") == "ready":
                    return
        time.sleep(0.5)
    raise SystemExit(f"the pool's slot was not ready in {timeout:g} s")


def specs_written(store: pathlib.Path) -> list[float]:
    """When each batch's first shard spec was written (acceptance), from the store."""
    return [p.stat().st_mtime for p in (store / "work").glob("*/*/shards/00000/spec.json")]


def grant_time(
    store: pathlib.Path, namespace: str, uid: str, *, ended: bool = False
) -> float | None:
    """When the batch's first shard was granted (while it runs; with ``ended``, also once its
    run has ended)."""
    lease = store / keys.shard_lease_key(keys.shard_prefix(namespace, uid, 0))
    if not lease.exists():
        return None
    parsed = ShardLease.model_validate_json(lease.read_bytes())
    if parsed.state == "granted" or (ended and parsed.granted_at):
        return parsed.granted_at
    return None


def uid_of(kubeconfig: pathlib.Path, namespace: str, name: str) -> str:
    return str(
        kubectl(kubeconfig, "get", "batch", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}")
    )


def expedited_sample(
    kubeconfig: pathlib.Path, store: pathlib.Path, index: int, timeout: float = 90
) -> float | None:
    """Create one expedited batch, wait for its shard's grant; cancel it (its express seat
    frees for the next sample). Seconds from the create to the grant, or None (``timeout``)."""
    name = f"batch-exp{index:05d}{int(time.time()) % 100000:05d}"
    body = batch(name, "t000", 2, priority="expedited")
    sent = asyncio.run(create_all(kubeconfig, [body]))[name]
    uid = ""
    deadline = time.time() + timeout
    granted = None
    while time.time() < deadline:
        if not uid:
            with contextlib.suppress(subprocess.CalledProcessError):
                uid = uid_of(kubeconfig, "t000", name)
        if uid and (granted := grant_time(store, "t000", uid)) is not None:
            break
        time.sleep(0.05)
    kubectl(kubeconfig, "patch", "batch", name, "-n", "t000", "--type=merge",
            "-p", '{"spec":{"cancel":true}}')  # fmt: skip
    time.sleep(2)  # the cancel takes the shard back: the seat frees
    return None if granted is None else granted - sent


class Operator:
    """An operator process of one tree (``repo``), with its own log."""

    def __init__(self, repo: pathlib.Path, kubeconfig: pathlib.Path, store: pathlib.Path,
                 log: pathlib.Path) -> None:  # fmt: skip
        self.repo, self.log = repo, log
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": str(repo / "operator"),
            "LLMBATCH_STORE_URI": f"file://{store}",
            "LLMBATCH_METRICS_PORT": "0",
            "LLMBATCH_RETENTION_INTERVAL": "86400",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", "operator", "--liveness-port", "0"],
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=self.repo,
        )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # an operator under load may not stop in time
                self.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def etcd_mib(state: pathlib.Path) -> float:
    sizes = [p.stat().st_size for p in state.rglob("member/snap/db")]
    return max(sizes, default=0) / 2**20


def setup(kc: pathlib.Path, tenants: int, repo: pathlib.Path) -> None:
    kubectl(kc, "apply", "-R", "-f", str(repo_root() / "crds"))  # with crds/admission
    kubectl(kc, "wait", "--for=condition=Established", "crd/batches.llmbatch.io")
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in ["llmbatch-workers", Gateway.NAMESPACE, *(f"t{i:03d}" for i in range(tenants))]
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
            "metadata": {"name": POOL},
            "spec": {
                "models": [{"name": MODEL, "source": "simulated"}],
                "workerNamespace": "llmbatch-workers",
                "maxSlots": 1,
                "minSlots": 1,
                "slotConcurrency": 1,
                "slotQueue": 0,
                "shardRequests": 1000,
                "throughputPerSlot": "1",
                "executor": {
                    "engine": "simulated",
                    # one request never answered: the slot's seat stays taken, the queue stays
                    "engineArgs": ["--latency-seconds=0.01", "--hang-after=0"],
                    "flushSeconds": 1,
                    "terminationGraceSeconds": 6,  # a cancelled sample frees its seat in 1 s
                    # ...not after waiting for its hung request (a cancel lets requests in the
                    # engine finish for cancelDrainSeconds, 600 s by default)
                    "cancelDrainSeconds": 0,
                    # the slots run the executor of the tree under test (its messages)
                    "env": [{"name": "PYTHONPATH", "value": str(repo / "operator")}],
                },
            },
        }
    )
    kubectl(kc, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))


def run_side(name: str, repo: pathlib.Path, args: argparse.Namespace) -> Figures:
    figures = Figures(name)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench-backlog-{name}-"))
    cluster = DevCluster.start(
        ClusterConfig(state_dir=work / "cluster", nodes=gpu_nodes(1, gpus=4)), detach=False
    )
    store = work / "store"
    operator = Operator(repo, cluster.kubeconfig, store, work / "operator.log")
    gateway = Gateway(repo, cluster.kubeconfig, store, work / "gateway.log")
    try:
        kc = cluster.kubeconfig
        setup(kc, args.tenants, repo)
        gateway.add_keys(kc, args.tenants)
        gateway.start()
        operator.start()
        wait_warm(store)
        for i in range(args.idle_samples):  # depth 0: a warm slot, nothing queued
            figures.expedited_idle.append(expedited_sample(kc, store, 900 + i) or float("nan"))
        started, cpu_started = time.time(), cpu_seconds(operator.pid)
        if args.create == "gateway":
            asyncio.run(create_through(gateway, args.tenants, args.batches, args.requests))
        else:
            bodies = [
                batch(f"batch-q{i:06d}", f"t{i % args.tenants:03d}", args.requests)
                for i in range(args.batches)
            ]
            asyncio.run(create_all(kc, bodies))
        deadline = started + args.accept_timeout
        while len(specs_written(store)) < args.batches and time.time() < deadline:
            time.sleep(1)
        written = specs_written(store)
        figures.accepted = len(written)
        spent = accepting_cpu(cpu_started, cpu_seconds(operator.pid), gateway.pid)
        figures.accepting_ms = {k: v * 1000 / max(1, len(written)) for k, v in spent.items()}
        figures.accept_seconds = (max(written) - started) if written else 0.0
        print(f"[{name}] accepted {len(written)}/{args.batches} in {figures.accept_seconds:.0f} s")
        time.sleep(args.settle)
        measure_rest(figures, kc, operator, args.window, gateway)
        measure_listing(figures, gateway, args.tenants, args.list_calls)
        for i in range(args.samples):
            figures.expedited.append(expedited_sample(kc, store, i) or float("nan"))
            if len(figures.expedited) >= 2 and all(x != x for x in figures.expedited[-2:]):
                break  # two in a row never granted in 90 s: the rest would not be either
        print(f"[{name}] expedited create -> granted: {figures.expedited}")
        operator.kill()
        operator.start()
        time.sleep(2)
        figures.restart_to_grant = expedited_sample(kc, store, 999)
        figures.etcd_mib = etcd_mib(work / "cluster")
        figures.transitions = transitions(work / "operator.log")
    finally:
        gateway.stop()
        operator.stop()
        cluster.stop()
    report([figures], args)  # each side as soon as it is measured
    return figures


def accepting_cpu(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], gateway_pid: int
) -> dict[str, float]:
    """CPU seconds each part used while the batches arrived (the gateway apart from the rest
    of ``cpu_by_part``'s "other", which is mostly this script)."""
    spent = cpu_by_part(before, after)
    gateway = after[gateway_pid][1] - before.get(gateway_pid, ("", 0.0))[1]
    spent["other"] = spent.get("other", 0.0) - gateway
    return {**spent, "gateway": gateway}


def measure_rest(
    figures: Figures, kc: pathlib.Path, operator: Operator, window: float, gateway: Gateway
) -> None:
    """CPU, API requests and RSS over ``window`` seconds in which nothing changes."""
    before, cpu_before = request_counts(kc), cpu_seconds(operator.pid)
    time.sleep(window)
    after, cpu_after = request_counts(kc), cpu_seconds(operator.pid)
    spent = cpu_by_part(cpu_before, cpu_after)
    figures.operator_cores = spent.get("operator", 0.0) / window
    figures.apiserver_cores = spent.get("control plane", 0.0) / window
    figures.gateway_cores = (
        cpu_after[gateway.pid][1] - cpu_before.get(gateway.pid, ("", 0.0))[1]
    ) / window
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    delta = {k: v for k, v in delta.items() if v > 0}
    delta["get"] = max(0.0, delta.get("get", 0.0) - 1)  # this script's own /metrics reading
    figures.requests_per_second = sum(delta.values()) / window
    figures.top_requests = sorted(
        ((k, v / window) for k, v in delta.items()), key=lambda kv: -kv[1]
    )[:6]
    figures.rss_mib = rss_mib(operator.pid)


def transitions(log: pathlib.Path) -> Counter[str]:
    """Phase changes the operator logged for the queued batches (not the expedited samples)."""
    found: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        match = re.search(r"/(batch-[a-z0-9]+) → (\w+) \(", line)
        if match and not match.group(1).startswith("batch-exp"):
            found[match.group(2)] += 1
    return found


#: The parts whose CPU per accepted batch the report shows (label, ``accepting_cpu`` key).
ACCEPTING_PARTS = (
    ("operator", "operator"),
    ("API server", "control plane"),
    ("gateway", "gateway"),
    ("bench", "other"),
)


def report(sides: list[Figures], args: argparse.Namespace) -> None:
    print()
    print(f"{args.batches} queued batches x {args.requests} inline requests across {args.tenants} "
          f"tenants, one slot, simulated engine; rest measured over {args.window:g} s")  # fmt: skip
    rows: list[tuple[str, list[str]]] = [
        ("accepted / second", [f"{f.accepted / max(f.accept_seconds, 1e-9):.1f}" for f in sides]),
        *(
            (f"accepting: {part} CPU / batch (ms)", [_ms(f.accepting_ms, key) for f in sides])
            for part, key in ACCEPTING_PARTS
        ),
        ("at rest: operator cores", [f"{f.operator_cores:.3f}" for f in sides]),
        ("at rest: API server cores", [f"{f.apiserver_cores:.3f}" for f in sides]),
        ("at rest: API requests / s", [f"{f.requests_per_second:.1f}" for f in sides]),
        ("operator RSS (MiB)", [f"{f.rss_mib:.0f}" for f in sides]),
        ("expedited -> granted, no backlog p50 (s)", [_q(f.expedited_idle, 0.5) for f in sides]),
        ("expedited -> granted p50 (s)", [_q(f.expedited, 0.5) for f in sides]),
        ("expedited -> granted p95 (s)", [_q(f.expedited, 0.95) for f in sides]),
        ("restart -> new batch granted (s)", [_s(f.restart_to_grant) for f in sides]),
        ("at rest: gateway cores", [f"{f.gateway_cores:.3f}" for f in sides]),
        ("GET /v1/batches?limit=20 p50 (ms)", [_q(f.list_ms, 0.5) for f in sides]),
        ("GET /v1/batches?limit=20 p99 (ms)", [_q(f.list_ms, 0.99) for f in sides]),
        ("SDK auto-paging one tenant (s)", [_autopage(f) for f in sides]),
        ("etcd database (MiB)", [f"{f.etcd_mib:.0f}" for f in sides]),
        ("'-> in_progress' per batch", [_per(f, "in_progress") for f in sides]),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  " + "  ".join(f"{f.name:>12}" for f in sides))
    for label, values in rows:
        print(f"{label:{width}}  " + "  ".join(f"{v:>12}" for v in values))
    for f in sides:
        print(f"[{f.name}] most requested at rest: "
              + ", ".join(f"{k} {v:.2f}/s" for k, v in f.top_requests))  # fmt: skip


def _ms(figures: dict[str, float], key: str) -> str:
    return f"{figures.get(key, 0.0):.1f}"


def _q(values: list[float], q: float) -> str:
    real = [v for v in values if v == v]
    if not real:
        return "none"
    missing = len(values) - len(real)
    return f"{percentile(real, q):.2f}" + (f" ({missing} never)" if missing else "")


def _per(f: Figures, phase: str) -> str:
    return f"{f.transitions[phase] / max(1, f.accepted):.2f}"


def _autopage(f: Figures) -> str:
    if f.autopage_seconds is None:
        return "none"
    return f"{f.autopage_seconds:.2f} ({f.autopage_count})"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--settle", type=float, default=30)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--idle-samples", type=int, default=3)
    parser.add_argument("--list-calls", type=int, default=100)
    parser.add_argument("--accept-timeout", type=float, default=1800)
    parser.add_argument("--reference", type=pathlib.Path, help="a checkout of an earlier commit")
    parser.add_argument("--create", choices=("gateway", "direct"), default="gateway")
    args = parser.parse_args()
    sides = []
    if args.reference is not None:
        sides.append(run_side("reference", args.reference.resolve(), args))
    sides.append(run_side("this tree", repo_root(), args))
    report(sides, args)


if __name__ == "__main__":
    main()
