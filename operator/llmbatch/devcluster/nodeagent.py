"""The node agent: registers GPU nodes, keeps them Ready, and runs the pods bound to them as local
processes (see :mod:`llmbatch.devcluster.pods`)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.devcluster.config import NodeSpec
from llmbatch.devcluster.logserver import LogServer
from llmbatch.devcluster.podcontext import JSON, PodContext, now_rfc3339
from llmbatch.devcluster.podenv import decode_secret
from llmbatch.devcluster.pods import PodRunner, pod_directory
from llmbatch.devcluster.podstatus import LOST_REASON, lost_pod_status
from llmbatch.devcluster.procs import kill_marked

log = logging.getLogger(__name__)

AGENT_VERSION = "v1.37.2-devcluster"
# Environment a pod process inherits from the agent; everything else comes from the pod spec.
DEFAULT_INHERIT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "TZ", "VIRTUAL_ENV")
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
STATUS_RETRY_SECONDS = 180.0
"""How long a pod status write is retried: longer than a control-plane restart, so that a pod
ending while the API server is away is still reported (its Job would wait for it forever)."""


def _raw(body: object) -> Any:
    """A plain JSON body where the typed client asks for a model (both serialize the same)."""
    return body


def _microtime() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """A kubelet stand-in for ``nodes``; :meth:`run` until cancelled, then every pod process is
    stopped."""

    def __init__(
        self,
        api: client.ApiClient,
        nodes: Sequence[NodeSpec],
        state_dir: Path,
        *,
        marker: str | None = None,
        inherit_env: Sequence[str] = DEFAULT_INHERIT_ENV,
        extra_env: Mapping[str, str] | None = None,
        lease_interval: float = 10.0,
        status_interval: float = 20.0,
        kubelet_cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.nodes = {n.name: n for n in nodes}
        self.state_dir = state_dir
        self.pods_dir = state_dir / "pods"
        self.marker = marker or str(state_dir)
        base = {k: os.environ[k] for k in inherit_env if k in os.environ}
        self.base_env = base | dict(extra_env or {})
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self.kubelet_port = 0
        self.log_server = (
            LogServer(self._pod_dir, self._pod_running, *kubelet_cert) if kubelet_cert else None
        )
        self.runners: dict[str, PodRunner] = {}
        self._deleted_uids: set[str] = set()
        self._done_uids: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._boot_id = str(uuid.uuid4())
        self._since = now_rfc3339()  # condition transition time: the agent start
        self.registered = asyncio.Event()

    # -- nodes -----------------------------------------------------------------------------

    def _node_status(self, spec: NodeSpec) -> JSON:
        now = now_rfc3339()

        def cond(kind: str, ok: bool, reason: str, message: str) -> JSON:
            return {
                "type": kind,
                "status": "True" if ok else "False",
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._since,
            }

        resources = spec.resources()
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", False, "KubeletHasSufficientMemory", "sufficient memory"),
                cond("DiskPressure", False, "KubeletHasNoDiskPressure", "no disk pressure"),
                cond("PIDPressure", False, "KubeletHasSufficientPID", "sufficient PID"),
                cond(
                    "Ready", True, "KubeletReady", "devcluster node agent is posting ready status"
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {
                "machineID": spec.name,
                "systemUUID": spec.name,
                "bootID": self._boot_id,
                "kernelVersion": platform.release(),
                "osImage": "llmbatch devcluster (processes)",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": AGENT_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self) -> None:
        for spec in self.nodes.values():
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": spec.name,
                    "labels": spec.all_labels(),
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"taints": [dict(t) for t in spec.taints]} if spec.taints else {},
                "status": self._node_status(spec),
            }
            try:
                await self.core.create_node(_raw(body))
            except ApiException as err:
                if err.status != 409:
                    raise
                await self.core.patch_node(spec.name, {"metadata": {"labels": spec.all_labels()}})
            await self._patch_node_status(spec)
            await self._renew_lease(spec)
        self.registered.set()

    async def _patch_node_status(self, spec: NodeSpec) -> None:
        await self.core.patch_node_status(spec.name, {"status": self._node_status(spec)})

    async def _renew_lease(self, spec: NodeSpec) -> None:
        body: JSON = {
            "spec": {
                "holderIdentity": spec.name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _microtime(),
            }
        }
        try:
            await self.coordination.patch_namespaced_lease(spec.name, NODE_LEASE_NAMESPACE, body)
        except ApiException as err:
            if err.status != 404:
                raise
            node = await self.core.read_node(spec.name)
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": spec.name,
                    "namespace": NODE_LEASE_NAMESPACE,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": spec.name,
                            "uid": node.metadata.uid,
                        }
                    ],
                },
                **body,
            }
            await self.coordination.create_namespaced_lease(NODE_LEASE_NAMESPACE, _raw(lease))

    async def _heartbeat(self) -> None:
        last_status = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.lease_interval)
            self._prune()
            try:
                for spec in self.nodes.values():
                    await self._renew_lease(spec)
                if asyncio.get_running_loop().time() - last_status >= self.status_interval:
                    for spec in self.nodes.values():
                        await self._patch_node_status(spec)
                    last_status = asyncio.get_running_loop().time()
            except Exception as err:
                log.warning("node heartbeat failed: %s", err)

    # -- pods ------------------------------------------------------------------------------

    def _context(self) -> PodContext:
        any_node = next(iter(self.nodes.values()))
        return PodContext(
            pods_dir=self.pods_dir,
            node_allocatable=any_node.resources(),
            base_env=self.base_env,
            marker=self.marker,
            read_object=self._read_object,
            write_status=self._write_status,
            delete_pod=self._delete_pod,
            record_event=self._record_event,
            request_token=self._request_token,
            server=self.api.configuration.host or "",
            ca_data=self._ca_data(),
        )

    def _ca_data(self) -> bytes:
        ca = self.api.configuration.ssl_ca_cert
        return Path(ca).read_bytes() if ca else b""

    async def _request_token(
        self, pod: JSON, account: str, expiration: int, audience: str | None
    ) -> str:
        """A TokenRequest for ``account``, bound to ``pod`` (invalid once the pod is gone)."""
        meta = pod["metadata"]
        spec: JSON = {
            "expirationSeconds": expiration,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        result = await self.core.create_namespaced_service_account_token(
            account, meta["namespace"], _raw({"spec": spec})
        )
        return str(result.status.token)

    async def _read_object(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "Secret":
                secret = await self.core.read_namespaced_secret(name, namespace)
                out = decode_secret(secret.data)
                out.update(secret.string_data or {})
                return out
            cm = await self.core.read_namespaced_config_map(name, namespace)
            return dict(cm.data or {})
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def _write_status(self, namespace: str, name: str, body: JSON) -> bool:
        """Patch a pod's status, retried with a back-off for ``STATUS_RETRY_SECONDS``; False
        when the pod is gone from the API."""
        deadline = asyncio.get_running_loop().time() + STATUS_RETRY_SECONDS
        delay = 0.2
        while True:
            try:
                await self.core.patch_namespaced_pod_status(name, namespace, body)
                return True
            except ApiException as err:
                if err.status == 404:
                    return False
                log.warning("status of pod %s/%s: %s", namespace, name, err.reason)
            except Exception as err:
                log.warning("status of pod %s/%s: %s", namespace, name, err)
            if asyncio.get_running_loop().time() > deadline:
                log.error("status of pod %s/%s not written; giving up", namespace, name)
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self._deleted_uids.add(uid)
        with contextlib.suppress(ApiException):
            await self.core.delete_namespaced_pod(
                name,
                namespace,
                body=_raw({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}),
                grace_period_seconds=0,
            )

    async def _record_event(self, pod: JSON, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": pod["spec"].get("nodeName", ""),
        }
        try:
            await self.core.create_namespaced_event(meta["namespace"], _raw(event))
        except Exception as err:
            log.debug("event for %s/%s: %s", meta["namespace"], meta["name"], err)

    async def _report_lost(self, pod: JSON) -> None:
        """A pod an earlier agent started: never run twice (its Job replaces it, as after a node
        crash); leftover processes (a container's own children) are killed, the pod ``Failed``."""
        meta = pod["metadata"]
        killed = kill_marked(self.marker, hostname=meta["name"])
        log.warning(
            "pod %s/%s was run by an earlier node agent; reporting it failed (killed %s)",
            meta["namespace"],
            meta["name"],
            killed,
        )
        await self._write_status(meta["namespace"], meta["name"], {"status": lost_pod_status(pod)})
        await self._record_event(
            pod, "Warning", LOST_REASON, "The pod's processes ended with the node agent"
        )

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _handle(self, kind: str, pod: JSON) -> None:
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        if spec.get("nodeName") not in self.nodes:
            return
        uid = meta["uid"]
        runner = self.runners.get(uid)
        if kind == "DELETED":
            if runner is not None:
                runner.forget()
            return
        phase = (pod.get("status") or {}).get("phase")
        if runner is None:
            if meta.get("deletionTimestamp"):
                # Never ran here (or ran in an earlier agent): nothing to stop, let it go.
                if uid not in self._deleted_uids:
                    self._deleted_uids.add(uid)
                    self._background(self._delete_pod(meta["namespace"], meta["name"], uid))
                return
            if phase in ("Succeeded", "Failed") or uid in self._done_uids:
                return
            if pod_directory(self.pods_dir, meta).is_dir():
                # An earlier agent ran it; its processes died with that agent.
                self._done_uids.add(uid)
                self._background(self._report_lost(pod))
                return
            runner = PodRunner(pod, self._context())
            self.runners[uid] = runner
            runner.start()
            return
        if runner.finished:
            if meta.get("deletionTimestamp") and uid not in self._deleted_uids:
                self._deleted_uids.add(uid)
                self._background(self._delete_pod(meta["namespace"], meta["name"], uid))
            return
        runner.update(pod)

    async def _list_pods(self) -> str:
        response: Any = await self.core.list_pod_for_all_namespaces(_preload_content=False)
        data = json.loads(await response.read())
        seen: set[str] = set()
        for item in data.get("items") or []:
            seen.add(item["metadata"]["uid"])
            self._handle("ADDED", item)
        for uid, runner in list(self.runners.items()):
            if uid not in seen and not runner.finished:
                runner.forget()
        return str(data["metadata"]["resourceVersion"])

    async def _watch_pods(self) -> None:
        while True:
            try:
                rv = await self._list_pods()
                # return_type "object": events stay plain JSON (no model deserialization).
                w = watch.Watch(return_type="object")
                async with w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                ) as stream:
                    async for event in stream:
                        kind = event["type"]
                        if kind == "BOOKMARK":
                            continue
                        self._handle(kind, event["raw_object"])
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status != 410:  # 410 Gone: resource version too old, just re-list
                    log.warning("pod watch: %s; re-listing", err)
                    await asyncio.sleep(1.0)
            except Exception as err:
                log.warning("pod watch: %s; re-listing", err)
                await asyncio.sleep(1.0)
            self._prune()

    def _prune(self) -> None:
        """Forget finished runners; their uids are remembered so a pod never runs twice."""
        for uid, runner in list(self.runners.items()):
            if runner.finished:
                self._done_uids.add(uid)
                del self.runners[uid]

    # -- main ------------------------------------------------------------------------------

    def _pod_dir(self, namespace: str, name: str) -> Path | None:
        for runner in self.runners.values():
            if runner.namespace == namespace and runner.name == name:
                return runner.directory
        found = sorted(self.pods_dir.glob(f"{namespace}_{name}_*"), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    def _pod_running(self, namespace: str, name: str) -> bool:
        return any(
            r.namespace == namespace and r.name == name and not r.finished
            for r in self.runners.values()
        )

    async def run(self) -> None:
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        if self.log_server is not None:
            self.kubelet_port = await self.log_server.start()
        try:
            await self._run()
        finally:
            if self.log_server is not None:
                await self.log_server.stop()

    async def _run(self) -> None:
        await self.register()
        tasks = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._watch_pods(), name="pod watch"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.stop_pods()

    async def stop_pods(self, grace: float = 5.0) -> None:
        """Stop every pod process: SIGTERM, ``grace`` seconds, SIGKILL."""
        running = [r for r in self.runners.values() if not r.finished]
        for r in running:
            r.request_stop(grace)
        tasks = [r.task for r in running if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 15)
