"""The API client's HTTP session reads the environment once (llmbatch.kube.client)."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from llmbatch.kube.client import _read_environment_once


def _session_of(host: str) -> tuple[client.ApiClient, client.Configuration]:
    cfg = client.Configuration()
    cfg.host = host
    return client.ApiClient(configuration=cfg), cfg


def test_the_session_does_not_read_netrc_and_proxies_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def main() -> None:
        api, cfg = _session_of("https://api.example:6443")
        old = api.rest_client.pool_manager
        _read_environment_once(api, cfg)
        new = api.rest_client.pool_manager
        assert new is not old
        assert old.closed
        assert not new.closed
        assert new.trust_env is False
        assert new.connector is not None
        assert not new.connector.closed
        # the proxy the environment names for the API server, looked up once
        assert api.rest_client.proxy == "http://proxy.example:3128"
        await api.close()
        assert new.closed

    asyncio.run(main())


def test_no_proxy_for_a_host_the_environment_exempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    async def main() -> None:
        api, cfg = _session_of("https://127.0.0.1:6443")
        _read_environment_once(api, cfg)
        assert not api.rest_client.proxy
        await api.close()

    asyncio.run(main())


def test_a_configured_proxy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy.example:3128")

    async def main() -> None:
        cfg = client.Configuration()
        cfg.host = "https://api.example:6443"
        cfg.proxy = "http://kubeconfig-proxy.example:8080"
        api = client.ApiClient(configuration=cfg)
        _read_environment_once(api, cfg)
        assert api.rest_client.proxy == "http://kubeconfig-proxy.example:8080"
        await api.close()

    asyncio.run(main())
