"""The built images (`make images-local`: OCI layouts in .cache/images/) run under runc as a
restricted pod runs them: read-only root, their own numeric non-root user, every capability
dropped, no new privileges, memory/pids/CPU limits.

* the gateway image answers /healthz and takes a Files upload against the control plane;
* the operator image starts against the control plane and reconciles a Batch, its store on the
  real S3 server (its shard pods are the node agent's local processes, which run from the
  checkout: docs/devcluster.md);
* the CPU executor image runs a shard with vLLM and SmolLM2 from the store and commits its
  results;
* each image's hygiene: user, labels, no test/dev dependencies, no .git or caches; sizes printed.

Both control-plane tests share one cluster of their own (no other operator may reconcile there).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import stat
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from llmbatch.core.keys import file_key
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.storage import FilesystemStore, open_store
from llmbatch.storage.shardresults import list_chunks, read_progress
from tests.fixtures.cluster import Kube, kubectl, start_cluster
from tests.fixtures.gateway import wait_for_key
from tests.fixtures.images import Bind, Container, Limits, OciImage, project_version
from tests.fixtures.operator import WORKER_NAMESPACE, simulated_pool
from tests.fixtures.ports import free_port
from tests.fixtures.s3server import S3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE_UID = 65532
IMAGES = ("operator", "gateway", "executor-cpu")
MiB = 2**20


# --- helpers -----------------------------------------------------------------------------------


def _store_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A store root the image's user owns (a volume's fsGroup would do this in a cluster)."""
    root = tmp_path / "store"
    root.mkdir()
    os.chown(root, IMAGE_UID, IMAGE_UID)
    return root


def _kubeconfig(cluster: DevCluster, tmp_path: pathlib.Path) -> pathlib.Path:
    """The admin kubeconfig as the image's user reads it (a mounted Secret with fsGroup)."""
    directory = tmp_path / "kube"
    directory.mkdir()
    path = directory / "kubeconfig"
    shutil.copyfile(cluster.kubeconfig, path)
    os.chown(path, IMAGE_UID, IMAGE_UID)
    path.chmod(0o600)
    return path


