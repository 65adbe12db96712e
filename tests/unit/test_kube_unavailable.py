"""A create the API server answers 503 is tried again, by name (llmbatch.kube.client).

A fresh install's admission chain refuses creates of a new kind with 503 for a few seconds (the
MutatingAdmissionPolicy plugin learns the kind's schema from /openapi/v3 on a 5 s poll). The
client is driven over HTTP against a small server that answers as the API server would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.kube import client as kube_client
from llmbatch.kube.client import Conflict, KubeClient

BODY = {
    "apiVersion": "llmbatch.io/v1alpha1",
    "kind": "Batch",
    "metadata": {"name": "batch-1", "namespace": "team-a"},
    "spec": {"endpoint": "/v1/chat/completions"},
}
UNAVAILABLE = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "Resource kind llmbatch.io/v1alpha1, Kind=Batch not found. There can be a delay "
    "between when CustomResourceDefinitions are created and when they are available.",
    "reason": "ServiceUnavailable",
    "code": 503,
}


class FakeServer:
    """POSTs answered from a script: each entry is the status of one answer; ``stored`` makes
    the first 503 keep the object anyway (a create that was carried out and answered late)."""

    def __init__(self, script: list[int], stored: bool = False) -> None:
        self.script = script
        self.stored = stored
        self.posts = 0
        self.objects: dict[str, dict[str, Any]] = {}

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["metadata"]["name"]
        status = self.script[min(self.posts, len(self.script) - 1)]
        self.posts += 1
        if name in self.objects:
            status = 409
        elif status == 201 or (status == 503 and self.stored):
            self.objects[name] = body
        if status == 201:
            return web.json_response(body, status=201)
        answer = UNAVAILABLE if status == 503 else {**UNAVAILABLE, "reason": "x", "code": status}
        return web.Response(status=status, text=json.dumps(answer), content_type="application/json")


@asynccontextmanager
async def served(server: FakeServer) -> AsyncIterator[KubeClient]:
    app = web.Application()
    app.router.add_post("/apis/llmbatch.io/v1alpha1/namespaces/{ns}/batches", server.post)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    kube = KubeClient(client.ApiClient(configuration=cfg), request_timeout=5)
    try:
        yield kube
    finally:
        await kube.close()
        await runner.cleanup()


def run(server: FakeServer, call: Callable[[KubeClient], Any]) -> Any:
    async def main() -> Any:
        async with served(server) as kube:
            return await call(kube)

    return asyncio.run(main())


def create(kube: KubeClient) -> Any:
    return kube.create_custom("batches", "team-a", BODY)


def test_a_create_answered_unavailable_is_tried_again_until_it_is_served() -> None:
    server = FakeServer([503, 503, 503, 201])
    created = run(server, create)
    assert created["metadata"]["name"] == "batch-1"
    assert server.posts == 4
    assert list(server.objects) == ["batch-1"]


def test_a_try_that_was_stored_after_all_meets_its_own_name() -> None:
    """The retry cannot make a second object: the name is taken, and the caller hears
    Conflict, as from a concurrent creator (the gateway then reads the batch)."""
    server = FakeServer([503, 201], stored=True)
    with pytest.raises(Conflict):
        run(server, create)
    assert server.posts == 2
    assert list(server.objects) == ["batch-1"]


def test_an_unavailable_server_is_given_up_on_after_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kube_client, "UNAVAILABLE_SECONDS", 1.0)
    server = FakeServer([503])
    with pytest.raises(ApiException) as raised:
        run(server, create)
    assert raised.value.status == 503
    # tried at 0, 0.2 and 0.6 s; the next pause (0.8 s) would end past the deadline
    assert 2 <= server.posts <= 3


@pytest.mark.parametrize("status", [500, 504, 422])
def test_other_failures_of_a_create_are_not_tried_again(status: int) -> None:
    """A 500 or a 504 may hide a create the server carried out: the caller decides."""
    server = FakeServer([status, 201])
    with pytest.raises(ApiException) as raised:
        run(server, create)
    assert raised.value.status == status
    assert server.posts == 1
