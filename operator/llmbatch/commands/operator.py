"""``llmbatch operator``: run the kopf operator."""

from __future__ import annotations

import logging
import os

import click


@click.command()
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Kubeconfig to use (default: in-cluster, then $KUBECONFIG).",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve only the Batches of these tenant namespaces (default: $LLMBATCH_NAMESPACES, "
    "comma-separated, else every namespace).",
)
@click.option("--standalone", is_flag=True, help="Skip peering (a single replica, no peers).")
@click.option(
    "--liveness-port",
    type=int,
    default=8081,
    show_default=True,
    help="Port of the /healthz liveness endpoint (0: off).",
)
@click.option("--verbose", is_flag=True, help="Debug logging.")
def operator(
    kubeconfig: str | None,
    namespaces: tuple[str, ...],
    standalone: bool,
    liveness_port: int,
    verbose: bool,
) -> None:
    """Run the operator (settings from LLMBATCH_* environment variables; see docs/operations.md)."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(kubeconfig)
    if namespaces:  # one setting for the Batch handlers, the retention sweep and credit upkeep
        os.environ["LLMBATCH_NAMESPACES"] = ",".join(namespaces)
    import kopf

    import llmbatch.controller.handlers  # noqa: F401  (registers the handlers)
    from llmbatch import logs

    logs.configure(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        # kopf logs every successful timer run at INFO: once a second per object.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Always cluster-wide: BatchPools are cluster-scoped and replicas meet in the
    # ClusterKopfPeering; LLMBATCH_NAMESPACES filters the Batch handlers instead.
    kopf.run(
        clusterwide=True,
        standalone=standalone,
        peering_name=os.environ.get("LLMBATCH_PEERING", "llmbatch"),
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )
