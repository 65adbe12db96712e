"""The user docs run as written.

- Every fenced block of the install guide and the platform pages carries a ``doc-test`` marker
  (an HTML comment on the line above it) saying what the test does with it:

  ``<!-- doc-test: run -->``      a shell block, run in page order in one bash session
  ``<!-- doc-test: file -->``     a file the commands use; its first line ``# NAME`` names it
  ``<!-- doc-test: values -->``   chart values, ``helm template``-d on top of the guide's
  ``<!-- doc-test: text -->``     shown, not run (syntax, output, Dockerfiles)
  ``<!-- doc-test: skip (why) -->`` a command a test machine cannot run (GPUs, Docker, AWS)

  An unmarked block fails the test, so a new command is either run or explicitly excused.
- docs/install.md runs from step 1 to the uninstall on a real control plane
  (``llmbatch.devcluster``) with the pinned helm and kubectl. The test changes only what a test
  machine must: the store endpoint (its own S3 server), the pool's engine (the node agent runs
  processes, not the GPU image), loopback ports (every pod of the dev cluster listens on
  127.0.0.1) and ``kubectl port-forward`` (emulated: the dev cluster has none). Each substitution
  must match, so a reworded block fails here instead of silently running something else.
- Every Kubernetes YAML example in docs/ is applied with a server-side dry run (the CRDs' schemas
  and CEL rules, Pod Security admission in the worker namespace).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from tests.fixtures.chart import CHART, helm, helm_binary
from tests.fixtures.cluster import kubectl, start_cluster
from tests.fixtures.ports import free_port
from tests.fixtures.s3server import S3Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INSTALL = DOCS / "install.md"
# Pages written to be run: every block is marked. Other pages' YAML examples are still applied.
MARKED_PAGES = (
    "install.md",
    "images.md",
    "compatibility.md",
    "sizing.md",
    "troubleshooting.md",
    "upgrading.md",
    "backup.md",
    "security.md",
    "storage.md",
    "operations.md",
    "cli.md",
)
README = ROOT / "README.md"
KINDS = ("run", "file", "values", "text", "skip")
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*doc-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
RELEASE = "llm-batch-operator"
RELEASE_NAMESPACE = "llmbatch-system"
WORKERS = "llmbatch-workers"
BUCKET = "acme-llmbatch"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    line: int
    lang: str
    kind: str | None
    reason: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file_name(self) -> str:
        first = self.text.splitlines()[0] if self.text else ""
        match = re.match(r"^#\s*(\S+)\s*$", first)
        if not match:
            raise AssertionError(f"{self.where}: a `file` block starts with `# NAME`")
        return match[1]


def blocks(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of ``page`` with the marker right above each (None: unmarked)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        start = index
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        marker = _MARKER.match(lines[start - 1]) if start else None
        found.append(
            Block(
                page=str(page.relative_to(ROOT)),
                line=start + 1,
                lang=fence[1],
                kind=marker[1] if marker else None,
                reason=marker[2] if marker else "",
                text="\n".join(lines[start + 1 : end]) + "\n",
            )
        )
        index = end + 1
    return found


def marking_problems(page: pathlib.Path) -> list[str]:
    """What is wrong with the doc-test markers of ``page``'s blocks."""
    if not page.exists():
        return [f"{page.name}: missing"]
    problems = []
    for block in blocks(page):
        if block.kind is None:
            problems.append(f"{block.where}: unmarked ```{block.lang} block")
        elif block.kind not in KINDS:
            problems.append(f"{block.where}: unknown marker {block.kind!r}")
        elif block.kind == "skip" and not re.fullmatch(r"\(.+\)", block.reason):
            problems.append(f"{block.where}: `skip` needs a reason in parentheses")
        elif block.kind == "run" and block.lang not in ("bash", "sh"):
            problems.append(f"{block.where}: `run` is for bash blocks")
        elif block.kind == "file":
            block.file_name  # noqa: B018  (raises when the name line is missing)
    return problems


def test_every_block_of_the_runnable_pages_is_marked() -> None:
    problems = [p for name in MARKED_PAGES for p in marking_problems(DOCS / name)]
    assert not problems, "\n".join(problems)


def test_every_block_of_the_readme_is_marked() -> None:
    """README.md's commands run too: its install block here, the rest against the local stack
    (tests/integration/test_client_cli.py)."""
    problems = marking_problems(README)
    assert not problems, "\n".join(problems)
    kinds = {block.kind for block in blocks(README)}
    assert {"run", "file"} <= kinds, kinds


