#!/usr/bin/env python3
"""Gateway performance: streaming upload throughput and memory, and retrieve latency under load.

1. Upload a 200 MB valid batch file (the bench_validate.py generator) through ``POST /v1/files``
   from a separate client process: MB/s, and the gateway's peak RSS (VmHWM, target < 200 MB);
   compared with the validator alone on the same file (target: upload >= 0.5 x validator).
2. ``GET /v1/batches/{id}`` at a fixed 100 requests/s (open loop) from a separate process for ~10 s:
   p50 / p99 latency (target p99 < 50 ms).

The gateway runs as its own process (``llmbatch gateway``) against a real API server: the dev
cluster (``make testcluster kubectl``; started here), or ``--kubeconfig`` for a running one. With
``--fake`` (no cluster) it serves from an in-memory Kubernetes stand-in instead.

    .venv/bin/python benchmarks/bench_gateway.py [--runs 3] [--mb 200] [--rate 100] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_validate import make_file, run_validator  # noqa: E402

TENANT = "bench-tenant"
GATEWAY_NS = "llmbatch-bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_status(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


#: The pool serving the benchmark's model "m" (a create for a model no pool serves is 404).
BENCH_POOL: dict[str, Any] = {
    "apiVersion": "llmbatch.io/v1alpha1",
    "kind": "BatchPool",
    "metadata": {"name": "bench-gateway"},
    "spec": {"models": [{"name": "m", "source": "simulated"}], "executor": {"engine": "simulated"}},
}


# --- the fake-Kubernetes server mode (a child process of this script) --------------------------


def serve_fake(port: int, store: str, key: str) -> None:
    import uvicorn
    from tests.fixtures.gateway import FakeKube

    from llmbatch.gateway.app import create_app
    from llmbatch.gateway.auth import hash_key, key_secret
    from llmbatch.gateway.settings import GatewaySettings
    from llmbatch.storage import open_store

    kube = FakeKube()
    kube.namespaces[TENANT] = {}
    kube.pools.append(BENCH_POOL)
    kube.put_secret(key_secret("bench", hash_key(key), TENANT, ["inference:write"], GATEWAY_NS))
    settings = GatewaySettings(
        store_uri=store,
        gateway_namespace=GATEWAY_NS,
        metrics_port=int(os.environ["LLMBATCH_GATEWAY_METRICS_PORT"]),
    )
    app = create_app(settings, kube=kube, store=open_store(store))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- cluster setup -----------------------------------------------------------------------------


async def prepare_cluster(kubeconfig: str, key: str) -> None:
    from kubernetes_asyncio import client, config

    from llmbatch.gateway.auth import hash_key, key_secret

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        core = client.CoreV1Api(api)
        for ns in (GATEWAY_NS, TENANT):
            try:
                await core.create_namespace({"metadata": {"name": ns}})
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        secret = key_secret(
            f"bench-{os.getpid()}", hash_key(key), TENANT, ["inference:write"], GATEWAY_NS
        )
        await core.create_namespaced_secret(GATEWAY_NS, secret)
        try:  # the gateway answers 404 model_not_found for a model no pool serves
            await client.CustomObjectsApi(api).create_cluster_custom_object(
                "llmbatch.io", "v1alpha1", "batchpools", BENCH_POOL
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise


def apply_crds(kubeconfig: str) -> None:
    from llmbatch.devcluster import kubectl_binary

    kubectl = str(kubectl_binary())
    subprocess.run(
        [kubectl, f"--kubeconfig={kubeconfig}", "apply", "-f", str(ROOT / "crds")],
        check=True,
        capture_output=True,
    )
    for crd in ("batches", "batchfiles", "batchpools"):
        subprocess.run(
            [
                kubectl,
                f"--kubeconfig={kubeconfig}",
                "wait",
                "--for=condition=Established",
                f"crd/{crd}.llmbatch.io",
                "--timeout=60s",
            ],
            check=True,
            capture_output=True,
        )


def start_gateway(mode: str, kubeconfig: str | None, store: str, key: str, port: int) -> Any:
    """The gateway process; its ``metrics_url`` attribute is its own metrics listener."""
    metrics_port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LLMBATCH_GATEWAY_METRICS_PORT": str(metrics_port),
    }
    if mode == "fake":
        argv = [
            sys.executable,
            __file__,
            "--serve-fake",
            "--port",
            str(port),
            "--store",
            store,
            "--key",
            key,
        ]
    else:
        assert kubeconfig
        env.update(
            KUBECONFIG=kubeconfig,
            LLMBATCH_STORE_URI=store,
            LLMBATCH_GATEWAY_NAMESPACE=GATEWAY_NS,
        )
        env.pop("KUBERNETES_SERVICE_HOST", None)
        argv = [
            sys.executable,
            "-m",
            "llmbatch",
            "gateway",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT)
    proc.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                base + "/v1/batches?limit=1", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit("gateway exited at start")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("gateway did not become ready")


# --- client sides (run in a child process) -----------------------------------------------------

UPLOAD_CLIENT = """
import sys, time, httpx, json
base, key, path = sys.argv[1:4]
start = time.perf_counter()
with open(path, "rb") as f:
    r = httpx.post(base + "/v1/files", headers={"Authorization": "Bearer " + key},
                   files={"file": ("big.jsonl", f)}, data={"purpose": "batch"}, timeout=600)
