"""``llmbatch batches`` against the local stack: the real control plane, operator and gateway
(the session's), a tenant with a key, and pools of the simulated engine (the CLI is a client:
what the engine answers does not matter to it, how the batch ends does).

Each verb runs as a user runs it, a separate process configured by ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``: submit --wait to completion with the results joined back by custom_id,
list in both formats, get, cancel and the exit code of a cancelled batch, the exit code of a
failed one, results of a kubectl-created Batch by its object name (after ``kubectl wait
--for=condition=Complete``), and the live progress bar and Ctrl-C in a pseudo-terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fixtures.cluster import kubectl
from tests.fixtures.gateway import GatewayProcess, keyed_namespace
from tests.fixtures.operator import ClusterCLI, simulated_pool
from tests.integration.test_operator import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Tenant:
    """A tenant namespace with a key, and the models of its pools."""

    namespace: str
    env: dict[str, str]
    model: str
    """Served by a pool answering at once; lines whose custom_id starts with ``bad-`` get 400."""
    slow_model: str
    """Served by a pool taking 2 s a request, one at a time."""
    doomed_model: str
    """Served by a slow pool of its own, which a test deletes under its batch (which fails)."""


@pytest.fixture(scope="module")
def tenant(cluster: ClusterCLI, gateway: GatewayProcess) -> Iterator[Tenant]:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"cli-{suffix}"
    models = {kind: f"cli-{kind}-{suffix}" for kind in ("fast", "slow", "doomed")}
    engine_args = {
        "fast": ["--latency-seconds=0.01", "--fail-pattern=^bad-", "--fail-status=400"],
        "slow": ["--latency-seconds=2", "--max-num-seqs=1", "--max-running=1"],
        "doomed": ["--latency-seconds=2", "--max-num-seqs=1", "--max-running=1"],
    }
    pools = []
    for kind, model in models.items():
        pool = simulated_pool(f"pool-{model}", model, executor={"engineArgs": engine_args[kind]})
        gateway.kubectl("apply", "-f", "-", obj=pool)
        pools.append(pool["metadata"]["name"])
    key = keyed_namespace(gateway, namespace)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": gateway.base_url + "/v1",
        "OPENAI_API_KEY": key,
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    yield Tenant(namespace, env, models["fast"], models["slow"], models["doomed"])
    for name in pools:
        gateway.kubectl("delete", "batchpool", name, "--wait=false", check=False)
    gateway.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def requests_file(path: pathlib.Path, model: str, ids: list[str]) -> pathlib.Path:
    rows = [
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "max_completion_tokens": 8,
                "messages": [{"role": "user", "content": f"Summarize {custom_id}."}],
            },
        }
        for custom_id in ids
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def llmbatch(
    tenant: Tenant, *args: str, cwd: pathlib.Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``llmbatch ARGS`` in a pipe (so its output is JSON unless asked otherwise)."""
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", *args],
        env=tenant.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ids_in(path: pathlib.Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines() if line]


def test_submit_wait_downloads_every_result_once_by_custom_id(
    tenant: Tenant, tmp_path: pathlib.Path
) -> None:
    ids = [f"ticket-{i}" for i in range(8)] + ["bad-1", "bad-2"]
    source = requests_file(tmp_path / "requests.jsonl", tenant.model, ids)
    run = llmbatch(
        tenant, "batches", "submit", str(source), "--wait", "--output-dir", "out",
        "--metadata", "team=support", "--interval", "0.5", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    batch = summary["batch"]
    assert batch["status"] == "completed"
    assert batch["metadata"]["team"] == "support"
    assert batch["request_counts"] == {"total": 10, "completed": 8, "failed": 2}
    output = pathlib.Path(tmp_path / summary["output_file"])
    errors = pathlib.Path(tmp_path / summary["error_file"])
    assert output.name == f"{batch['id']}_output.jsonl"
    # Joined back by custom_id: every request has exactly one line, in one of the two files.
    assert sorted(ids_in(output) + ids_in(errors)) == sorted(ids)
    assert sorted(ids_in(errors)) == ["bad-1", "bad-2"]
    (group,) = summary["failures"]
    assert group["count"] == 2
    assert group["example_custom_id"] in {"bad-1", "bad-2"}
    # Progress went to stderr, one line per change, ending completed.
    assert f"{batch['id']} completed, 10/10 done, 2 failed" in run.stderr


def test_list_as_json_in_a_pipe_and_as_a_table_when_asked(
    tenant: Tenant, tmp_path: pathlib.Path
) -> None:
    source = requests_file(tmp_path / "requests.jsonl", tenant.model, ["a", "b"])
    created = llmbatch(tenant, "batches", "submit", str(source), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    batch_id = json.loads(created.stdout)["id"]
    assert f"llmbatch batches watch {batch_id}" in created.stderr

    listed = llmbatch(tenant, "batches", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert batch_id in [b["id"] for b in json.loads(listed.stdout)]

    table = llmbatch(tenant, "batches", "list", "--output", "table", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "STATUS", "DONE", "FAILED", "ENDPOINT", "CREATED"]
    assert any(row.split()[0] == batch_id for row in rows)

    shown = llmbatch(tenant, "batches", "get", batch_id, "-o", "table", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:4] == ["id", batch_id, "status", "completed"]


def test_cancel_then_watch_exits_with_the_cancelled_code(
    tenant: Tenant, tmp_path: pathlib.Path
) -> None:
    ids = [f"slow-{i}" for i in range(40)]
    batch_id = submit_running(tenant, tmp_path, tenant.slow_model, ids)
    cancelled = llmbatch(tenant, "batches", "cancel", batch_id, cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] in {"cancelling", "cancelled"}
    watched = llmbatch(tenant, "batches", "watch", batch_id, "--interval", "0.5", cwd=tmp_path)
    assert watched.returncode == 5, watched.stderr
    assert watched.stderr.rstrip().endswith(f"{batch_id} cancelled")
    # results of a cancelled batch: its files, the never-run requests counted by their code
    fetched = llmbatch(tenant, "batches", "results", batch_id, "--output-dir", "res", cwd=tmp_path)
    assert fetched.returncode == 5, fetched.stderr
    summary = json.loads(fetched.stdout)
    codes = {group["code"]: group["count"] for group in summary["failures"]}
    assert codes["batch_cancelled"] >= 1  # 40 requests at 2 s, two at a time: not all ran
    assert sorted(ids_in(tmp_path / summary["error_file"]) + _maybe(tmp_path, summary)) == sorted(
        ids
    )


def _maybe(root: pathlib.Path, summary: dict[str, Any]) -> list[str]:
    return ids_in(root / summary["output_file"]) if summary["output_file"] else []


def test_a_failed_batch_exits_with_the_failed_code(
    tenant: Tenant, cluster: ClusterCLI, tmp_path: pathlib.Path
) -> None:
    """A batch whose pool is deleted under it fails (the other requests become pool_deleted
    lines): watch and results exit 3."""
    ids = [f"doomed-{i}" for i in range(20)]
    batch_id = submit_running(tenant, tmp_path, tenant.doomed_model, ids)
    pool = f"pool-{tenant.doomed_model}"
    cluster.kubectl("delete", "batchpool", pool, "--wait=false")
    watched = llmbatch(tenant, "batches", "watch", batch_id, "--interval", "0.5", cwd=tmp_path)
    assert watched.returncode == 3, f"{watched.stdout}\n{watched.stderr}"
    fetched = llmbatch(tenant, "batches", "results", batch_id, "--output-dir", "r", cwd=tmp_path)
    assert fetched.returncode == 3, fetched.stderr
    summary = json.loads(fetched.stdout)
    assert summary["batch"]["status"] == "failed"
    assert "pool_deleted" in {group["code"] for group in summary["failures"]}
    # kubectl sees the same end: the condition Failed (and never Complete)
    name = "batch-" + batch_id.removeprefix("batch_")
    cluster.kubectl("wait", f"batch/{name}", "-n", tenant.namespace, "--for=condition=Failed")
    conditions = json.loads(
        cluster.kubectl("get", f"batch/{name}", "-n", tenant.namespace, "-o", "json")
    )["status"]["conditions"]
    assert {(c["type"], c["status"], c["reason"]) for c in conditions} >= {
        ("Failed", "True", "PoolDeleted"),
        ("Stalled", "True", "PoolDeleted"),
    }
    assert "Complete" not in {c["type"] for c in conditions}


def submit_running(tenant: Tenant, cwd: pathlib.Path, model: str, ids: list[str]) -> str:
    """``submit`` without waiting, then ``get`` until the batch runs; its id."""
    source = requests_file(cwd / "requests.jsonl", model, ids)
    created = llmbatch(tenant, "batches", "submit", str(source), cwd=cwd)
    assert created.returncode == 0, created.stderr
    batch_id = str(json.loads(created.stdout)["id"])
    wait_for(lambda: _status(tenant, cwd, batch_id) == "in_progress", 120, "in progress")
    return batch_id


def _status(tenant: Tenant, cwd: pathlib.Path, batch_id: str) -> str:
    shown = llmbatch(tenant, "batches", "get", batch_id, cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    status = str(json.loads(shown.stdout)["status"])
    assert status in {"validating", "in_progress"}, shown.stdout
    return status


def test_results_of_a_kubectl_batch_by_its_object_name(
    tenant: Tenant, cluster: ClusterCLI, tmp_path: pathlib.Path
) -> None:
    name = f"batch-kubectl-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": name, "namespace": tenant.namespace},
        "spec": {
            "endpoint": "/v1/chat/completions",
            "requests": [
                {
                    "customID": f"k-{i}",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": tenant.model,
                        "max_completion_tokens": 8,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                }
                for i in range(3)
            ],
        },
    }
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(manifest))
    cluster.kubectl("apply", "-f", str(path))
    # The condition a kubectl user waits on: Complete, set only when the batch completed.
    waited = kubectl(
        cluster.kubeconfig, "wait", f"batch/{name}", "-n", tenant.namespace,
        "--for=condition=Complete", "--timeout=180s", timeout=200, check=False,
    )  # fmt: skip
    status = cluster.kubectl("get", f"batch/{name}", "-n", tenant.namespace, "-o", "json")
    assert waited.returncode == 0, f"{waited.stderr}\n{status}"
    fetched = llmbatch(
        tenant, "batches", "results", name, "-n", tenant.namespace, "--output-dir", "res",
        cwd=tmp_path,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    summary = json.loads(fetched.stdout)
    assert summary["batch"]["id"] == "batch_" + name.removeprefix("batch-")
    assert sorted(ids_in(tmp_path / summary["output_file"])) == ["k-0", "k-1", "k-2"]
    assert summary["failures"] == []
    missing = llmbatch(
        tenant, "batches", "results", "batch-nothing-here", "-n", tenant.namespace, cwd=tmp_path
    )
    assert missing.returncode == 1
    assert f"namespace {tenant.namespace}" in missing.stderr


# --- in a terminal ------------------------------------------------------------------------------


class Terminal:
    """A command on a pseudo-terminal: its output as a terminal shows it."""

    def __init__(self, tenant: Tenant, *args: str, cwd: pathlib.Path) -> None:
        self.master, slave = pty.openpty()
        env = {**tenant.env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmbatch", *args],
            env=env,
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self.screen = b""

    def read_until(self, wanted: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while wanted not in self.screen:
            if time.monotonic() > deadline:
                raise AssertionError(f"{wanted!r} not shown in {timeout}s:\n{self.text()}")
            self._read(0.2)

    def finish(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        self._read(0.2)
        code = self.proc.wait(timeout=5)
        os.close(self.master)
        return code

    def _read(self, wait: float) -> None:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            with contextlib.suppress(OSError):  # the other side closed
                self.screen += os.read(self.master, 65536)

    def text(self) -> str:
        return self.screen.decode(errors="replace")


def test_the_progress_bar_in_a_terminal_and_ctrl_c_leaves_the_batch_running(
    tenant: Tenant, tmp_path: pathlib.Path
) -> None:
    ids = [f"tty-{i}" for i in range(12)]
    source = requests_file(tmp_path / "requests.jsonl", tenant.slow_model, ids)
    first = Terminal(
        tenant, "batches", "submit", str(source), "--wait", "--interval", "0.3", cwd=tmp_path
    )
    first.read_until(b"/12 done", timeout=120)  # the bar, once the total is known
    first.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    assert first.finish(timeout=30) == 130
    shown = first.text()
    assert "━" in shown, shown  # a drawn bar, not log lines
    batch_id = shown.split("keeps running")[0].split()[-1].rstrip(";")
    assert batch_id.startswith("batch_"), shown
    assert f"llmbatch batches watch {batch_id}" in shown

    # The batch went on; watching again follows it to the end.
    second = Terminal(tenant, "batches", "watch", batch_id, "--interval", "0.3", cwd=tmp_path)
    assert second.finish(timeout=180) == 0, second.text()
    assert "12/12 done, 0 failed" in second.text()
    assert f"{batch_id} completed" in second.text()


# --- the README, as written -----------------------------------------------------------------


def test_the_readmes_commands_run_as_written(
    tenant: Tenant, cluster: ClusterCLI, tmp_path: pathlib.Path
) -> None:
    """README.md's request file, SDK example, CLI and kubectl blocks, in order, in one bash
    session against the local stack. Only what must differ here is substituted (each must
    match): the checkout's paths, the demo stack's env file, its model and its namespace."""
    from tests.integration.test_docs import README, ROOT, blocks

    env_file = tmp_path / "demo.env"
    env_file.write_text(
        "".join(
            f"export {name}={tenant.env[name]}\n"
            for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "KUBECONFIG")
        )
    )
    substitutions = {
        "source .venv/bin/activate": f"source {ROOT / '.venv' / 'bin' / 'activate'}",
        "source .devcluster/demo.env": f"source {env_file}",
        "$PWD/.cache/bin": str(ROOT / ".cache" / "bin"),
        "smollm2": tenant.model,
        "namespace: demo": f"namespace: {tenant.namespace}",
        "-n demo": f"-n {tenant.namespace}",
    }
    used: set[str] = set()
    script = ["set -euo pipefail"]
    for block in blocks(README):
        if block.kind not in ("run", "file") or "helm install" in block.text:
            continue  # the install block: test_docs.py renders it
        text = block.text
        for old, new in substitutions.items():
            if old in text:
                text = text.replace(old, new)
                used.add(old)
        if block.kind == "file":
            (tmp_path / block.file_name).write_text(text)
        else:
            script.append(f'echo "### doc-test: {block.where}"\n{text}')
    assert used == set(substitutions), f"unused: {set(substitutions) - used}"
    path = "/usr/local/bin:/usr/bin:/bin"  # the README's own lines put the rest on it
    run = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env={"PATH": path, "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    # The SDK example printed the output file; the CLI and the kubectl batch wrote theirs.
    assert '"custom_id": "ticket-1"' in run.stdout or '"custom_id":"ticket-1"' in run.stdout
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert "batch_tickets_output.jsonl" in written, written
    assert len([name for name in written if name.endswith("_output.jsonl")]) == 2, written