def test_the_readme_install_renders_with_its_three_values(tmp_path: pathlib.Path) -> None:
    """The README's ``helm install`` with exactly the values it names renders (``helm
    template``: the same chart checks, no cluster)."""
    helm_binary()
    (block,) = [b for b in blocks(README) if b.kind == "run" and "helm install" in b.text]
    script = block.text.replace("helm install", "helm template", 1)
    assert script.count("--set ") == 3, block.text
    env = {**os.environ, "PATH": f"{ROOT / '.cache' / 'bin'}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{README.name}:{block.line}: {result.stderr}"
    rendered = list(yaml.safe_load_all(result.stdout))
    deployments = {d["metadata"]["name"] for d in rendered if d and d["kind"] == "Deployment"}
    assert deployments == {"llm-batch-operator-operator", "llm-batch-operator-gateway"}
    assert "registry.example.com/llmbatch/" in result.stdout


def test_readme_links_the_platform_pages() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in MARKED_PAGES:
        assert f"docs/{name}" in readme, f"README.md does not link docs/{name}"


def test_printer_columns_in_the_guide_match_the_crds() -> None:
    """``kubectl get batches  # STATUS, ...`` comments name the columns kubectl really prints."""
    checked = 0
    for block in blocks(INSTALL):
        for line in block.text.splitlines():
            match = re.match(r"^kubectl get (batches|batchpools)\b[^#]*#\s*([A-Z, ]+)$", line)
            if not match:
                continue
            crd = yaml.safe_load((ROOT / "crds" / f"{match[1]}.llmbatch.io.yaml").read_text())
            columns = [
                c["name"].upper()
                for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
                if not c.get("priority")
            ]
            assert [c.strip() for c in match[2].split(",")] == columns, f"{block.where}: {line}"
            checked += 1
    assert checked == 2


# --- install.md on a real control plane ------------------------------------------------------


def _controllers() -> str:
    """The dev cluster's controllers plus the persistent-volume binder: the test plays the storage
    provisioner (a pre-made PersistentVolume), so the guide's model-cache claim binds."""
    source = (ROOT / "hack" / "testcluster" / "main.go").read_text()
    body = re.search(r"defaultControllers = strings\.Join\(\[\]string\{(.*?)\}", source, re.S)
    assert body, "defaultControllers not found in hack/testcluster/main.go"
    names = re.findall(r'"([a-z-]+)"', body[1])
    return ",".join([*names, "persistentvolume-binder-controller"])


@pytest.fixture(scope="module")
def docs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    state = tmp_path_factory.mktemp("docs-cluster")
    cluster = start_cluster(
        ClusterConfig(
            state_dir=state,
            nodes=gpu_nodes(2),
            controlplane_args=[f"--controllers={_controllers()}"],
        )
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def _substitute(text: str, where: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text, f"{where}: the test expects {old!r} here; update test_docs.py too"
        text = text.replace(old, new)
    return text


def _prelude(values: pathlib.Path) -> str:
    portforward = pathlib.Path(__file__).with_name("portforward.py")
    return f"""set -euo pipefail
# The dev cluster shares 127.0.0.1 between pods: every release gets its own free ports.
helm() {{
  case "$1" in
    install|upgrade) command helm "$@" -f {values} --timeout 5m ;;
    *) command helm "$@" ;;
  esac
}}
# The dev cluster has no port-forward: emulate it (portforward.py resolves Service → pod port).
kubectl() {{
  if [[ " $* " == *" port-forward "* ]]; then
    python3 {portforward} "$@"
  else
    command kubectl "$@"
  fi
}}
"""


def _run_script(script: pathlib.Path, env: dict[str, str], cwd: pathlib.Path) -> tuple[int, str]:
    log = cwd / "run.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", str(script)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=1200)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            # The background port-forward and anything else the blocks left running.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return code, log.read_text(errors="replace")


def _diagnostics(cluster: DevCluster) -> str:
    pods = kubectl(cluster.kubeconfig, "get", "pods", "-A", "-o", "wide", check=False).stdout
    events = kubectl(cluster.kubeconfig, "get", "events", "-A", check=False).stdout
    logs = [
        f"--- {path.relative_to(cluster.pods_dir)}\n"
        + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
        for path in sorted(cluster.pods_dir.glob("*/*/*.log"))
    ]
    return f"pods:\n{pods}\nevents:\n{events[-6000:]}\n" + "\n".join(logs)[-20000:]


def _json(cluster: DevCluster, *args: str) -> Any:
    return json.loads(kubectl(cluster.kubeconfig, *args, "-o", "json").stdout)


def test_install_guide_runs_as_written(
    docs_cluster: DevCluster, s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    cluster = docs_cluster
    helm_binary()  # skips (fails in CI) without `make helm`, like the chart tests
    with contextlib.suppress(Exception):  # already made by an earlier run in this session
        s3_server.client().create_bucket(Bucket=BUCKET)
    store = (
        f"s3://{BUCKET}/prod?endpoint_url={s3_server.endpoint_url}"
        f"&region={s3_server.region}&path_style=true"
    )
    local = free_port()
    ports = tmp_path / "test-ports.yaml"
    ports.write_text(
        yaml.safe_dump(
            {
                "operator": {"metricsPort": free_port(), "healthPort": free_port()},
                "gateway": {"port": free_port(), "metricsPort": free_port()},
            }
        )
    )
    # The storage provisioner the guide's claim asks for (class efs-sc, ReadWriteMany).
    kubectl(
        cluster.kubeconfig,
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "docs-test-efs"},
                "spec": {
                    "capacity": {"storage": "200Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "efs-sc",
                    "hostPath": {"path": str(tmp_path / "models")},
                },
            }
        ),
    )
    substitutions: dict[str, dict[str, str]] = {
        "llmbatch-values.yaml": {"s3://acme-llmbatch/prod?region=eu-west-1": store},
        "pool.yaml": {
            "engine: vllm": "engine: simulated",
            '"--gpu-memory-utilization=0.92"': '"--latency-seconds=0.05"',
        },
        "first_batch.py": {"127.0.0.1:8000": f"127.0.0.1:{local}"},
    }
    run_substitutions = {
        "8000:80": f"{local}:80",
        "127.0.0.1:8000": f"127.0.0.1:{local}",
        # The guide's placeholder keys: the test server checks every request's signature.
        "AWS_ACCESS_KEY_ID=AKIA...": f"AWS_ACCESS_KEY_ID={s3_server.access_key_id}",
        "AWS_SECRET_ACCESS_KEY=...": f"AWS_SECRET_ACCESS_KEY={s3_server.secret_access_key}",
    }
    workdir = tmp_path / "reader"
    workdir.mkdir()
    for name in ("charts", ".venv"):
        (workdir / name).symlink_to(ROOT / name)
    script = [_prelude(ports)]
    used: set[str] = set()
    # The guide first; then the other pages' commands (backup.md's), on what the guide left.
    pages = [INSTALL, *(DOCS / name for name in MARKED_PAGES if name != INSTALL.name)]
    for block in (b for page in pages for b in blocks(page)):
        if block.kind == "file":
            name = block.file_name
            text = block.text
            if name in substitutions:
                text = _substitute(text, block.where, substitutions[name])
                used.add(name)
            (workdir / name).write_text(text)
        elif block.kind == "run":
            text = block.text
            for old, new in run_substitutions.items():
                if old in text:
                    text = text.replace(old, new)
                    used.add(old)
            script.append(f'echo "### doc-test: {block.where}"\n{text}')
    assert used == set(substitutions) | set(run_substitutions), f"unused: {used}"
    (workdir / "install.sh").write_text("\n".join(script))
    env = {
        "PATH": f"{ROOT / '.cache' / 'bin'}:{ROOT / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(workdir / ".helm-cache"),
        "HELM_CONFIG_HOME": str(workdir / ".helm-config"),
        "HELM_DATA_HOME": str(workdir / ".helm-data"),
        "LANG": "C.UTF-8",
    }
    started = time.monotonic()
    code, output = _run_script(workdir / "install.sh", env, workdir)
    if code != 0:
        last = re.findall(r"^### doc-test: (\S+)$", output, re.M)
        pytest.fail(
            f"the docs failed (exit {code}) in the block at {last[-1] if last else '?'}"
            f" after {time.monotonic() - started:.0f}s:\n{output[-8000:]}\n{_diagnostics(cluster)}",
            pytrace=False,
        )
    # The SDK example prints the output file: one line per request.
    assert "ticket-0" in output, output[-4000:]
    assert "ticket-1" in output, output[-4000:]

    # Nothing left but what the Uninstall section says is kept.
    assert not helm("list", "-A", "-q", "--kubeconfig", str(cluster.kubeconfig)).stdout.strip()
    selector = f"app.kubernetes.io/instance={RELEASE}"
    for kind in ("deployments", "services", "networkpolicies", "poddisruptionbudgets", "roles"):
        left = _json(cluster, "get", kind, "-A", "-l", selector)["items"]
        assert not left, f"{kind} left after uninstall: {[o['metadata']['name'] for o in left]}"
    for kind in ("clusterroles", "clusterrolebindings", "priorityclasses"):
        left = _json(cluster, "get", kind, "-l", selector)["items"]
        assert not left, f"{kind} left after uninstall: {[o['metadata']['name'] for o in left]}"
    assert not _json(cluster, "get", "batchpools")["items"]
    assert not _json(cluster, "get", "batches", "-A")["items"]
    left = _json(cluster, "get", "jobs,pods", "-n", WORKERS)["items"]
    assert not left, [
        (o["kind"], o["metadata"]["name"], o["metadata"]["creationTimestamp"]) for o in left
    ]
    crds = {o["metadata"]["name"] for o in _json(cluster, "get", "crd")["items"]}
    assert {"batches.llmbatch.io", "batchpools.llmbatch.io", "clusterkopfpeerings.kopf.dev"} <= crds
    for namespace in (RELEASE_NAMESPACE, WORKERS):
        assert _json(cluster, "get", "secret", "llmbatch-store", "-n", namespace)
    claim = _json(cluster, "get", "pvc", "model-cache", "-n", WORKERS)
    assert claim["status"]["phase"] == "Bound"


# --- every YAML example ----------------------------------------------------------------------


def _yaml_examples() -> list[Block]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for block in blocks(page):
            if block.lang != "yaml" or block.kind in ("text", "skip"):
                continue
            found.append(block)
    return found


def _is_values(block: Block) -> bool:
    """Chart values: marked so, or the guide's values file."""
    return block.kind == "values" or (
        block.kind == "file" and block.file_name.endswith("values.yaml")
    )


def _install_values(tmp_path: pathlib.Path) -> pathlib.Path:
    block = next(
        b for b in blocks(INSTALL) if b.kind == "file" and b.file_name.endswith("values.yaml")
    )
    path = tmp_path / block.file_name
    path.write_text(block.text)
    return path


def test_values_examples_render(tmp_path: pathlib.Path) -> None:
    base = _install_values(tmp_path)
    examples = [b for b in _yaml_examples() if b.kind == "values"]  # the base is the other one
    assert examples
    for index, block in enumerate(examples):
        path = tmp_path / f"values-{index}.yaml"
        path.write_text(block.text)
        result = helm(
            "template", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "-f", str(base),
            "-f", str(path), "--api-versions", "cert-manager.io/v1/Certificate", check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{block.where}: {result.stderr}"


def test_yaml_examples_apply(docs_cluster: DevCluster) -> None:
    cluster = docs_cluster
    present = {o["metadata"]["name"] for o in _json(cluster, "get", "crd")["items"]}
    if "batches.llmbatch.io" not in present:  # the install test failed before installing
        kubectl(cluster.kubeconfig, "apply", "-f", str(ROOT / "crds"))
    examples = [b for b in _yaml_examples() if not _is_values(b)]
    assert len(examples) >= 6, [b.where for b in examples]
    for block in examples:
        docs = [d for d in yaml.safe_load_all(block.text) if d]
        assert docs, block.where
        assert all("apiVersion" in d and "kind" in d for d in docs), (
            f"{block.where}: a YAML example is a Kubernetes object, or marked `values` / `text`"
        )
        for doc in docs:
            namespace = doc["metadata"].get("namespace")
            if namespace:
                kubectl(cluster.kubeconfig, "create", "namespace", namespace, check=False)
        result = kubectl(
            cluster.kubeconfig,
            "apply",
            "--dry-run=server",
            "-f",
            "-",
            input=block.text,
            check=False,
        )
        assert result.returncode == 0, f"{block.where}: {result.stderr}"
        assert "Warning" not in result.stderr, f"{block.where}: {result.stderr}"
