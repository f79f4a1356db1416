"""``sidecar eval`` end to end on the covid benchmark of ../shared/data (real encoder)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from sidecar.cli import main
from sidecar.evaluation._evaluate import PROTOCOL_CANDIDATES
from sidecar.training._metrics import METRIC_KEYS


def _eval(data: Path, out: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["eval", "--benchmark", "covid", "--data-dir", str(data), "--json", str(out), *args]
    )


def test_eval_writes_the_documented_json_and_its_report(shared_data: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "eval.json", tmp_path / "report"
    res = _eval(
        shared_data,
        out,
        "--detectors",
        "combined,max_cosine",
        "--report",
        str(report),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert (doc["benchmark"], doc["split"], doc["encoder"]) == ("covid", "dev", "all-MiniLM-L6-v2")
    assert set(doc["mean"]) == {"combined", "max_cosine"}
    for kb_rows in doc["kbs"].values():
        for row in kb_rows.values():
            assert set(METRIC_KEYS) <= set(row)
            assert 0.5 <= row["auroc"] <= 1.0 and row["n_id"] > 0 and row["n_ood"] > 0
    # the paper's protocol runs whatever detectors were asked for
    assert set(doc["pvalue_vs_evr"]["detectors"]) == {c.detector for c in PROTOCOL_CANDIDATES}
    assert any(t["target"].startswith("balanced accuracy of combined") for t in doc["targets"])
    assert (report / "report.md").is_file() and (report / "auroc_by_kb.png").is_file()
    assert doc["calibration"] == "cross" and "seed_spread" not in doc  # the default
    cross_cal = [f["n_calibration"] for f in doc["kbs"]["covid"]["combined"]["folds"]]

    # split-calibrated, over two seeds: the spread is reported and judges the target
    out2 = tmp_path / "eval2.json"
    res = _eval(
        shared_data,
        out2,
        "--detectors",
        "combined",
        "--calibration",
        "split",
        "--seeds",
        "2",
        "--no-protocol",
        *("--features", "pcs,residual,max_cosine"),  # the candidates `train --features` has
        "--report",
        str(tmp_path / "report2"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    doc2 = json.loads(out2.read_text())
    assert not doc2["pvalue_vs_evr"].get("detectors")  # --no-protocol: no refits
    assert not any("p-value beats EVR" in t["target"] for t in doc2["targets"])
    assert (tmp_path / "report2" / "report.md").is_file()
    assert doc2["calibration"] == "split"
    spread = doc2["seed_spread"]
    assert spread["seeds"] == [0, 1]
    ba = spread["mean"]["combined"]["balanced_accuracy"]
    assert ba["values"][0] == doc2["mean"]["combined"]["balanced_accuracy"]
    assert ba["min"] <= ba["median"] <= ba["max"]
    folds = doc2["kbs"]["covid"]["combined"]["folds"]
    assert all(f["calibration"] == "split" for f in folds)
    assert all(f["params"]["features"] == ["pcs", "residual", "max_cosine"] for f in folds)
    assert doc2["combined_grid"] == {
        "features": "pcs,residual,max_cosine",
        "neighbour_bank": None,
        "floor": True,
    }
    # cross-calibration scores every ID training query; split only its calibration part
    assert all(s < c for s, c in zip([f["n_calibration"] for f in folds], cross_cal, strict=True))
    (target,) = [t for t in doc2["targets"] if t["target"].startswith("balanced accuracy of")]
    assert "median over seeds [0, 1]" in target["target"]


def test_a_missing_test_split_is_named_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    res = _eval(shared_data, tmp_path / "x.json", "--split", "test")
    if res.exit_code == 0:  # the held-out files are present on this machine
        assert json.loads((tmp_path / "x.json").read_text())["split"] == "test"
        return
    assert res.exit_code == 2
    assert (
        "missing for --split test" in res.output and "covidq_final_master_dataset.csv" in res.output
    )
    assert "Traceback" not in res.output


def test_denied_topics_screen_every_detector_the_evaluation_fits(
    shared_data: Path, tmp_path: Path
) -> None:
    """`sidecar eval --deny-topics builtin`: the covid benchmark's models screen for the
    topics, and AdvBench, among its OOD evaluation queries, is refused more often."""
    args = ("--detectors", "max_cosine", "--no-protocol", "--no-progress")
    runs = {}
    for spec in ("none", "builtin"):
        out = tmp_path / f"{spec}.json"
        res = _eval(
            shared_data, out, *args, "--cache-dir", str(tmp_path / "c"), "--deny-topics", spec
        )
        assert res.exit_code == 0, res.output
        runs[spec] = json.loads(out.read_text())
    assert runs["none"]["deny_topics"] is None
    assert runs["builtin"]["deny_topics"]["source"] == "builtin"
    assert runs["builtin"]["deny_topics"]["n"] >= 20
    plain, screened = (runs[s]["kbs"]["covid"]["max_cosine"] for s in ("none", "builtin"))
    assert screened["ood_accept_rate"] < plain["ood_accept_rate"]
    res = _eval(shared_data, tmp_path / "x.json", "--deny-topics", str(tmp_path / "none.txt"))
    assert res.exit_code == 2 and "denied-topic file not found" in res.output
