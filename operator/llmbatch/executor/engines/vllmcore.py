"""Where vLLM's engine core process comes from on the CPU platform: a forkserver that imports
the engine core while the executor imports vLLM's serving layer.

vLLM runs its engine core (``EngineCoreProc``) in a child process. On the CPU platform it forces
the ``spawn`` start method (``vllm/platforms/cpu.py``), so the child imports torch and vLLM again
from nothing *after* the executor's own import has finished: on a 2-core machine about 9 s of a
26 s engine start, spent one after the other while the second core idles. Here a
``forkserver`` is started before the executor imports vLLM, with the engine core's modules as
its preload, so the two imports run at once; the engine core is then forked from the loaded
server (:class:`EngineCoreContext`, which :func:`use_for_engine_core` gives vLLM's launcher in
place of its own).

What a spawned child got and a fork of an earlier process would not, and how it still gets it:

- the environment when the child starts: vLLM's CPU platform sets variables while it configures
  the engine, after the server started. The child takes over its parent's environment as it was
  when the process was created (:func:`_run_in_environment`), before anything else runs.
- ``LD_PRELOAD``, which the dynamic loader reads only when a program starts: vLLM's CPU platform
  preloads torch's libgomp (and its bundled tcmalloc, where the wheel has one) for its
  children; the server is started with the same libraries preloaded (:func:`cpu_preload`).

``LLMBATCH_VLLM_CORE_FORKSERVER=0`` turns this off (vLLM's own ``spawn`` then starts the core).
"""

from __future__ import annotations

import glob
import importlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import platform
from collections.abc import Callable
from typing import Any

from llmbatch.executor import models

log = logging.getLogger("llmbatch.executor.vllm")

#: What the engine core process imports before it loads a model: the server imports it once.
CORE_MODULES = ("torch", "vllm.v1.engine.core", "vllm.v1.worker.cpu_worker")
#: OpenMP runtimes: with one of them already preloaded, vLLM preloads no libgomp.
_OPENMP = ("libomp", "libgomp", "libiomp")


def enabled() -> bool:
    """Whether the engine core starts from the preloaded forkserver (the default)."""
    return os.environ.get("LLMBATCH_VLLM_CORE_FORKSERVER", "1") != "0"


def cpu_preload(current: str) -> str:
    """``LD_PRELOAD`` as vLLM's CPU platform sets it for its children (``platforms/cpu.py``),
    from ``current``: torch's libgomp appended unless an OpenMP runtime is preloaded, then
    vLLM's bundled tcmalloc put first unless one is preloaded."""
    if platform.system() != "Linux":
        return current
    preload = current
    torch = models.package_dir("torch")
    if torch is not None and not any(name in preload for name in _OPENMP):
        found = [
            path
            for folder in (torch.parent / "torch.libs", torch / "lib")
            for path in sorted(glob.glob(str(folder / "libgomp*.so*")))
        ]
        if found:
            preload = f"{preload}:{found[0]}" if preload else found[0]
    vllm = models.package_dir("vllm")
    if vllm is not None and "libtcmalloc" not in preload:
        for pattern in ("libtcmalloc_minimal*.so*", "libtcmalloc.so*"):
            found = sorted(glob.glob(str(vllm / "libs" / pattern)))
            if found:
                preload = f"{found[0]}:{preload}" if preload else found[0]
                break
    return preload


def start_server() -> bool:
    """Start the forkserver now, importing :data:`CORE_MODULES` in the background (call before
    importing vLLM). When it runs already it is kept as it was started. False when it cannot
    start (vLLM's own spawn is then kept)."""
    multiprocessing.set_forkserver_preload(list(CORE_MODULES))
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = cpu_preload(before or "")
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as exc:
        log.warning("no forkserver for the engine core (%s): vLLM spawns it", exc)
        return False
    finally:
        if before is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = before
    return True


def _run_in_environment(
    environment: dict[str, str], target: Callable[..., Any], **kwargs: Any
) -> Any:
    """The engine core process: its parent's environment (as it was when the process was
    created), then vLLM's target."""
    os.environ.clear()
    os.environ.update(environment)
    return target(**kwargs)


class EngineCoreContext:
    """The multiprocessing context vLLM's launcher gets: processes forked from the preloaded
    server, each running in its parent's environment; anything else is the forkserver
    context's own."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")

    def Process(  # the name multiprocessing contexts use
        self,
        *,
        target: Callable[..., Any],
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        return self._context.Process(
            target=_run_in_environment,
            args=(dict(os.environ), target),
            kwargs=kwargs or {},
            **options,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def use_for_engine_core() -> bool:
    """Have vLLM's engine launcher (``vllm.v1.engine.utils``, which takes the context from
    ``get_mp_context``) start the engine core from the forkserver. False, and vLLM unchanged,
    when this vLLM has no such launcher."""
    launcher: Any = importlib.import_module("vllm.v1.engine.utils")
    if not callable(getattr(launcher, "get_mp_context", None)):
        log.warning("vLLM's engine launcher has no get_mp_context: its own start method is kept")
        return False
    context = EngineCoreContext()
    launcher.get_mp_context = lambda: context
    return True
