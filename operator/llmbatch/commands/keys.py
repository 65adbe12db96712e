"""``llmbatch keys``: create, list and revoke gateway API keys (Secrets holding only hashes)."""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import click

_DEFAULT_SCOPES = "inference:write,inference:read"


async def _core(kubeconfig: str | None):  # type: ignore[no-untyped-def]
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=cfg
        )
    api = client.ApiClient(configuration=cfg)
    return api, client.CoreV1Api(api)


def _gateway_namespace(value: str | None) -> str:
    return value or os.environ.get("LLMBATCH_GATEWAY_NAMESPACE") or "llmbatch-system"


@click.group()
def keys() -> None:
    """Manage gateway API keys (stored as SHA-256 hashes in labelled Secrets)."""


_kubeconfig = click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Kubeconfig to use (default: in-cluster, then $KUBECONFIG).",
)
_gw_ns = click.option(
    "--gateway-namespace",
    default=None,
    help="Namespace of the key Secrets (default: $LLMBATCH_GATEWAY_NAMESPACE or llmbatch-system).",
)


@keys.command("create")
@click.option("--namespace", required=True, help="The tenant namespace the key acts in.")
@click.option(
    "--scopes",
    default=_DEFAULT_SCOPES,
    show_default=True,
    help="Comma list of inference:write, inference:read.",
)
@click.option("--name", default=None, help="Secret name (default: llmb-key-<random>).")
@_gw_ns
@_kubeconfig
def create(
    namespace: str,
    scopes: str,
    name: str | None,
    gateway_namespace: str | None,
    kubeconfig: str | None,
) -> None:
    """Create a key for a tenant namespace and print it (shown only this once)."""
    from llmbatch.gateway.auth import KNOWN_SCOPES, hash_key, key_secret, new_api_key

    wanted = [s.strip() for s in scopes.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in KNOWN_SCOPES]
    if unknown or not wanted:
        raise click.BadParameter(
            f"unknown scopes {unknown}; choose from {', '.join(KNOWN_SCOPES)}",
            param_hint="--scopes",
        )
    key = new_api_key()
    secret_name = name or f"llmb-key-{secrets.token_hex(4)}"

    async def run() -> None:
        api, core = await _core(kubeconfig)
        try:
            uid = await _namespace_uid(core, namespace)
            body = key_secret(
                secret_name,
                hash_key(key),
                namespace,
                wanted,
                _gateway_namespace(gateway_namespace),
                namespace_uid=uid,
            )
            await core.create_namespaced_secret(_gateway_namespace(gateway_namespace), body)
        finally:
            await api.close()

    asyncio.run(run())
    click.echo(key)
    click.echo(
        f"created Secret {_gateway_namespace(gateway_namespace)}/{secret_name} for namespace "
        f"{namespace} ({','.join(wanted)}); the key is not stored and cannot be shown again",
        err=True,
    )


async def _namespace_uid(core: Any, namespace: str) -> str:
    """The UID of the tenant namespace a key is made for (the key acts only for that one)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        found = await core.read_namespace(namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise click.ClickException(
                f"namespace {namespace} does not exist: create it first (a key is bound to "
                "its namespace's UID and stops working when that namespace is deleted)"
            ) from exc
        raise
    return str(found.metadata.uid)


@keys.command("list")
@_gw_ns
@_kubeconfig
def list_keys(gateway_namespace: str | None, kubeconfig: str | None) -> None:
    """List key Secrets: name, tenant namespace, scopes, the namespace UID it is bound to
    (never the key; ``unbound``: made before keys were bound, bound at its first use)."""
    from llmbatch.gateway.auth import UID_FIELD
    from llmbatch.gateway.kube import KEY_LABEL, decode_secret_data

    async def run() -> None:
        api, core = await _core(kubeconfig)
        try:
            listing = await core.list_namespaced_secret(
                _gateway_namespace(gateway_namespace), label_selector=f"{KEY_LABEL}=true"
            )
            for item in listing.items:
                data = decode_secret_data(api.sanitize_for_serialization(item))
                click.echo(
                    f"{item.metadata.name}\t{data.get('namespace', '?')}\t"
                    f"{data.get('scopes', '')}\t{data.get(UID_FIELD) or 'unbound'}"
                )
        finally:
            await api.close()

    asyncio.run(run())


@keys.command("revoke")
@click.argument("name")
@_gw_ns
@_kubeconfig
def revoke(name: str, gateway_namespace: str | None, kubeconfig: str | None) -> None:
    """Revoke a key by deleting its Secret (the gateway stops accepting it within seconds).

    Only an API key's Secret is deleted: any other Secret of that name is refused, untouched.
    """
    namespace = _gateway_namespace(gateway_namespace)

    async def run() -> None:
        from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions
        from kubernetes_asyncio.client.exceptions import ApiException

        from llmbatch.gateway.auth import is_key_secret

        api, core = await _core(kubeconfig)
        try:
            try:
                found = await core.read_namespaced_secret(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    raise click.ClickException(f"no key {name} in namespace {namespace}") from exc
                raise
            if not is_key_secret(api.sanitize_for_serialization(found)):
                raise click.ClickException(
                    f"Secret {namespace}/{name} is not an llmbatch API key (no "
                    "llmbatch.io/api-key=true label with a key's data): not deleted"
                )
            meta = found.metadata
            # only the Secret just checked: not one put in its place meanwhile
            only = V1Preconditions(uid=meta.uid, resource_version=meta.resource_version)
            await core.delete_namespaced_secret(
                name, namespace, body=V1DeleteOptions(preconditions=only)
            )
        finally:
            await api.close()

    asyncio.run(run())
    click.echo(f"revoked {name}", err=True)