def _wait_http(url: str, container: Container, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if container.exited() is not None:
            pytest.fail(f"container exited {container.exited()}:\n{container.logs()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} did not answer in {timeout:g}s:\n{container.logs()}")


def _assert_restricted(container: Container, limits: Limits) -> None:
    """What the kernel says about the running container: the image's user, no capabilities, no
    new privileges, and the cgroup limits in force."""
    status = container.process_status()
    assert status["Uid"].split() == [str(IMAGE_UID)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(IMAGE_UID)] * 4, status["Gid"]
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"] == "1"
    assert int(container.cgroup_value("memory", "memory.limit_in_bytes")) == limits.memory_bytes
    assert int(container.cgroup_value("pids", "pids.max")) == limits.pids
    assert int(container.cgroup_value("cpu", "cpu.cfs_quota_us")) == int(limits.cpus * 100_000)


def _image_args(image: OciImage, *args: str) -> list[str]:
    """The chart's ``command`` form: only ``python`` on PATH matters, as in the pod specs."""
    assert image.config()["config"]["Entrypoint"][0] == "python"
    return ["python", *args]


# --- a control plane of this module's own -------------------------------------------------------


@pytest.fixture(scope="module")
def image_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = start_cluster(
        ClusterConfig(state_dir=tmp_path_factory.mktemp("images-cluster"), nodes=gpu_nodes(1))
    )
    try:
        kubectl(cluster.kubeconfig, "apply", "-f", str(ROOT / "crds"))
        for crd in ("batches", "batchfiles", "batchpools"):
            kubectl(
                cluster.kubeconfig,
                "wait",
                "--for=condition=Established",
                f"crd/{crd}.llmbatch.io",
                "--timeout=60s",
            )
        yield cluster
    finally:
        cluster.stop()


def _namespace(cluster: DevCluster, name: str) -> Kube:
    kubectl(cluster.kubeconfig, "create", "namespace", name)
    kube = Kube(cluster, name)
    kube.wait_for(
        lambda: kube.get("serviceaccount", "default"), timeout=30, what="default service account"
    )
    return kube


# --- hygiene ------------------------------------------------------------------------------------

#: Directories that are caches or build leftovers wherever they appear.
CACHE_DIRS = {".git", ".cache", ".mypy_cache", ".ruff_cache", ".pytest_cache", "pip-cache"}
#: What no image may carry: the build stages' work dirs, package manager caches, /tmp contents.
LEFTOVERS = (
    "wheels", "src", "build", "tmp/*", "tmp/.*",
    "var/cache/apt/archives/*.deb", "var/cache/apt/archives/partial/*", "var/cache/apt/*.bin",
    "var/lib/apt/lists/*_Packages*", "var/lib/apt/lists/*_Release*",
)  # fmt: skip


def _dev_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["optional-dependencies"]["dev"]:
        names.add(re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _pinned(requirements: pathlib.Path) -> set[str]:
    lines = requirements.read_text().splitlines()
    return {line.split("==")[0].lower() for line in lines if "==" in line and line[0] != "#"}


def _installed(rootfs: pathlib.Path) -> set[str]:
    """Distribution names installed in the image's venv (from their .dist-info folders)."""
    names = set()
    for dist in (rootfs / "opt" / "venv" / "lib").glob("python3*/site-packages/*.dist-info"):
        name = dist.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        names.add(name.lower().replace("_", "-").replace(".", "-"))
    return names


def _unreadable(rootfs: pathlib.Path, tops: tuple[str, ...], uid: int, gid: int) -> list[str]:
    """Files (and directories it cannot enter) under ``tops`` the image's user cannot read."""
    out = []
    for top in tops:
        for dirpath, dirs, files in os.walk(rootfs / top):
            for entry in [*dirs, *files]:
                path = os.path.join(dirpath, entry)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    continue
                need = 0o5 if stat.S_ISDIR(st.st_mode) else 0o4
                shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
                if (st.st_mode >> shift) & need != need:
                    out.append(os.path.relpath(path, rootfs))
    return out


def _size_mb(path: pathlib.Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_size
    return total // 10**6


@pytest.mark.parametrize("name", IMAGES)
def test_image_hygiene(
    name: str, oci_image: Callable[[str], OciImage], capsys: pytest.CaptureFixture[str]
) -> None:
    image = oci_image(name)
    config = image.config()["config"]
    uid, _, gid = config["User"].partition(":")
    assert re.fullmatch(r"[1-9][0-9]*", uid), config["User"]  # numeric: runAsNonRoot can check it
    assert re.fullmatch(r"[1-9][0-9]*", gid), config["User"]
    labels = config.get("Labels") or {}
    for label in ("title", "description", "version", "licenses", "revision"):
        assert labels.get(f"org.opencontainers.image.{label}"), (label, labels)
    assert labels["org.opencontainers.image.version"] == project_version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"

    rootfs = image.rootfs()
    # Empty ones are only mount points (the local build binds a wheel cache at /root/.cache/uv).
    found = [
        os.path.join(dirpath, d)
        for dirpath, dirs, _ in os.walk(rootfs)
        for d in dirs
        if d in CACHE_DIRS and any(files for _, _, files in os.walk(os.path.join(dirpath, d)))
    ]
    assert found == [], found
    leftovers = [str(p.relative_to(rootfs)) for pattern in LEFTOVERS for p in rootfs.glob(pattern)]
    assert leftovers == [], leftovers
    unreadable = _unreadable(rootfs, ("opt/venv", "models"), int(uid), int(gid))
    assert unreadable == [], f"the image's user cannot read: {unreadable[:10]}"
    installed = _installed(rootfs)
    assert "llm-batch-operator" in installed
    # The CPU stack's pins include a few packages the dev extra also names (openai, psutil):
    # runtime dependencies of vLLM there, not test tools.
    stack = _pinned(ROOT / "hack" / "requirements-vllm.txt") if name == "executor-cpu" else set()
    assert installed & (_dev_dependencies() - stack) == set()
    site = next((rootfs / "opt" / "venv" / "lib").glob("python3*/site-packages"))
    assert not (site / "tests").exists(), "the repository's tests are in the image"
    with capsys.disabled():
        print(
            f"\n[image {name}] {image.layer_bytes() // 10**6} MB of layers (uncompressed layout), "
            f"{_size_mb(rootfs)} MB unpacked, {len(image.manifest()['layers'])} layers, "
            f"user {config['User']}"
        )


# --- the gateway --------------------------------------------------------------------------------


def test_gateway_image_answers_healthz_and_takes_a_files_upload(
    oci_image: Callable[[str], OciImage],
    run_container: Callable[..., Container],
    image_cluster: DevCluster,
    tmp_path: pathlib.Path,
) -> None:
    from llmbatch.gateway.auth import hash_key, key_secret, new_api_key

    image = oci_image("gateway")
    store = _store_dir(tmp_path)
    gateway_ns = "llmbatch-gateway-image"
    kubectl(image_cluster.kubeconfig, "create", "namespace", gateway_ns)
    kubeconfig = _kubeconfig(image_cluster, tmp_path)
    port, metrics_port = free_port(), free_port()
    limits = Limits(memory_bytes=512 * MiB, pids=128, cpus=1.0)
    container = run_container(
        image,
        _image_args(image, "-m", "llmbatch", "gateway", "--host", "127.0.0.1", "--port", str(port)),
        env={
            "KUBECONFIG": str(kubeconfig),
            "LLMBATCH_STORE_URI": f"file://{store}",
            "LLMBATCH_GATEWAY_NAMESPACE": gateway_ns,
            "LLMBATCH_GATEWAY_METRICS_PORT": str(metrics_port),
        },
        binds=[Bind(kubeconfig.parent), Bind(store, writable=True)],
        limits=limits,
    )
    base = f"http://127.0.0.1:{port}"
    _wait_http(base + "/healthz", container, timeout=90)
    _wait_http(base + "/readyz", container, timeout=60)
    _assert_restricted(container, limits)

    tenant = _namespace(image_cluster, f"tenant-{uuid.uuid4().hex[:8]}").namespace
    key = new_api_key()
    secret = key_secret("key-image", hash_key(key), tenant, ["inference:write"], gateway_ns)
    kubectl(image_cluster.kubeconfig, "apply", "-f", "-", input=json.dumps(secret))
    wait_for_key(base, key, accepted=True, timeout=30)

    import openai

    client = openai.OpenAI(api_key=key, base_url=base + "/v1", max_retries=0)
    data = b"".join(
        orjson.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"hi {i}"}],
                    "max_tokens": 8,
                },
            }
        )
        + b"\n"
        for i in range(3)
    )
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    assert uploaded.bytes == len(data)
    assert uploaded.purpose == "batch"
    # the bytes went through the container's read-write bind into the store, as its user
    path = store / file_key(tenant, uploaded.id)
    assert FilesystemStore(store).get(file_key(tenant, uploaded.id)) == data
    assert path.stat().st_uid == IMAGE_UID
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        assert resp.status == 200
    assert container.exited() is None, container.logs()


