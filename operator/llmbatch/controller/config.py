"""Operator settings, read once from the environment (the Helm chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from llmbatch.api.shard import RemoteMedia
from llmbatch.core.netguard import IPNetwork, parse_networks
from llmbatch.core.offboarding import DEFAULT_GRACE_SECONDS
from llmbatch.core.quotas import DEFAULT_MAX_WAITING_BATCHES, TenantCaps
from llmbatch.core.retention import RetentionPolicy
from llmbatch.core.webhooks import RetryPolicy


def _float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


@dataclass(frozen=True)
class WebhookConfig:
    """Deliveries of batch webhooks (docs/webhooks.md)."""

    enabled: bool = True
    """Deliver events to BatchWebhooks (LLMBATCH_WEBHOOKS=false: none)."""
    allowed_networks: tuple[IPNetwork, ...] = ()
    """Non-public networks deliveries may reach (LLMBATCH_WEBHOOK_ALLOWED_NETWORKS, CIDRs);
    empty: public addresses only."""
    concurrency: int = 8
    """Batches whose deliveries run at once (LLMBATCH_WEBHOOK_CONCURRENCY)."""
    timeout: float = 10.0
    """Seconds per attempt: connect, send, answer (LLMBATCH_WEBHOOK_TIMEOUT)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff (LLMBATCH_WEBHOOK_RETRY_BASE / _RETRY_MAX / _RETRY_FOR seconds)."""

    @classmethod
    def from_env(cls) -> WebhookConfig:
        """Read the LLMBATCH_WEBHOOK* variables."""
        try:
            networks = parse_networks(os.environ.get("LLMBATCH_WEBHOOK_ALLOWED_NETWORKS", ""))
        except ValueError as exc:
            raise SystemExit(f"LLMBATCH_WEBHOOK_ALLOWED_NETWORKS: {exc}") from exc
        default = RetryPolicy()
        return cls(
            enabled=os.environ.get("LLMBATCH_WEBHOOKS", "true").lower() != "false",
            allowed_networks=networks,
            concurrency=max(1, int(os.environ.get("LLMBATCH_WEBHOOK_CONCURRENCY", "8"))),
            timeout=_float("LLMBATCH_WEBHOOK_TIMEOUT", 10.0),
            retry=RetryPolicy(
                base=_float("LLMBATCH_WEBHOOK_RETRY_BASE", default.base),
                cap=_float("LLMBATCH_WEBHOOK_RETRY_MAX", default.cap),
                retry_for=_float("LLMBATCH_WEBHOOK_RETRY_FOR", default.retry_for),
            ),
        )


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator needs besides the cluster it talks to."""

    store_uri: str
    """Store the operator reads inputs from and writes results to."""
    executor_store_uri: str
    """The same store as executor pods reach it (another endpoint, when theirs differs)."""
    executor_store_secret: str | None = None
    """Secret in the worker namespace whose keys become the environment of executor pods (the
    store credentials), for pools that name none in ``executor.storeSecretName``."""
    executor_command: tuple[str, ...] = ("python", "-m", "llmbatch.executor")
    """Command of the executor container."""
    reconcile_interval: float = 2.0
    """Seconds between rounds of a pool with nothing waiting (a batch is reconciled when it
    changes, not on an interval: ``resync_seconds``)."""
    reconcile_workers: int = 16
    """Batches reconciled at once (the work queue's workers)."""
    resync_seconds: float = 600.0
    """The safety resync: a batch nothing happened to is reconciled again after this long
    (±20 %, so a backlog spreads out)."""
    startup_spread_seconds: float = 60.0
    """A restarted operator spreads the resync of the batches it finds running over this long
    (new, cancelled and stopping batches are served at once)."""
    progress_interval: float = 5.0
    """At most one progress status patch per batch this often."""
    metrics_port: int = 8080
    """Port of /metrics (0: off)."""
    tenant_metrics: bool = False
    """Series per tenant (pool seats and fair share, the 20 tenants each pool's status lists):
    LLMBATCH_METRICS_TENANT_LABELS=true; off by default, tenants being unbounded."""
    slot_heartbeat_seconds: float = 5.0
    """How often a slot renews its leases (its heartbeat)."""
    slot_lease_seconds: float = 30.0
    """A slot whose heartbeat has not changed for this long is lost: its shards go back to
    the queue (under a new lease generation) and its Job is deleted."""
    slot_poll_seconds: float = 0.5
    """How often a slot looks for new or revoked assignments."""
    slot_start_seconds: float = 900.0
    """A slot Job whose pod has sent no heartbeat this long (time the operator could see) is
    removed and its shards go back to the queue without an attempt: its image cannot be
    pulled, a Secret it mounts is missing, no node can meet its GPU request. Long enough for a
    node to be added and an image of many GB pulled; its pod's waiting reason is a Warning
    Event on the pool and on the batches waiting for it long before."""
    slot_job_listing_seconds: float = 1.0
    """A pool round reuses its listing of the pool's slot Jobs this long, and up to half as
    long again while it is listed anew in the background (``SlotFleet.jobs``); 0: every round
    lists them. A slot Job this operator creates or deletes is listed again at once."""
    priority_class_prefix: str | None = None
    """When set, shard pods get PriorityClass ``<prefix>-<tier>``."""
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    """File retention defaults (pools override them with ``spec.retention``)."""
    retention_interval: float = 60.0
    """Seconds between retention sweeps and offboarding passes (0: neither)."""
    tenant_grace_seconds: int = DEFAULT_GRACE_SECONDS
    """A deleted tenant namespace's data in the store (archived batches, file bytes, inline
    inputs, work areas) is erased this long after the deletion (``core.offboarding``)."""
    credit_repair_interval: float = 30.0
    """Seconds between upkeep passes over the CreditAccounts (0: none)."""
    peering: str = "llmbatch"
    """kopf peering name; replicas with the same name never act at once."""
    peering_lifetime: int = 20
    """Seconds a replica's peering entry lives without a keep-alive. kopf pauses a replica while
    another live entry of the same priority exists, so a replica that died without removing its
    entry (SIGKILL, a lost node) holds off its replacement this long; kopf's default of 60 s is
    most of the restart budget (docs/operations.md). Keep-alives go every lifetime - 5..10 s."""
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    """Namespaces to watch; empty: the whole cluster."""
    pools: tuple[str, ...] = field(default_factory=tuple)
    """BatchPools this operator schedules and accepts batches into; empty: every pool. Several
    operators on disjoint tenant sets need disjoint pools too (docs/sizing.md)."""
    webhooks: WebhookConfig = field(default_factory=WebhookConfig)
    """Batch webhook deliveries."""
    remote_media: bool = False
    """Rows may give images and audio as http(s) URLs the executors fetch through their address
    guard (LLMBATCH_REMOTE_MEDIA=true; the chart's ``remoteMedia.enabled`` also opens the
    executors' egress); off: data: URLs only, a remote one fails validation with the line's
    number."""
    remote_fetch: RemoteMedia = field(default_factory=RemoteMedia)
    """How the executors fetch remote media: LLMBATCH_REMOTE_MEDIA_MAX_BYTES,
    LLMBATCH_REMOTE_MEDIA_TIMEOUT, LLMBATCH_REMOTE_MEDIA_ALLOWED_NETWORKS (CIDRs of non-public
    networks they may reach)."""
    max_waiting_batches: int = DEFAULT_MAX_WAITING_BATCHES
    """A tenant's accepted unfinished batches at most, unless its namespace's
    ``llmbatch.io/max-waiting-batches`` says otherwise (LLMBATCH_MAX_WAITING_BATCHES, 0: no
    default cap): a batch past it fails validation with ``too_many_batches``."""

    @property
    def tenant_caps(self) -> TenantCaps:
        """The caps of a tenant whose namespace sets none (stored bytes are the gateway's)."""
        return TenantCaps.defaults(self.max_waiting_batches, 0)

    @classmethod
    def from_env(cls) -> OperatorConfig:
        store = os.environ.get("LLMBATCH_STORE_URI")
        if not store:
            raise SystemExit("LLMBATCH_STORE_URI is required (file:///path or s3://bucket/...)")
        command = os.environ.get("LLMBATCH_EXECUTOR_COMMAND")
        namespaces = os.environ.get("LLMBATCH_NAMESPACES", "")
        return cls(
            store_uri=store,
            executor_store_uri=os.environ.get("LLMBATCH_EXECUTOR_STORE_URI") or store,
            executor_store_secret=os.environ.get("LLMBATCH_EXECUTOR_STORE_SECRET") or None,
            executor_command=tuple(command.split()) if command else cls.executor_command,
            reconcile_interval=_float("LLMBATCH_RECONCILE_INTERVAL", 2.0),
            reconcile_workers=int(_float("LLMBATCH_RECONCILE_WORKERS", cls.reconcile_workers)),
            resync_seconds=_float("LLMBATCH_RESYNC_SECONDS", 600.0),
            startup_spread_seconds=_float("LLMBATCH_STARTUP_SPREAD_SECONDS", 60.0),
            progress_interval=_float("LLMBATCH_PROGRESS_INTERVAL", 5.0),
            metrics_port=int(os.environ.get("LLMBATCH_METRICS_PORT", "8080")),
            tenant_metrics=os.environ.get("LLMBATCH_METRICS_TENANT_LABELS", "").lower() == "true",
            slot_heartbeat_seconds=_float("LLMBATCH_SLOT_HEARTBEAT_SECONDS", 5.0),
            slot_lease_seconds=_float("LLMBATCH_SLOT_LEASE_SECONDS", 30.0),
            slot_poll_seconds=_float("LLMBATCH_SLOT_POLL_SECONDS", 0.5),
            slot_start_seconds=_float("LLMBATCH_SLOT_START_SECONDS", 900.0),
            slot_job_listing_seconds=_float("LLMBATCH_SLOT_JOB_LISTING_SECONDS", 1.0),
            priority_class_prefix=os.environ.get("LLMBATCH_PRIORITY_CLASS_PREFIX") or None,
            credit_repair_interval=_float("LLMBATCH_CREDIT_REPAIR_INTERVAL", 30.0),
            peering=os.environ.get("LLMBATCH_PEERING", "llmbatch"),
            peering_lifetime=max(10, int(_float("LLMBATCH_PEERING_LIFETIME", 20))),
            retention=_retention_from_env(),
            retention_interval=_float("LLMBATCH_RETENTION_INTERVAL", 60.0),
            tenant_grace_seconds=_seconds(
                "LLMBATCH_RETENTION_DELETED_TENANT_SECONDS", DEFAULT_GRACE_SECONDS, minimum=0
            ),
            namespaces=tuple(n for n in namespaces.split(",") if n),
            pools=tuple(p for p in os.environ.get("LLMBATCH_POOLS", "").split(",") if p),
            webhooks=WebhookConfig.from_env(),
            remote_media=os.environ.get("LLMBATCH_REMOTE_MEDIA", "").lower() == "true",
            remote_fetch=_remote_fetch_from_env(),
            max_waiting_batches=_seconds(
                "LLMBATCH_MAX_WAITING_BATCHES", DEFAULT_MAX_WAITING_BATCHES, minimum=0
            ),
        )


