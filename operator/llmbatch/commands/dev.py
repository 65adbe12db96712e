"""``llmbatch dev up | down | status``: a local Kubernetes cluster with process-based GPU nodes.

State lives in ``.devcluster/`` (kubeconfig at ``.devcluster/kubeconfig``). Later features plug
their processes (operator, gateway, …) in by adding a factory to ``COMPONENTS``.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import click

from llmbatch.commands import devstack
from llmbatch.devcluster import ClusterConfig, ComponentSpec, DevCluster, DevClusterError, gpu_nodes
from llmbatch.devcluster.controlplane import kubectl_binary

DEFAULT_STATE_DIR = Path(".devcluster")


# name -> factory of the component's spec, given the state dir. Started in this order after the
# cluster is ready; `llmbatch dev up --skip NAME` leaves one out.
def _fixed(spec: ComponentSpec) -> Callable[[Path], ComponentSpec]:
    def factory(_state_dir: Path) -> ComponentSpec:
        return spec

    return factory


COMPONENTS: dict[str, Callable[[Path], ComponentSpec]] = {
    name: _fixed(spec) for name, spec in devstack.components().items()
}

_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Where the cluster keeps its kubeconfig, logs and pod files.",
)


@click.group()
def dev() -> None:
    """A local Kubernetes control plane whose GPU nodes run pods as processes."""


@dev.command()
@_state_dir_option
@click.option("--nodes", default=2, show_default=True, help="Number of GPU nodes.")
@click.option("--gpus", default=8, show_default=True, help="nvidia.com/gpu per node.")
@click.option("--skip", multiple=True, help="Do not start this component (repeatable).")
@click.option(
    "--component",
    "extra",
    multiple=True,
    metavar="NAME=COMMAND",
    help="Also run COMMAND (shell words; {kubeconfig} {state_dir} {python} expand) as NAME.",
)
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for Ready.")
def up(
    state_dir: Path,
    nodes: int,
    gpus: int,
    skip: tuple[str, ...],
    extra: tuple[str, ...],
    timeout: float,
) -> None:
    """Start the cluster in the background."""
    components = [factory(state_dir) for name, factory in COMPONENTS.items() if name not in skip]
    for item in extra:
        name, sep, command = item.partition("=")
        if not sep or not name or not command:
            raise click.BadParameter(
                f"expected NAME=COMMAND, got {item!r}", param_hint="--component"
            )
        components.append(ComponentSpec(name=name, command=shlex.split(command)))
    (state_dir / "setup.done").unlink(missing_ok=True)
    cfg = ClusterConfig(
        state_dir=state_dir.resolve(),
        nodes=gpu_nodes(nodes, gpus=gpus),
        components=components,
    )
    began = time.monotonic()
    try:
        cluster = DevCluster.start(cfg, detach=True, timeout=timeout)
    except DevClusterError as err:
        raise click.ClickException(str(err)) from err
    kubeconfig = cluster.kubeconfig
    try:
        shown = kubeconfig.relative_to(Path.cwd())
    except ValueError:
        shown = kubeconfig
    click.echo(f"dev cluster ready in {time.monotonic() - began:.1f}s ({nodes} GPU nodes)")
    click.echo(f"  {kubectl_binary()} --kubeconfig {shown} get nodes")
    click.echo(f"  export KUBECONFIG={kubeconfig}")
    env_file = state_dir / devstack.DEMO_ENV_FILE
    if "gateway" not in skip and env_file.exists():
        click.echo(
            f"gateway: http://127.0.0.1:{devstack.GATEWAY_PORT}/v1 (tenant "
            f"{devstack.DEMO_TENANT}); `source {env_file}` sets OPENAI_BASE_URL and "
            "OPENAI_API_KEY"
        )
    click.echo("stop it with: llmbatch dev down")


@dev.command()
@_state_dir_option
def down(state_dir: Path) -> None:
    """Stop the cluster and every process it started."""
    cluster = DevCluster(state_dir.resolve())
    if cluster.stop():
        click.echo("dev cluster stopped")
    else:
        click.echo("no dev cluster running")


@dev.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(state_dir: Path, as_json: bool) -> None:
    """Show whether the cluster runs, its API server and nodes."""
    data = DevCluster(state_dir.resolve()).status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if not data.get("running"):
        click.echo("dev cluster: not running")
        raise SystemExit(1)
    click.echo(f"dev cluster: {data.get('state')} (supervisor pid {data.get('pid')})")
    click.echo(f"  server:     {data.get('server')}")
    click.echo(f"  kubeconfig: {data.get('kubeconfig')}")
    click.echo(f"  nodes:      {', '.join(data.get('nodes') or [])}")
    restarts = data.get("restarts") or {}
    if restarts.get("node-agent"):
        click.echo(f"  node agent: restarted {restarts['node-agent']} times")
    for name, pid in (data.get("components") or {}).items():
        state = f"pid {pid}" if pid else "restarting"
        click.echo(f"  component:  {name} ({state}, restarts {restarts.get(name, 0)})")


dev.add_command(devstack.setup_command)