# --- the operator -------------------------------------------------------------------------------


def test_operator_image_reconciles_a_batch(
    oci_image: Callable[[str], OciImage],
    run_container: Callable[..., Container],
    image_cluster: DevCluster,
    s3_server: S3Server,
    tmp_path: pathlib.Path,
) -> None:
    """The operator image against the real S3 server (versitygw). Not a shared directory: the
    filesystem store writes 0600 and the node agent's slot processes here run as root, where a
    cluster would run every pod sharing a volume as the same user."""
    image = oci_image("operator")
    store_uri = s3_server.uri(s3_server.create_bucket(), prefix="llmbatch")
    kubectl(image_cluster.kubeconfig, "create", "namespace", WORKER_NAMESPACE)
    kubeconfig = _kubeconfig(image_cluster, tmp_path)
    liveness, metrics = free_port(), free_port()
    limits = Limits(memory_bytes=768 * MiB, pids=256, cpus=1.0)
    container = run_container(
        image,
        _image_args(
            image, "-m", "llmbatch", "operator", "--liveness-port", str(liveness),
            "--kubeconfig", str(kubeconfig),
        ),
        env={
            "KUBECONFIG": str(kubeconfig),
            "LLMBATCH_STORE_URI": store_uri,
            "LLMBATCH_RECONCILE_INTERVAL": "1",
            "LLMBATCH_PROGRESS_INTERVAL": "1",
            "LLMBATCH_SLOT_HEARTBEAT_SECONDS": "1",
            "LLMBATCH_SLOT_POLL_SECONDS": "0.5",
            "LLMBATCH_METRICS_PORT": str(metrics),
        },
        binds=[Bind(kubeconfig.parent), Bind(s3_server.secret_dir)],
        limits=limits,
    )  # fmt: skip
    _wait_http(f"http://127.0.0.1:{liveness}/healthz", container, timeout=120)
    _assert_restricted(container, limits)

    kube = _namespace(image_cluster, "t-image-operator")
    pool = simulated_pool("pool-image", "sim-model", maxSlots=1, shardRequests=5)
    kube.apply(pool)
    name = "batch-image"
    kube.apply(
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "Batch",
            "metadata": {"name": name, "namespace": kube.namespace},
            "spec": {
                "endpoint": "/v1/chat/completions",
                "completionWindow": "24h",
                "pool": "pool-image",
                "requests": [
                    {
                        "customID": f"req-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": "sim-model",
                            "messages": [{"role": "user", "content": f"ticket {i}"}],
                            "max_tokens": 8,
                        },
                    }
                    for i in range(10)
                ],
            },
        }
    )

    def finished() -> dict[str, Any] | None:
        batch = kube.get("batch", name)
        status = (batch or {}).get("status") or {}
        return status if status.get("status") in ("completed", "failed") else None

    try:
        status = kube.wait_for(finished, timeout=300, interval=1, what=f"batch {name} finished")
    finally:
        if container.exited() is not None or os.environ.get("LLMBATCH_IMAGES_DEBUG"):
            print(container.logs())
    assert status["status"] == "completed", (status, container.logs())
    assert len(status["shards"]) == 2
    output = open_store(store_uri).get(file_key(kube.namespace, status["outputFileID"]))
    ids = sorted(orjson.loads(line)["custom_id"] for line in output.splitlines())
    assert ids == sorted(f"req-{i}" for i in range(10))
    assert container.exited() is None, container.logs()


