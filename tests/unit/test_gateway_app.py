"""The app's own surface (issue #18): metrics on a listener of their own, docs off by default."""

from __future__ import annotations

import pathlib
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from click.testing import CliRunner

from llmbatch.gateway.settings import GatewaySettings
from tests.fixtures.gateway import GATEWAY_NAMESPACE, FakeGateway, FakeKube, auth, free_port

DOC_PATHS = ("/docs", "/redoc", "/openapi.json")


@contextmanager
def running(tmp_path: pathlib.Path, **settings: Any) -> Iterator[FakeGateway]:
    """The app on FakeKube with these settings, started (lifespan) and stopped."""
    from starlette.testclient import TestClient

    from llmbatch.gateway.app import create_app
    from llmbatch.storage import open_store

    root = tmp_path / "store"
    cfg = GatewaySettings(
        store_uri=f"file://{root}", gateway_namespace=GATEWAY_NAMESPACE, **settings
    )
    kube = FakeKube()
    app = create_app(cfg, kube=kube, store=open_store(cfg.store_uri))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield FakeGateway(kube, root, client)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def test_docs_are_off_by_default(fake_gateway: FakeGateway) -> None:
    for path in DOC_PATHS:
        resp = fake_gateway.client.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["code"] == "unknown_url"


def test_docs_setting_turns_them_on(tmp_path: pathlib.Path) -> None:
    with running(tmp_path, docs=True, metrics_port=0) as gw:
        for path in DOC_PATHS:
            assert gw.client.get(path).status_code == 200, path
        schema = gw.client.get("/openapi.json").json()
        assert "/v1/batches" in schema["paths"]
        assert "/metrics" not in schema["paths"]


def test_metrics_are_served_on_their_own_port_only(tmp_path: pathlib.Path) -> None:
    port = free_port()
    with running(tmp_path, metrics_port=port, metrics_host="127.0.0.1") as gw:
        key = gw.key("team-m")
        assert gw.client.get("/v1/batches", headers=auth(key)).status_code == 200
        api = gw.client.get("/metrics")
        assert api.status_code == 404
        assert api.json()["error"]["code"] == "unknown_url"
        text = scrape(port)
        assert 'llmbatch_gateway_requests_total{code="200",method="GET",route="/batches"}' in text
        assert "llmbatch_gateway_api_keys 1.0" in text  # counted at the scrape
    with socket.socket() as sock:  # the listener is gone with the app
        # SO_REUSEADDR: the scrape's connection may sit in TIME_WAIT on the server side (the
        # listener closes first); only a socket still listening on the port refuses this bind.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_metrics_port_zero_serves_none(tmp_path: pathlib.Path) -> None:
    with running(tmp_path, metrics_port=0) as gw:
        assert gw.client.get("/metrics").status_code == 404


def test_a_taken_metrics_port_fails_the_start(tmp_path: pathlib.Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError), running(tmp_path, metrics_port=port, metrics_host="127.0.0.1"):
            pass


def test_settings_from_the_environment() -> None:
    base = {"LLMBATCH_STORE_URI": "file:///s"}
    default = GatewaySettings.from_env(base)
    assert (default.metrics_port, default.metrics_host, default.docs) == (9090, "0.0.0.0", False)
    assert default.list_resync_seconds == 600
    custom = GatewaySettings.from_env(
        {
            **base,
            "LLMBATCH_GATEWAY_METRICS_PORT": "0",
            "LLMBATCH_GATEWAY_METRICS_HOST": "127.0.0.1",
            "LLMBATCH_GATEWAY_DOCS": "true",
            "LLMBATCH_GATEWAY_LIST_RESYNC_SECONDS": "120",
        }
    )
    assert (custom.metrics_port, custom.metrics_host, custom.docs) == (0, "127.0.0.1", True)
    assert custom.list_resync_seconds == 120
    for name, value in (
        ("LLMBATCH_GATEWAY_METRICS_PORT", "65536"),
        ("LLMBATCH_GATEWAY_METRICS_PORT", "-1"),
        ("LLMBATCH_GATEWAY_DOCS", "maybe"),
        ("LLMBATCH_GATEWAY_LIST_RESYNC_SECONDS", "5"),
    ):
        with pytest.raises(ValueError, match=name):
            GatewaySettings.from_env({**base, name: value})


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--workers", "2"], "LLMBATCH_GATEWAY_METRICS_PORT=0"),
        (["--port", "9191", "--metrics-port", "9191"], "must not be the API port"),
    ],
)
def test_the_command_refuses_metrics_it_cannot_serve(
    args: list[str], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmbatch.commands.gateway import gateway

    for name in ("LLMBATCH_GATEWAY_METRICS_PORT", "LLMBATCH_GATEWAY_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLMBATCH_STORE_URI", "file:///tmp/none")
    result = CliRunner().invoke(gateway, args)
    assert result.exit_code == 2, result.output
    assert problem in result.output
