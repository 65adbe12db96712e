"""``python -m llmbatch.devcluster agent STATE_DIR``: the node agent as a process of its own, which
the supervisor runs and restarts with a back-off like its other components (a kubelet is a
process of its own on a node, too).

Pod processes are the agent's children and die with it (SIGKILL on the parent's death): a killed
agent leaves no pod running. The next agent finds those pods still ``Running`` in the API and
reports them ``Failed`` (``ContainerStatusUnknown``, exit code 137) instead of running their
containers a second time (:meth:`NodeAgent._handle`); their Jobs replace them as after a node
crash, and an executor's replacement resumes from the result chunks its predecessor committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from llmbatch.devcluster.config import ClusterConfig
from llmbatch.devcluster.procs import RUN_ENV

log = logging.getLogger(__name__)


async def run_agent(state_dir: Path) -> None:
    """Run the node agent of the cluster in ``state_dir`` until SIGTERM/SIGINT (then its pods are
    stopped)."""
    from llmbatch.devcluster.kubeclient import api_client
    from llmbatch.devcluster.nodeagent import NodeAgent

    cfg = ClusterConfig.load(state_dir)
    pki = cfg.state_dir / "controlplane" / "pki"
    cert = (pki / "kubelet.crt", pki / "kubelet.key")
    api = await api_client(cfg.kubeconfig)
    agent = NodeAgent(
        api,
        cfg.nodes,
        cfg.state_dir,
        marker=str(cfg.state_dir),
        extra_env={**cfg.pod_env, RUN_ENV: os.environ.get(RUN_ENV, "")},
        kubelet_cert=cert if cert[0].is_file() else None,
    )
    task = asyncio.create_task(agent.run(), name="node agent")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await api.close()


def main(state_dir: Path) -> int:
    """The process's entry point: 0 after SIGTERM, 1 when the agent failed."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(run_agent(state_dir))
    except Exception:
        log.exception("the node agent failed")
        return 1
    return 0