# --- the CPU executor ---------------------------------------------------------------------------


def test_executor_cpu_image_runs_a_shard_from_the_store(
    oci_image: Callable[[str], OciImage],
    run_container: Callable[..., Container],
    tmp_path: pathlib.Path,
) -> None:
    image = oci_image("executor-cpu")
    store = _store_dir(tmp_path)
    rows = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 12,
                "temperature": 0,
            },
        }
        for cid, content in [
            ("capital", "What is the capital of France?"),
            ("hello", "Say hello."),
            ("ticket", "Summarize: I cannot sign in."),
        ]
    ]
    (store / "in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    prefix = "uid-image/shards/00000"
    spec = {
        "batch_id": "batch_image",
        "batch_uid": "uid-image",
        "shard_index": 0,
        "endpoint": "/v1/chat/completions",
        "store": f"file://{store}",
        "input_key": "in.jsonl",
        "output_prefix": prefix,
        # the model the image bakes in (the chart's example pool names this path)
        "model": {"name": "smollm2", "path": "/models/smollm2"},
        "engine": {"name": "vllm", "args": {"max_num_seqs": 4}},
        "flush_lines": 2,
        "flush_seconds": 1.0,
    }
    limits = Limits(memory_bytes=6 * 1024 * MiB, pids=1024, cpus=2.0)
    started = time.monotonic()
    container = run_container(
        image,
        _image_args(image, "-m", "llmbatch.executor", "--shard-spec", json.dumps(spec)),
        env={"LLMBATCH_TERMINATION_LOG": "/tmp/termination-log", "VLLM_LOGGING_LEVEL": "WARNING"},
        binds=[Bind(store, writable=True)],
        limits=limits,
    )
    container.wait_running()
    _assert_restricted(container, limits)
    code = container.wait(timeout=600)
    assert code == ExitCode.DONE, container.logs()
    fs = FilesystemStore(store)
    lines = [
        orjson.loads(raw)
        for key in list_chunks(fs, prefix, "output")
        for raw in fs.get(key).splitlines()
    ]
    assert sorted(line["custom_id"] for line in lines) == ["capital", "hello", "ticket"]
    assert all(line["response"]["status_code"] == 200 for line in lines), lines
    capital = next(line for line in lines if line["custom_id"] == "capital")
    answer = capital["response"]["body"]["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer
    progress = read_progress(fs, prefix)
    assert progress is not None
    assert progress.done
    assert progress.completed == 3
    print(f"[image executor-cpu] shard of 3 ran in {time.monotonic() - started:.0f} s")
    shutil.rmtree(store, ignore_errors=True)
