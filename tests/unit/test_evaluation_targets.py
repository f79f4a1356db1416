"""The targets table of an eval report: per detector, honest about misses."""

from __future__ import annotations

from sidecar.evaluation._targets import protocol_table, targets


def _proto(pv: float, ev: float) -> dict[str, object]:
    row = {"pvalue": pv, "evr": ev, "mean_diff": pv - ev, "kbs_pvalue_better": 1, "kbs": 2}
    return {"auroc": row, "paper_accuracy": row, "balanced_accuracy": row}


def _report(bench: str, **extra: object) -> dict[str, object]:
    row = {"auroc": 0.99, "balanced_accuracy": 0.98}
    return {
        "benchmark": bench,
        "mean": {"combined": row},
        "kbs": {"a": {"combined": {**row, "dims": 30}}},
        "pvalue_vs_evr": {
            "detectors": {"combined": _proto(0.94, 0.95), "logreg": _proto(0.95, 0.90)}
        },
        **extra,
    }


def test_pvalue_vs_evr_is_reported_per_detector_with_margin() -> None:
    rows = [t for t in targets(_report("clinc150")) if "p-value" in t["target"]]
    by = {t["target"].rsplit(", ", 1)[1]: t for t in rows}
    assert set(by) == {"combined", "logreg"}
    assert by["combined"]["met"] is False and by["logreg"]["met"] is True
    assert abs(by["combined"]["measured"]["margin"] + 0.01) < 1e-12
    assert abs(by["logreg"]["measured"]["margin"] - 0.05) < 1e-12


def test_covid_target_names_the_threshold_rule() -> None:
    out = targets(_report("covid", threshold_rule="balanced", target_frr=0.05))
    ba = [t for t in out if t["target"].startswith("balanced accuracy of combined")]
    assert ba and "balanced" in ba[0]["target"] and ba[0]["met"] is False
    out = targets(_report("covid", threshold_rule="frr", target_frr=0.05))
    assert any("frr 0.05" in t["target"] for t in out)


def _kb_rows(pv: float, ev: float) -> dict[str, dict[str, float]]:
    def row(x: float) -> dict[str, float]:
        return {"auroc": x, "paper_accuracy": x, "balanced_accuracy": x}

    return {"pvalue": row(pv), "evr": row(ev)}


def test_protocol_table_averages_the_paper_detectors_only() -> None:
    protocol = {
        "kb1": {
            "epsilon_ball": _kb_rows(0.70, 0.90),
            "logreg": _kb_rows(0.90, 0.60),
            "combined": _kb_rows(0.10, 0.90),
        },
        "kb2": {
            "epsilon_ball": _kb_rows(0.80, 0.90),
            "logreg": _kb_rows(0.80, 0.70),
            "combined": _kb_rows(0.10, 0.90),
        },
    }
    table = protocol_table(protocol)
    ball = table["detectors"]["epsilon_ball"]["paper_accuracy"]
    assert abs(ball["mean_diff"] + 0.15) < 1e-12 and ball["kbs_pvalue_better"] == 0
    avg = table["paper_detectors_mean"]
    # combined is the product's detector, not the paper's: it does not enter the average
    assert avg["detectors"] == ["epsilon_ball", "logreg"]
    assert abs(avg["paper_accuracy"]["mean_diff"] - (-0.15 + 0.2) / 2) < 1e-12
    assert avg["paper_accuracy"]["detectors_pvalue_better"] == 1
    row = [
        t
        for t in targets({"benchmark": "x", "mean": {}, "kbs": {}, "pvalue_vs_evr": table})
        if "over the paper's detectors" in t["target"]
    ]
    assert len(row) == 1 and row[0]["met"] is True
    assert row[0]["measured"]["detectors_pvalue_better"] == "1/2"