def _remote_fetch_from_env() -> RemoteMedia:
    default = RemoteMedia()
    networks = os.environ.get("LLMBATCH_REMOTE_MEDIA_ALLOWED_NETWORKS", "")
    try:
        parse_networks(networks)
    except ValueError as exc:
        raise SystemExit(f"LLMBATCH_REMOTE_MEDIA_ALLOWED_NETWORKS: {exc}") from exc
    return RemoteMedia(
        max_bytes=int(_float("LLMBATCH_REMOTE_MEDIA_MAX_BYTES", default.max_bytes)),
        timeout_seconds=_float("LLMBATCH_REMOTE_MEDIA_TIMEOUT", default.timeout_seconds),
        allowed_networks=[n.strip() for n in networks.split(",") if n.strip()],
    )


def _seconds(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SystemExit(f"{name} must be a whole number of seconds, got {raw!r}") from exc
    if value < minimum:
        raise SystemExit(f"{name} must be at least {minimum}, got {value}")
    return value


def _retention_from_env() -> RetentionPolicy:
    default = RetentionPolicy()
    return RetentionPolicy(
        unused_input_seconds=_seconds(
            "LLMBATCH_RETENTION_UNUSED_INPUT_SECONDS", default.unused_input_seconds
        ),
        accepted_input_seconds=_seconds(
            "LLMBATCH_RETENTION_ACCEPTED_INPUT_SECONDS", default.accepted_input_seconds
        ),
        input_after_batch_seconds=_seconds(
            "LLMBATCH_RETENTION_INPUT_AFTER_BATCH_SECONDS",
            default.input_after_batch_seconds,
            minimum=0,
        ),
        output_seconds=_seconds("LLMBATCH_RETENTION_OUTPUT_SECONDS", default.output_seconds),
        batch_seconds=_batch_seconds(),
    )


def _batch_seconds() -> int | None:
    """``LLMBATCH_RETENTION_BATCH_SECONDS``: unset or -1, a finished Batch leaves the API
    server when its results expire; else this many seconds after it finished."""
    seconds = _seconds("LLMBATCH_RETENTION_BATCH_SECONDS", -1, minimum=-1)
    return None if seconds < 0 else seconds
