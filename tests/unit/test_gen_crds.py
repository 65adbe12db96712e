"""`make verify` catches a hand-edited, missing or stray generated file."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_crds", ROOT / "hack" / "gen_crds.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_crds"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def generator(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    gen = load_generator()
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "CRD_DIR", tmp_path / "crds")
    monkeypatch.setattr(gen, "CHART_CRD_DIR", tmp_path / "chart" / "crds")
    files = gen.render()
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return gen


def test_repository_files_are_in_step_with_the_models() -> None:
    gen = load_generator()
    assert gen.check(gen.render()) == []


def test_clean_tree_passes(generator: ModuleType) -> None:
    assert generator.check(generator.render()) == []


def test_hand_edit_is_caught(generator: ModuleType, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "crds" / "batches.llmbatch.io.yaml"
    target.write_text(target.read_text().replace("maxLength: 128", "maxLength: 129"))
    problems = generator.check(generator.render())
    assert problems == [
        "differs from the models (hand-edited or stale): crds/batches.llmbatch.io.yaml"
    ]


def test_missing_and_stray_files_are_caught(generator: ModuleType, tmp_path: pathlib.Path) -> None:
    (tmp_path / "crds" / "batchpools.llmbatch.io.yaml").unlink()
    (tmp_path / "chart" / "crds" / "extra.yaml").write_text("kind: Nothing\n")
    problems = generator.check(generator.render())
    assert "missing: crds/batchpools.llmbatch.io.yaml" in problems
    assert "not generated (remove it): chart/crds/extra.yaml" in problems
