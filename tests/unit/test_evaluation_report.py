"""The evaluation report drawn from an eval JSON: plots, tables, honest misses, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sidecar.cli import main
from sidecar.errors import DataError
from sidecar.evaluation._eval_json import read_eval_json
from sidecar.evaluation._report import write_eval_report
from sidecar.evaluation._targets import protocol_table, targets

PNG = b"\x89PNG\r\n\x1a\n"


def _row(auroc: float, **extra: float) -> dict[str, float]:
    return {
        "auroc": auroc,
        "fpr_at_95tpr": 1 - auroc,
        "balanced_accuracy": auroc - 0.05,
        "paper_accuracy": auroc - 0.04,
        "dims": 13,
        "us_per_query": 2.0,
        **extra,
    }


def _report() -> dict[str, Any]:
    kbs = {
        "alpha": {"combined": _row(0.995), "max_cosine": _row(0.99), "epsilon_ball": _row(0.95)},
        "beta": {"combined": _row(0.985), "max_cosine": _row(0.97), "epsilon_ball": _row(0.93)},
    }
    mean = {d: _row(sum(kbs[k][d]["auroc"] for k in kbs) / 2) for d in kbs["alpha"]}

    def crit(pv: float, ev: float) -> dict[str, dict[str, float]]:
        return {
            c: {"auroc": x, "paper_accuracy": x, "balanced_accuracy": x}
            for c, x in (("pvalue", pv), ("evr", ev))
        }

    proto = {
        "alpha": {"epsilon_ball": crit(0.80, 0.90), "combined": crit(0.95, 0.90)},
        "beta": {"epsilon_ball": crit(0.82, 0.88), "combined": crit(0.93, 0.92)},
    }
    report: dict[str, Any] = {
        "benchmark": "clinc150",
        "split": "dev",
        "encoder": "all-MiniLM-L6-v2",
        "kbs": kbs,
        "mean": mean,
        "pvalue_vs_evr": protocol_table(proto),
    }
    report["targets"] = targets(report)
    return report


def test_report_draws_every_plot_and_states_misses(tmp_path: Path) -> None:
    page = write_eval_report(_report(), tmp_path)
    for name in ("auroc_by_kb.png", "detectors.png", "cost_quality.png", "pvalue_vs_evr.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name
        assert f"]({name})" in page.read_text()
    text = page.read_text()
    # best mean AUROC first in the means table
    rows = [
        line.split(" | ")[0].lstrip("| ")
        for line in text.splitlines()
        if line.startswith(("| combined |", "| max_cosine |", "| epsilon_ball |"))
    ]
    assert rows[:3] == ["combined", "max_cosine", "epsilon_ball"]
    # the ball's protocol target is missed (p-value below EVR on both KBs) and says so
    ball = next(
        line for line in text.splitlines() if "average (paper accuracy), epsilon_ball" in line
    )
    assert ball.endswith("| **no** |") and "margin -0.0800" in ball
    assert "| epsilon_ball | 0.8900 | 0.8100 | -0.0800 | 0/2 |" in text
    assert "mean of the paper's detectors" in text


def test_a_file_that_is_not_an_eval_report_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="is not JSON"):
        read_eval_json(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "x"}))
    with pytest.raises(DataError, match="not a sidecar eval report"):
        read_eval_json(other)
    res = CliRunner().invoke(main, ["eval-report", str(other)])
    assert res.exit_code == 2 and "not a sidecar eval report" in res.output
    assert "Traceback" not in res.output


def test_cli_writes_beside_the_json_by_default(tmp_path: Path) -> None:
    src = tmp_path / "eval_x.json"
    src.write_text(json.dumps(_report()))
    res = CliRunner().invoke(main, ["eval-report", str(src)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "eval_x_report" / "report.md").is_file()


def test_seed_spread_judges_the_covid_target_on_the_median(tmp_path: Path) -> None:
    from sidecar.evaluation._spread import seed_spread

    reports = []
    for seed, ba in ((0, 0.99), (1, 0.95), (2, 0.96)):
        r = _report()
        r.update(benchmark="covid", seed=seed, threshold_rule="frr", target_frr=0.01)
        r["mean"]["combined"]["balanced_accuracy"] = ba
        reports.append(r)
    spread = seed_spread(reports)
    ba = spread["mean"]["combined"]["balanced_accuracy"]
    assert spread["seeds"] == [0, 1, 2]
    assert (ba["median"], ba["min"], ba["max"]) == (0.96, 0.95, 0.99)
    report = reports[0]
    lucky = next(t for t in targets(report) if "balanced accuracy of combined" in t["target"])
    assert lucky["met"]  # seed 0 alone reaches 0.985 ...
    report["seed_spread"] = spread
    judged = next(t for t in targets(report) if "balanced accuracy of combined" in t["target"])
    assert not judged["met"] and judged["measured"]["median"] == 0.96  # ... the median not
    assert judged["measured"]["at_seed"] == 0.99
    text = write_eval_report(report, tmp_path).read_text()
    assert "## Spread over seeds [0, 1, 2]" in text
    assert "0.9600 [0.9500, 0.9900]" in text


def test_cost_plot_labels_of_close_points_do_not_overlap() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sidecar.evaluation._report import _place_labels

    # max_cosine and knn of the CLINC150 report: 10.0 / 12.5 us, AUROC 0.9845 / 0.9840
    pts = [("max_cosine", 10.0, 0.9845), ("knn", 12.5, 0.9840), ("mahalanobis", 9.3, 0.9806)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([p[1] for p in pts], [p[2] for p in pts])
    ax.set_xscale("log")
    ax.set_xlim(2.0, 150.0)  # the report's range: residual to combined
    ax.set_ylim(0.95, 1.0)
    texts = _place_labels(fig, ax, pts)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    plt.close(fig)
    assert [t.get_text() for t in texts] == ["max_cosine", "knn", "mahalanobis"]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())


def test_cost_plot_label_at_the_right_edge_stays_inside_the_axes() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sidecar.evaluation._report import _place_labels

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([3.0, 120.0], [0.985, 0.999])
    ax.set_xscale("log")
    ax.set_xlim(2.0, 140.0)
    (_, edge) = _place_labels(fig, ax, [("residual", 3.0, 0.985), ("combined", 120.0, 0.999)])
    renderer = fig.canvas.get_renderer()
    box, frame = edge.get_window_extent(renderer), ax.get_window_extent(renderer)
    plt.close(fig)
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1
    assert frame.y0 <= box.y0 and box.y1 <= frame.y1
