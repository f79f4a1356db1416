"""docs/hooks.py: what the site build does to the rendered API pages and the figures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return _load("docs_hooks", REPO / "docs" / "hooks.py")


def test_docstring_roles_become_cross_references(hooks: ModuleType) -> None:
    page = SimpleNamespace(markdown="# sidecar.bench\n\n::: sidecar.bench\n")
    html = (
        "<p>see :func:<code>run_e2e_bench</code>, :class:<code>~sidecar.errors.DataError</code>"
        " and :meth:<code>OODModel.score()</code>; keep :<code>x</code> and <code>y</code></p>"
    )
    out = hooks.on_page_content(html, page, None, None)
    assert '<autoref identifier="sidecar.bench.run_e2e_bench" optional>' in out
    assert '<autoref identifier="sidecar.errors.DataError" optional>' in out
    assert "<code>OODModel.score()</code></autoref>" in out
    assert ":func:" not in out and ":class:" not in out and ":meth:" not in out
    assert ":<code>x</code> and <code>y</code>" in out  # not roles: left alone


def test_every_figure_is_drawn_from_the_recorded_json(tmp_path: Path) -> None:
    figures = _load("draw_figures", REPO / "docs" / "scripts" / "draw_figures.py")
    results = REPO / "benchmarks" / "results"
    pngs = figures.render(results)
    assert set(pngs) == set(figures.FIGURES)
    assert all(png.startswith(b"\x89PNG") for png in pngs.values())
    # the ROC figure needs curves, which every recorded evaluation now keeps
    for name, _ in figures.EVAL_FILES:
        kbs = json.loads((results / name).read_text())["kbs"]
        for kb in kbs.values():
            roc = kb["combined"]["roc"]
            assert len(roc["fpr"]) == len(roc["tpr"]) and roc["tpr"][-1] == 1.0
