"""The local full stack on the dev cluster: CRDs, a demo pool and tenant, the operator, the gateway.

``llmbatch dev up`` starts these as supervisor components after the control plane is Ready:

1. ``setup`` applies the CRDs and kopf's peering object, creates the namespaces, a BatchPool
   serving SmolLM2 on the CPU vLLM engine, the tenant ``demo`` and an API key for it (written to
   ``<state_dir>/demo.env``), waits until the API server admits a Batch, then waits — it is the
   component the others start after;
2. ``operator`` — ``llmbatch operator`` with a filesystem store in ``<state_dir>/store``;
3. ``gateway`` — ``llmbatch gateway`` on http://127.0.0.1:8000 with the same store.

The ports (gateway 8000, its metrics 9090, the operator's metrics 9464 and health 9465) can be
moved with ``LLMBATCH_DEV_GATEWAY_PORT``, ``LLMBATCH_DEV_GATEWAY_METRICS_PORT``,
``LLMBATCH_DEV_OPERATOR_METRICS_PORT`` and ``LLMBATCH_DEV_OPERATOR_HEALTH_PORT``.

Shard pods are local processes on the same machine, so operator, gateway and executors share
the filesystem store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from llmbatch.devcluster import ComponentSpec, kubectl_binary, repo_root

SYSTEM_NAMESPACE = "llmbatch-system"
WORKER_NAMESPACE = "llmbatch-workers"
DEMO_TENANT = "demo"
DEMO_POOL = "smollm2-cpu"


def _port(name: str, default: int) -> int:
    """A stack port: ``$LLMBATCH_DEV_<NAME>_PORT`` or the default (to run a second stack, e.g.
    the crash sweep's, beside a user's ``dev up``)."""
    return int(os.environ.get(f"LLMBATCH_DEV_{name}_PORT") or default)


GATEWAY_PORT = _port("GATEWAY", 8000)
OPERATOR_METRICS_PORT = _port("OPERATOR_METRICS", 9464)
OPERATOR_HEALTH_PORT = _port("OPERATOR_HEALTH", 9465)
GATEWAY_METRICS_PORT = _port("GATEWAY_METRICS", 9090)
PRIORITY_CLASS_PREFIX = "llmbatch"
DEMO_ENV_FILE = "demo.env"
CPU_ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}


def store_uri(state_dir: str) -> str:
    return f"file://{Path(state_dir).resolve()}/store"


@dataclass(frozen=True)
class StackPorts:
    """The stack's fixed ports on 127.0.0.1 (tests pick free ones, to run beside a `dev up`)."""

    gateway: int = GATEWAY_PORT
    gateway_metrics: int = GATEWAY_METRICS_PORT
    operator_metrics: int = OPERATOR_METRICS_PORT
    operator_health: int = OPERATOR_HEALTH_PORT


DEFAULT_PORTS = StackPorts()
_STORE = "file://{state_dir}/store"  # expanded by the supervisor


def components(ports: StackPorts = DEFAULT_PORTS) -> dict[str, ComponentSpec]:
    """The stack's components, in start order (``{python}`` etc. expand in the supervisor)."""
    return {
        "setup": _setup_component(ports),
        "operator": _operator_component(ports),
        "gateway": _gateway_component(ports),
    }


def _llmbatch(*args: str) -> list[str]:
    return ["{python}", "-m", "llmbatch", *args]


def _setup_component(ports: StackPorts) -> ComponentSpec:
    return ComponentSpec(
        name="setup",
        command=_llmbatch(
            "dev",
            "setup",
            "--state-dir",
            "{state_dir}",
            "--kubeconfig",
            "{kubeconfig}",
            "--gateway-port",
            str(ports.gateway),
            "--hold",
        ),
        ready_file="{state_dir}/setup.done",
        ready_timeout=120,
    )


def _operator_component(ports: StackPorts) -> ComponentSpec:
    return ComponentSpec(
        name="operator",
        command=_llmbatch(
            "operator",
            "--kubeconfig",
            "{kubeconfig}",
            "--liveness-port",
            str(ports.operator_health),
        ),
        env={
            "LLMBATCH_STORE_URI": _STORE,
            "LLMBATCH_METRICS_PORT": str(ports.operator_metrics),
            "LLMBATCH_PRIORITY_CLASS_PREFIX": PRIORITY_CLASS_PREFIX,
        },
        ready_url=f"http://127.0.0.1:{ports.operator_health}/healthz",
        ready_timeout=90,
    )


def _gateway_component(ports: StackPorts) -> ComponentSpec:
    return ComponentSpec(
        name="gateway",
        command=_llmbatch(
            "gateway",
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.gateway),
            "--kubeconfig",
            "{kubeconfig}",
            "--store-uri",
            _STORE,
            "--gateway-namespace",
            SYSTEM_NAMESPACE,
            "--metrics-port",
            str(ports.gateway_metrics),
        ),
        ready_url=f"http://127.0.0.1:{ports.gateway}/healthz",
        ready_timeout=90,
    )


