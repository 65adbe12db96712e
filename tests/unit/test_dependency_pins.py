"""The two pin files agree, so a fresh machine installs what the tests last passed with.

`make venv` installs pyproject's dependencies under hack/requirements-dev.lock; hack/install-vllm.sh
then installs the engine stack of hack/requirements-vllm.txt with --no-deps on top. A distribution
pinned in both at different versions would be silently moved by the second step, and a stack pin
whose own requirement the lock decides differently (opentelemetry-sdk==1.45.2 needs
opentelemetry-api==1.45.2 while fastapi let a fresh resolve take 1.45.3) fails `uv pip check` on a
machine with an empty cache — the CI failure of stop 43."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "hack" / "requirements-dev.lock"
STACK = REPO / "hack" / "requirements-vllm.txt"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[_canonical(match.group(1))] = match.group(2)
    return pins


def test_every_pin_shared_by_the_lock_and_the_engine_stack_agrees() -> None:
    lock, stack = _pins(LOCK), _pins(STACK)
    shared = lock.keys() & stack.keys()
    assert len(shared) >= 10  # numpy, jinja2, openai, httpx2, ...: the files do overlap
    assert {name: (lock[name], stack[name]) for name in shared if lock[name] != stack[name]} == {}


def test_the_opentelemetry_family_is_pinned_to_one_release() -> None:
    """The stack's exporters and sdk need the API of their own release, which fastapi pulls in."""
    stack = _pins(STACK)
    assert stack["opentelemetry-api"] == stack["opentelemetry-sdk"]
    assert _pins(LOCK)["opentelemetry-api"] == stack["opentelemetry-api"]


def test_the_lock_pins_every_dependency_pyproject_names() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    names = {_canonical(m.group(1)) for spec in wanted if (m := _NAME.match(spec))}
    assert sorted(names - _pins(LOCK).keys()) == []


def test_the_venv_and_the_images_install_under_the_lock() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "-e '.[dev]' -c hack/requirements-dev.lock" in makefile
    for image in ("operator", "gateway"):
        text = (REPO / "images" / image / "Dockerfile").read_text()
        assert "hack/requirements-dev.lock" in text
        assert "-c requirements-dev.lock /wheels/*.whl" in text
    cpu = (REPO / "images" / "executor-cpu" / "Dockerfile").read_text()
    assert "-c /tmp/context/hack/requirements-dev.lock" in cpu
    assert "!hack/requirements-dev.lock" in (REPO / ".dockerignore").read_text()


def test_the_package_declares_exactly_what_it_imports() -> None:
    """deptry over the shipped package: every import is a declared dependency (none arrives only
    through another package's requirements), and no runtime dependency goes unused (a test-only
    client such as httpx belongs to the dev extra). `make lint` runs the same check."""
    assert "$(BIN)/deptry operator" in (REPO / "Makefile").read_text()
    deptry = Path(sys.executable).with_name("deptry")
    result = subprocess.run(
        [str(deptry), "operator"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
