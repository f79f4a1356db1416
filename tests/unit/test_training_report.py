"""The training report: Markdown page, PNG plots, PC loadings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sidecar.training._report import ReportData, pc_loadings, write_report


def test_pc_loadings_picks_both_ends() -> None:
    proj = np.array([[0.5, -1.0], [2.0, 0.0], [-3.0, 1.0]])
    (pc,) = pc_loadings(proj, ["a", "b", "c"], ["A", "B", "C"], [0], np.array([0.7, 0.2]), n=1)
    assert pc.index == 0 and pc.explained_variance_ratio == 0.7
    assert pc.top[0][:2] == ("b", "B") and pc.bottom[0][:2] == ("c", "C")


def test_report_writes_page_and_plots(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    s_id, s_ood = rng.normal(0, 1, 50), rng.normal(2, 1, 40)
    proj = rng.normal(size=(10, 3))
    data = ReportData(
        title="OOD model for KB 't'",
        summary={"kb": "t", "m": 2, "params": {"C": 1.0}},
        roc={"combined": (s_id, s_ood), "max_cosine": (s_id, s_ood + 0.5)},
        histogram=("combined", s_id, s_ood, 1.0),
        m_curve={"evr": [(4, 0.8), (8, 0.85)], "pvalue": [(4, 0.9), (8, 0.93)]},
        pcs=pc_loadings(
            proj,
            [f"d{i}" for i in range(10)],
            [f"text | {i}" for i in range(10)],
            [2, 0],
            np.array([0.5, 0.3, 0.2]),
        ),
    )
    page = write_report(data, tmp_path)
    text = page.read_text()
    for png in ("roc.png", "scores.png", "m_curve.png"):
        assert (tmp_path / png).stat().st_size > 1000
        assert f"]({png})" in text
    assert "| pvalue | 0.9000 | 0.9300 |" in text
    assert "### PC 2" in text and "text \\| " in text  # pipes escaped inside table cells
    assert json.loads((tmp_path / "summary.json").read_text())["kb"] == "t"