def demo_pool(model_folder: str, cache_dir: str) -> dict[str, Any]:
    """A one-slot pool serving SmolLM2 on the CPU vLLM engine."""
    env = [
        {"name": k, "value": v} for k, v in {**CPU_ENGINE_ENV, "LLMBATCH_CACHE": cache_dir}.items()
    ]
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchPool",
        "metadata": {"name": DEMO_POOL},
        "spec": {
            "models": [
                {
                    "name": "smollm2",
                    "source": model_folder,
                    # The prepared folder's package version and recipe, e.g. 0.1.2-fp32-r2.
                    "revision": Path(model_folder).name.removeprefix("smollm2-"),
                }
            ],
            "workerNamespace": WORKER_NAMESPACE,
            "gpusPerSlot": 1,
            "minSlots": 0,
            "maxSlots": 1,
            "shardRequests": 1000,
            "throughputPerSlot": "1",
            "limits": {"requireOutputTokenLimit": True},
            "executor": {
                "engine": "vllm",
                "env": env,
                "flushLines": 50,
                "flushSeconds": 2,
                "terminationGraceSeconds": 30,
            },
        },
    }


def priority_classes() -> list[dict[str, Any]]:
    """One PriorityClass per tier, as the Helm chart creates them (values.yaml priorityClasses)."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"{PRIORITY_CLASS_PREFIX}-{tier}"},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": f"Shard pods of {tier} batches (llm-batch-operator).",
        }
        for tier, value in (("expedited", 1000), ("standard", 500), ("flex", 100))
    ]


def _kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(kubectl_binary()), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise click.ClickException(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _apply(kubeconfig: str, *objects: dict[str, Any]) -> None:
    _kubectl(kubeconfig, "apply", "-f", "-", stdin="\n".join(json.dumps(o) for o in objects))


def wait_until_batches_admitted(kubeconfig: str, namespace: str, timeout: float = 60) -> None:
    """Return once the API server creates a Batch as the finalizer policy of ``crds/admission``
    has it: a server-side dry run comes back with the finalizer.

    A new policy takes effect from the server's own watch within a second; and for a few
    seconds after the CRDs are installed the policy's admission plugin, which learns a new
    kind's schema from ``/openapi/v3`` on a 5 s poll, refuses every Batch create with 503."""
    probe = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": "batch-admission-probe", "namespace": namespace},
        "spec": {"endpoint": "/v1/chat/completions", "inputFileID": "file-probe"},
    }
    dry_run = ("create", "--dry-run=server", "-o", "json", "-f", "-")
    deadline = time.monotonic() + timeout
    while True:
        try:
            out = _kubectl(kubeconfig, *dry_run, stdin=json.dumps(probe))
        except click.ClickException as exc:  # e.g. the 503
            why = exc.message
        else:
            if json.loads(out)["metadata"].get("finalizers"):
                return
            why = "created without the finalizer"
        if time.monotonic() > deadline:
            raise click.ClickException(f"no Batch admitted within {timeout:.0f} s: {why}")
        time.sleep(0.25)


def setup(state_dir: Path, kubeconfig: str, gateway_port: int = GATEWAY_PORT) -> Path:
    """Idempotently prepare the cluster for the demo; returns the env file with the key."""
    from llmbatch.executor.models import MODELS, cache_dir
    from llmbatch.gateway.auth import hash_key, key_secret, new_api_key

    # -R: the CRDs and crds/admission, the finalizer policy the chart installs on Kubernetes >= 1.36
    _kubectl(kubeconfig, "apply", "-R", "-f", str(repo_root() / "crds"))
    _kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/batches.llmbatch.io",
        "crd/batchfiles.llmbatch.io",
        "crd/batchpools.llmbatch.io",
        "crd/clusterkopfpeerings.kopf.dev",
    )
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        for name in (SYSTEM_NAMESPACE, WORKER_NAMESPACE, DEMO_TENANT)
    ]
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "llmbatch"},
    }
    model = MODELS["smollm2"]
    folder = str(model.folder()) if model.is_prepared() else "smollm2-not-prepared"
    _apply(
        kubeconfig, *namespaces, *priority_classes(), peering, demo_pool(folder, str(cache_dir()))
    )
    # "ready" means a client can create a batch: kubectl does not retry a 503
    wait_until_batches_admitted(kubeconfig, DEMO_TENANT)
    # A fresh key each time the stack starts (the previous cluster's Secrets are gone).
    key = new_api_key()
    secret = key_secret(
        "llmb-key-demo",
        hash_key(key),
        DEMO_TENANT,
        ["inference:write", "inference:read"],
        SYSTEM_NAMESPACE,
    )
    _apply(kubeconfig, secret)
    env_file = state_dir / DEMO_ENV_FILE
    env_file.write_text(
        f"export OPENAI_BASE_URL=http://127.0.0.1:{gateway_port}/v1\n"
        f"export OPENAI_API_KEY={key}\n"
        f"export KUBECONFIG={Path(kubeconfig).resolve()}\n"
    )
    env_file.chmod(0o600)
    return env_file


@click.command("setup")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option(
    "--gateway-port", default=GATEWAY_PORT, show_default=True, help="For OPENAI_BASE_URL."
)
@click.option("--hold", is_flag=True, help="Stay running until SIGTERM (as a dev up component).")
def setup_command(state_dir: Path, kubeconfig: str, gateway_port: int, hold: bool) -> None:
    """Apply CRDs, namespaces, the demo pool and a demo tenant key to the dev cluster."""
    done = state_dir / "setup.done"
    done.unlink(missing_ok=True)
    if hold:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    env_file = setup(state_dir, kubeconfig, gateway_port)
    done.write_text(str(env_file))
    click.echo(f"demo stack set up; credentials in {env_file}")
    if hold:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
