"""Root conftest: loads every fixture module in tests/fixtures/ as a pytest plugin."""

from __future__ import annotations

import pathlib

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (pathlib.Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem != "__init__"
)