elapsed = time.perf_counter() - start
assert r.status_code == 200, r.text
print(json.dumps({"seconds": elapsed, "id": r.json()["id"]}))
"""

LATENCY_CLIENT = """
import asyncio, json, sys, time
from urllib.parse import urlsplit
base, key, batch_id = sys.argv[1:4]
rate, seconds = float(sys.argv[4]), float(sys.argv[5])
host, port = urlsplit(base).hostname, urlsplit(base).port
REQ = (f"GET /v1/batches/{batch_id} HTTP/1.1\\r\\nHost: {host}\\r\\n"
       f"Authorization: Bearer {key}\\r\\n\\r\\n").encode()
idle = []
async def fetch():
    conn = idle.pop() if idle else None
    if conn is not None:  # a kept-alive connection the server may have closed meanwhile
        try:
            return await exchange(conn)
        except (OSError, asyncio.IncompleteReadError):
            pass
    return await exchange(await asyncio.open_connection(host, port))
async def exchange(conn):
    reader, writer = conn
    writer.write(REQ)
    head = await reader.readuntil(b"\\r\\n\\r\\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\\r\\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    idle.append(conn)
    return status
async def main():
    lat, errors, kinds = [], 0, {}
    for _ in range(20):
        await fetch()
    async def one():
        nonlocal errors
        t = time.perf_counter()
        try:
            status = await fetch()
        except (OSError, asyncio.IncompleteReadError) as exc:
            status = type(exc).__name__
        lat.append(time.perf_counter() - t)
        if status != 200:
            errors += 1
            kinds[str(status)] = kinds.get(str(status), 0) + 1
    tasks, t0, n = [], time.perf_counter(), int(rate * seconds)
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    lat.sort()
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    out = {"p50": p50, "p99": p99, "n": len(lat), "errors": errors, "kinds": kinds}
    print(json.dumps(out))
asyncio.run(main())
"""


def run_client(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"client failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def create_batch(base: str, key: str) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    }
    f = httpx.post(
        base + "/v1/files",
        headers=headers,
        files={"file": ("a.jsonl", json.dumps(line).encode() + b"\n")},
        data={"purpose": "batch"},
    )
    if f.is_error:
        raise SystemExit(f"upload refused: {f.status_code} {f.text}")
    b = httpx.post(
        base + "/v1/batches",
        headers=headers,
        json={
            "input_file_id": f.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    b.raise_for_status()
    return str(b.json()["id"])


def server_quantiles(metrics_url: str) -> tuple[float, float]:
    """p50 and p99 bucket bounds of GET /v1/batches/{batch_id} from the gateway's histogram
    (served on the gateway's own metrics listener, never the API port)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if (
            line.startswith("llmbatch_gateway_request_seconds_bucket")
            and 'route="/batches/{batch_id}"' in line
            and 'method="GET"' in line
        ):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0

    def quantile(q: float) -> float:
        for bound, count in buckets:
            if count >= q * total:
                return bound
        return float("nan")

    return quantile(0.5), quantile(0.99)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--kubeconfig", default=None, help="a running cluster (CRDs applied here)")
    parser.add_argument("--fake", action="store_true", help="no cluster: in-memory Kubernetes")
    parser.add_argument("--no-upload", action="store_true", help="only the latency run")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--store", default="", help=argparse.SUPPRESS)
    parser.add_argument("--key", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.port, args.store, args.key)
        return

    from llmbatch.gateway.auth import new_api_key

    path = make_file(args.lines, args.mb)
    size_mb = path.stat().st_size / 1e6
    key = new_api_key()
    cluster = None
    kubeconfig = args.kubeconfig
    mode = "fake" if args.fake else "cluster"
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
        if mode == "cluster" and kubeconfig is None:
            from llmbatch.devcluster import ClusterConfig, DevCluster, testcluster_binary

            if not testcluster_binary().is_file():
                raise SystemExit("no testcluster binary: run `make testcluster kubectl` or --fake")
            cluster = DevCluster.start(
                ClusterConfig(state_dir=pathlib.Path(tmp) / "cluster", nodes=[]), detach=False
            )
            kubeconfig = str(cluster.kubeconfig)
        try:
            if mode == "cluster":
                assert kubeconfig
                apply_crds(kubeconfig)
                asyncio.run(prepare_cluster(kubeconfig, key))
            store = f"file://{tmp}/store"
            port = free_port()
            proc = start_gateway(mode, kubeconfig, store, key, port)
            base = f"http://127.0.0.1:{port}"
            try:
                idle_rss = proc_status(proc.pid, "VmRSS")
                uploads, validators = [], []
                for _ in range(0 if args.no_upload else args.runs):
                    validators.append(size_mb / run_validator(path))
                    uploads.append(
                        size_mb / run_client(UPLOAD_CLIENT, base, key, str(path))["seconds"]
                    )
                peak = proc_status(proc.pid, "VmHWM")
                up = statistics.median(uploads) if uploads else 0.0
                val = statistics.median(validators) if validators else 1.0
                print(f"upload {up:.1f} MB/s, validator {val:.1f} MB/s, peak RSS {peak / 1e6:.1f}")
                batch_id = create_batch(base, key)
                latencies = [
                    run_client(
                        LATENCY_CLIENT, base, key, batch_id, str(args.rate), str(args.seconds)
                    )
                    for _ in range(args.runs)
                ]
                server_side = server_quantiles(proc.metrics_url)
            finally:
                proc.terminate()
                proc.wait(timeout=20)
        finally:
            if cluster is not None:
                cluster.stop()
    p50 = statistics.median(x["p50"] for x in latencies) * 1000
    p99 = statistics.median(x["p99"] for x in latencies) * 1000
    errors = sum(x["errors"] for x in latencies)
    kinds: dict[str, int] = {}
    for x in latencies:
        for kind, count in x["kinds"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    print(f"gateway on {'in-memory Kubernetes' if mode == 'fake' else 'a real API server'}")
    print(f"file: {path.name} ({size_mb:.0f} MB), median of {args.runs} runs")
    print(f"upload through gateway   {up:8.1f} MB/s")
    print(f"validator alone          {val:8.1f} MB/s")
    print(f"ratio (upload/validator) {up / val:8.2f}   (target >= 0.5)")
    print(f"gateway RSS idle         {idle_rss / 1e6:8.1f} MB")
    print(f"gateway peak RSS         {peak / 1e6:8.1f} MB   (target < 200)")
    print(
        f"GET /v1/batches/{{id}} at {args.rate:.0f}/s for {args.seconds:.0f}s: "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms   (target p99 < 50), errors {errors} {kinds or ''}"
    )
    print(f"p99 ratio to target      {p99 / 50:8.2f}")
    print(
        "server-side (gateway histogram, all runs; bucket upper bounds): "
        f"p50 <= {server_side[0] * 1000:g} ms, p99 <= {server_side[1] * 1000:g} ms"
    )


if __name__ == "__main__":
    main()
