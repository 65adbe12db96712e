"""The engine core's start method (``llmbatch.executor.engines.vllmcore``) without vLLM: real
forkserver processes, fake package folders for the preload libraries."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmbatch.executor import models
from llmbatch.executor.engines import vllmcore

PROBE = "LLMBATCH_TEST_PROBE"


def _probe(context: Any, out: Path) -> str:
    """Run a child of ``context`` that writes what it sees of :data:`PROBE` into ``out``."""
    process = context.Process(
        target=subprocess.run,
        kwargs={"args": ["sh", "-c", f'printf %s "${{{PROBE}:-unset}}" > {out}'], "check": True},
    )
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0
    return out.read_text()


def test_the_engine_core_runs_in_its_parents_environment_of_the_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU platform sets variables after the server has started; a plain fork of the
    server would miss them, the engine core context hands them over."""
    monkeypatch.delenv(PROBE, raising=False)
    multiprocessing.forkserver.ensure_running()
    monkeypatch.setenv(PROBE, "set after the server started")
    plain = _probe(multiprocessing.get_context("forkserver"), tmp_path / "plain")
    assert plain == "unset"  # what the context is for
    assert _probe(vllmcore.EngineCoreContext(), tmp_path / "core") == (
        "set after the server started"
    )


def _packages(tmp_path: Path, *files: str) -> dict[str, Path]:
    site = tmp_path / "site-packages"
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"")
    (site / "torch").mkdir(parents=True, exist_ok=True)
    (site / "vllm").mkdir(exist_ok=True)
    return {"torch": site / "torch", "vllm": site / "vllm"}


@pytest.mark.parametrize(
    ("files", "current", "expected"),
    [
        # torch's own libgomp after what is preloaded already
        (["torch/lib/libgomp.so.1"], "", "{site}/torch/lib/libgomp.so.1"),
        (["torch/lib/libgomp.so.1"], "/x/liba.so", "/x/liba.so:{site}/torch/lib/libgomp.so.1"),
        # the wheel's torch.libs first; vLLM's bundled tcmalloc in front of everything
        (
            ["torch.libs/libgomp-a34b3233.so.1.0.0", "torch/lib/libgomp.so.1"],
            "",
            "{site}/torch.libs/libgomp-a34b3233.so.1.0.0",
        ),
        (
            ["torch/lib/libgomp.so.1", "vllm/libs/libtcmalloc_minimal.so.4"],
            "",
            "{site}/vllm/libs/libtcmalloc_minimal.so.4:{site}/torch/lib/libgomp.so.1",
        ),
        # an OpenMP runtime or a tcmalloc preloaded already: nothing of that kind is added
        (["torch/lib/libgomp.so.1"], "/opt/libiomp5.so", "/opt/libiomp5.so"),
        (
            ["torch/lib/libgomp.so.1", "vllm/libs/libtcmalloc.so.4"],
            "/usr/lib/libtcmalloc.so.4",
            "/usr/lib/libtcmalloc.so.4:{site}/torch/lib/libgomp.so.1",
        ),
        ([], "", ""),
    ],
)
def test_the_server_preloads_what_vllm_preloads_for_its_children(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: list[str],
    current: str,
    expected: str,
) -> None:
    folders = _packages(tmp_path, *files)
    monkeypatch.setattr(models, "package_dir", folders.get)
    site = str(tmp_path / "site-packages")
    assert vllmcore.cpu_preload(current) == expected.format(site=site)
