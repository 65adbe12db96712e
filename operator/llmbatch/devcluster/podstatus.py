"""A pod's status as a kubelet reports it (phase, conditions, container statuses) and the task
that publishes it whenever it changes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from llmbatch.devcluster.containers import Container
from llmbatch.devcluster.podcontext import JSON, StatusWriter, now_rfc3339

COALESCE_SECONDS = 0.05  # bursts of changes within this become one status write


@dataclass
class PodState:
    """What the runner knows about the pod as a whole."""

    init_containers: list[Container]
    containers: list[Container]
    start_time: str = field(default_factory=now_rfc3339)
    initialized: bool = False
    failed_init: bool = False
    stopping: bool = False
    reason: str | None = None
    message: str | None = None
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """condition type -> (status, lastTransitionTime)"""

    @property
    def all_containers(self) -> list[Container]:
        return [*self.init_containers, *self.containers]

    def phase(self) -> str:
        if self.reason == "DeadlineExceeded" and not any(c.running for c in self.all_containers):
            return "Failed"
        if self.failed_init:
            return "Failed"
        if not self.initialized:
            return "Pending"
        if self.containers and all(c.done for c in self.containers):
            codes = [int(c.state.get("terminated", {}).get("exitCode", 1)) for c in self.containers]
            return "Succeeded" if all(code == 0 for code in codes) else "Failed"
        if any(c.running or c.ever_started for c in self.containers):
            return "Running"
        return "Pending"

    def condition(self, kind: str, ok: bool, reason: str | None = None) -> JSON:
        status = "True" if ok else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != status:
            self.transitions[kind] = (status, now_rfc3339())
        cond: JSON = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self.transitions[kind][1],
        }
        if reason and not ok:
            cond["reason"] = reason
        return cond

    def status(self) -> JSON:
        phase = self.phase()
        terminal = phase in ("Succeeded", "Failed")
        ready = (
            not terminal
            and not self.stopping
            and self.initialized
            and bool(self.containers)
            and all(c.running and c.probe_ready for c in self.containers)
        )
        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        status: JSON = {
            "phase": phase,
            "conditions": [
                self.condition("PodReadyToStartContainers", True),
                self.condition("Initialized", self.initialized, "ContainersNotInitialized"),
                self.condition("ContainersReady", ready, not_ready_reason),
                self.condition("Ready", ready, not_ready_reason),
                self.condition("PodScheduled", True),
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.start_time,
            "containerStatuses": [c.status(ready) for c in self.containers],
            "reason": self.reason,
            "message": self.message,
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status(c.running) for c in self.init_containers]
        return status


class StatusPublisher:
    """Writes the pod's status after every change, coalescing bursts; stops writing once the pod
    is gone from the API."""

    def __init__(
        self, write: StatusWriter, namespace: str, name: str, render: Callable[[], JSON]
    ) -> None:
        self.write = write
        self.namespace = namespace
        self.name = name
        self.render = render
        self.gone = False
        self._dirty = asyncio.Event()

    def mark_dirty(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.publish()
            await asyncio.sleep(COALESCE_SECONDS)

    async def publish(self) -> None:
        if self.gone:
            return
        if not await self.write(self.namespace, self.name, {"status": self.render()}):
            self.gone = True


LOST_REASON = "NodeAgentRestarted"


def lost_pod_status(pod: JSON) -> JSON:
    """The status of a pod whose processes died with an earlier node agent: ``Failed``, every
    container terminated with 137 ``ContainerStatusUnknown`` (what a kubelet reports for a
    container it cannot find)."""
    now = now_rfc3339()
    message = "The container could not be located when the node agent restarted"
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": message,
                    "finishedAt": now,
                }
            },
        }
        for c in pod["spec"].get("containers") or []
    ]
    not_ready = {"status": "False", "reason": "PodFailed", "lastTransitionTime": now}
    return {
        "phase": "Failed",
        "reason": LOST_REASON,
        "message": "The pod's processes ended with the node agent that ran them",
        "conditions": [
            {"type": "Ready", **not_ready},
            {"type": "ContainersReady", **not_ready},
        ],
        "containerStatuses": statuses,
    }
