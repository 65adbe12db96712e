"""``llmbatch gateway``: serve the OpenAI-compatible Files / Batches / Models API."""

from __future__ import annotations

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
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    envvar="LLMBATCH_GATEWAY_METRICS_PORT",
    default=None,
    help="Port of the Prometheus /metrics listener, on --host (default 9090; 0: none; never the "
    "API port); env LLMBATCH_GATEWAY_METRICS_PORT.",
)
@click.option(
    "--docs",
    is_flag=True,
    default=False,
    help="Serve /docs, /redoc and /openapi.json (off by default); env LLMBATCH_GATEWAY_DOCS=true.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="uvicorn worker processes; more than one needs --metrics-port 0 (metrics live per "
    "process: scale with replicas instead).",
)
@click.option("--log-level", default="info", show_default=True)
def gateway(
    host: str,
    port: int,
    store_uri: str | None,
    gateway_namespace: str | None,
    kubeconfig: str | None,
    max_upload_bytes: int | None,
    metrics_port: int | None,
    docs: bool,
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
    if metrics_port is not None:
        os.environ["LLMBATCH_GATEWAY_METRICS_PORT"] = str(metrics_port)
    if docs:
        os.environ["LLMBATCH_GATEWAY_DOCS"] = "true"
    os.environ.setdefault("LLMBATCH_GATEWAY_METRICS_HOST", host)
    from llmbatch.gateway.settings import GatewaySettings

    try:
        settings = GatewaySettings.from_env()  # fail fast on bad settings, before binding ports
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if workers > 1 and settings.metrics_port:
        raise click.UsageError(
            "--workers above 1 needs LLMBATCH_GATEWAY_METRICS_PORT=0: every worker process "
            "has its own metrics and one port cannot serve them all (scale with replicas)."
        )
    if settings.metrics_port == port:
        raise click.UsageError(f"the metrics port must not be the API port ({port})")
    import uvicorn

    from llmbatch import logs

    logs.configure(log_level)
    from uvicorn.config import LOGGING_CONFIG

    log_config = logs.uvicorn_log_config() or LOGGING_CONFIG
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
        log_config=log_config,
    )
