"""``llmbatch gateway``: serve the OpenAI-compatible Files / Batches / Models API."""

from __future__ import annotations

import logging
import os

import click


@click.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--store-uri",
    envvar="LLMBATCH_STORE_URI",
    default=None,
    help="Object store URI (file:///path or s3://bucket/...); env LLMBATCH_STORE_URI.",
)
@click.option(
    "--gateway-namespace",
    envvar="LLMBATCH_GATEWAY_NAMESPACE",
    default=None,
    help="Namespace of the API-key Secrets; env LLMBATCH_GATEWAY_NAMESPACE "
    "(default: the pod's namespace, else llmbatch-system).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Kubeconfig to use (default: in-cluster, then $KUBECONFIG).",
)
@click.option(
    "--max-upload-bytes",
    type=click.IntRange(min=1),
    envvar="LLMBATCH_GATEWAY_MAX_UPLOAD_BYTES",
    default=None,
    help="Largest accepted upload (default 256 MiB); env LLMBATCH_GATEWAY_MAX_UPLOAD_BYTES.",
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--log-level", default="info", show_default=True)
def gateway(
    host: str,
    port: int,
    store_uri: str | None,
    gateway_namespace: str | None,
    kubeconfig: str | None,
    max_upload_bytes: int | None,
    workers: int,
    log_level: str,
) -> None:
    """Run the gateway (settings from LLMBATCH_* variables; see docs/gateway.md)."""
    if store_uri:
        os.environ["LLMBATCH_STORE_URI"] = store_uri
    if gateway_namespace:
        os.environ["LLMBATCH_GATEWAY_NAMESPACE"] = gateway_namespace
    if kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(kubeconfig)
    if max_upload_bytes:
        os.environ["LLMBATCH_GATEWAY_MAX_UPLOAD_BYTES"] = str(max_upload_bytes)
    from llmbatch.gateway.settings import GatewaySettings

    try:
        GatewaySettings.from_env()  # fail fast on bad settings, before binding the port
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    import uvicorn

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    uvicorn.run(
        "llmbatch.gateway.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level.lower(),
        access_log=False,
        proxy_headers=True,
        timeout_keep_alive=75,  # longer than common load-balancer idle timeouts (60 s)
    )
