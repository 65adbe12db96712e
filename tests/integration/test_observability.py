"""The dashboard and the recording rules against a real Prometheus scraping a real run.

Real parts only: Debian's Prometheus (``make prometheus``; the binary started here with a temp
config, 1 s scrapes, the chart's rule file at a 1 s evaluation interval) scrapes the operator
(``operator_process``) and a gateway on the operator's store (its metrics listener,
``LLMBATCH_GATEWAY_METRICS_PORT``) while a batch runs on a simulated pool of the local cluster.
Executors export no metrics, so there is nothing of theirs to scrape. Then every dashboard query
and every recording rule is evaluated through Prometheus' HTTP query API: each must parse and
return at least one series, and every metric they name must be one the components export.

``LLMBATCH_OBSERVABILITY_PLOTS=docs/img`` also writes the docs' PNGs from this run
(hack/prometheus/plot_panels.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import openai
import pytest
import yaml

from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
from tests.fixtures.gateway import (
    GatewayProcess,
    free_port,
    wait_for_key,
)
from tests.fixtures.operator import (
    ROOT,
    WORKER_NAMESPACE,
    ClusterCLI,
    OperatorProcess,
    simulated_pool,
)
from tests.integration.test_operator import (
    _POOLS,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    wait_for,
    wait_status,
)

sys.path.insert(0, str(ROOT / "hack" / "prometheus"))
from promql import RULES, PrometheusAPI, metric_names, panel_queries, rules

pytestmark = pytest.mark.timeout(600)
CHAT = "/v1/chat/completions"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing: `make prometheus` installs it (make test does)")
        pytest.skip("prometheus is missing: run `make prometheus`")
    return path


class Prometheus:
    """The prometheus binary on a temp config and data dir."""

    def __init__(self, workdir: pathlib.Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = PrometheusAPI(self.url)
        rules_file = workdir / "rules.yaml"
        groups = yaml.safe_load(RULES.read_text())["groups"]
        for group in groups:
            group["interval"] = "1s"  # the chart's 30 s would leave a short run without samples
        rules_file.write_text(yaml.safe_dump({"groups": groups}))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_file)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.logfile = workdir / "prometheus.log"

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.logfile.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError("prometheus not ready")

    def targets_up(self) -> dict[str, float]:
        return {s["metric"]["job"]: float(s["value"][1]) for s in self.api.query("up")}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def make_tenant(gateway: GatewayProcess) -> tuple[str, openai.OpenAI]:
    namespace = f"obs-{uuid.uuid4().hex[:8]}"
    gateway.kubectl(
        "apply",
        "-f",
        "-",
        obj={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    # An account, so the batch is charged (llmbatch_credits_charged_total).
    gateway.kubectl(
        "apply",
        "-f",
        "-",
        obj={
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "CreditAccount",
            "metadata": {"name": "default", "namespace": namespace},
            "spec": {"limit": "1000"},
        },
    )
    key = new_api_key()
    secret = key_secret(
        f"key-{namespace}",
        hash_key(key),
        namespace,
        ["inference:write", "inference:read"],
        gateway.gateway_namespace,
    )
    gateway.kubectl("apply", "-f", "-", obj=secret)
    wait_for_key(gateway.base_url, key, accepted=True)
    return namespace, openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)


def requests_file(model: str, n: int) -> bytes:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Summarize ticket {i}."}],
                "max_tokens": 8,
            },
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def evaluate(api: PrometheusAPI, expr: str) -> str | None:
    """None when ``expr`` parses and returns a series, else why not."""
    try:
        result = api.query(expr)
    except ValueError as err:
        return f"does not parse or evaluate: {err}"
    return None if result else "returned no series"


def test_dashboard_and_rules_against_a_real_prometheus(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    gateway: GatewayProcess,
    tmp_path: pathlib.Path,
) -> None:
    prom = Prometheus(
        tmp_path,
        {
            "operator": f"127.0.0.1:{operator_process.metrics_port}",
            "gateway": f"127.0.0.1:{gateway.metrics_port}",
        },
    )
    try:
        prom.wait_ready()
        started = time.time()
        pool, model = f"pool-{uuid.uuid4().hex[:8]}", f"obs-model-{uuid.uuid4().hex[:6]}"
        _POOLS.append(pool)
        apply(
            cluster,
            tmp_path,
            simulated_pool(
                pool,
                model,
                maxSlots=2,
                shardRequests=10,
                throughputPerSlot="5",
                tiers={
                    "standard": {
                        "drainTargetSeconds": 3600,
                        "pricing": {"inputPerMillion": "1000", "outputPerMillion": "2000"},
                    }
                },
                executor={
                    "engineArgs": ["--latency-seconds=0.3", "--max-num-seqs=2"],
                    "env": [{"name": "LLMBATCH_LOG_FORMAT", "value": "json"}],
                },
            ),
        )
        namespace, client = make_tenant(gateway)
        # Some errors for the error panels: an unknown batch (404) and a bad key (401).
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_" + "0" * 32)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=gateway.base_url + "/v1", api_key="sk-llmb-wrong", max_retries=0
            ).models.list()
        uploaded = client.files.create(file=("r.jsonl", requests_file(model, 60)), purpose="batch")
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h"
        )
        name = "batch-" + created.id.removeprefix("batch_")

        def executor_json_log() -> dict[str, Any] | None:
            """A JSON line of a running shard pod that names the batch and the shard."""
            out = cluster.kubectl(
                "logs",
                "-n",
                WORKER_NAMESPACE,
                "-l",
                f"llmbatch.io/pool={pool}",
                "--tail=50",
                check=False,
            )
            for line in out.splitlines():
                if line.startswith("{"):
                    record = json.loads(line)
                    if record.get("batch_id") == created.id and "shard" in record:
                        return dict(record)
            return None

        record = wait_for(executor_json_log, 120, "a JSON log line of an executor pod")
        assert record["logger"].startswith("llmbatch")
        # Poll through the gateway as a client does: steady traffic for the gateway panels.
        deadline = time.monotonic() + 300
        while client.batches.retrieve(created.id).status != "completed":
            assert time.monotonic() < deadline, "batch not completed in 300 s"
            time.sleep(0.5)
        done = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=60)
        assert done["status"]["requestCounts"]["completed"] == 60
        client.files.content(done["status"]["outputFileID"]).read()
        # A few more scrapes and rule evaluations after the end.
        time.sleep(8)
        assert prom.targets_up() == {"operator": 1.0, "gateway": 1.0}

        exported = prom.api.metric_names()
        problems: list[str] = []
        exprs = [(f"panel {title!r}", expr) for title, _, expr in panel_queries()]
        exprs += [(f"rule {r['record']}", r["expr"]) for r in rules() if "record" in r]
        for what, expr in exprs:
            for metric in sorted(metric_names(expr)):
                if not any(n == metric or n.startswith(metric + "_") for n in exported):
                    problems.append(f"{what}: names {metric}, which nothing exports")
            why = evaluate(prom.api, expr)
            if why:
                problems.append(f"{what}: {why}\n    {expr}")
        # The alerts' expressions parse too (they need not fire on a healthy run).
        for rule in rules():
            if "alert" in rule:
                try:
                    prom.api.query(rule["expr"])
                except ValueError as err:
                    problems.append(f"alert {rule['alert']}: {err}")
        assert not problems, "\n".join(problems)
        # A sanity check of the numbers, not only their presence.
        processed = prom.api.query(
            f'sum(llmbatch_pool_requests_processed_total{{pool="{pool}",outcome="completed"}})'
        )
        assert float(processed[0]["value"][1]) == 60

        plots = os.environ.get("LLMBATCH_OBSERVABILITY_PLOTS")
        if plots:
            from plot_panels import plot

            plot(prom.api, started, time.time(), (ROOT / plots).resolve())
    finally:
        prom.stop()
