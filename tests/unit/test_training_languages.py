"""Per-language thresholds at training time (``TrainConfig.per_language``): each language
of the ID training queries with enough of them gets the conformal threshold of its own
held-out or out-of-fold scores, the others keep the global threshold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import conformal_threshold, min_calibration_size
from sidecar.training._job import train
from sidecar.training._report import write_report
from sidecar.training._splits import carve_splits
from sidecar.training._train_config import TrainConfig, TrainInputs, TrainResult
from sidecar.training._train_report import report_data

DIM = 16
TARGET = 0.1  # 9 calibration queries per language


def _inputs() -> TrainInputs:
    """KB and English ID queries around one centre; Dutch ID queries a little further
    out (as a multilingual encoder places another language's queries); OOD away."""
    rng = np.random.default_rng(11)
    centre = rng.normal(size=DIM)

    def cloud(base: np.ndarray, n: int, spread: float) -> np.ndarray:
        v = base + rng.normal(size=(n, DIM)) * spread
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    shifted = centre + 0.8 * rng.normal(size=DIM)
    ids = np.vstack([cloud(centre, 50, 0.5), cloud(shifted, 40, 0.5), cloud(centre, 6, 0.5)])
    langs: list[str | None] = ["en"] * 50 + ["nl"] * 40 + ["de"] * 5 + ["und"]
    return TrainInputs(
        "t",
        {"name": "fake", "dim": DIM},
        cloud(centre, 60, 0.5),
        ids,
        cloud(centre + 2.0 * rng.normal(size=DIM), 80, 0.5),
        id_languages=langs,
    )


def _own_thresholds(res: TrainResult) -> dict[str, float]:
    """Each language's conformal threshold on its calibration scores, recomputed here."""
    assert res.splits is not None and res.search.calibration_scores is not None
    inputs_langs = _inputs().id_languages
    assert inputs_langs is not None
    positions, scores = res.search.calibration_scores
    by: dict[str, list[float]] = {}
    for p, s in zip(positions, scores, strict=True):
        lang = inputs_langs[int(res.splits.id_rows[p])]
        if lang and lang != "und":
            by.setdefault(lang, []).append(float(s))
    need = min_calibration_size(TARGET)
    return {k: conformal_threshold(np.array(v), TARGET) for k, v in by.items() if len(v) >= need}


def test_the_splits_say_which_training_query_each_row_is() -> None:
    inputs = _inputs()
    s = carve_splits(inputs.kb, inputs.id_queries, inputs.ood_queries, seed=3)
    assert s.id_rows is not None and sorted(s.id_rows.tolist()) == list(range(96))
    np.testing.assert_array_equal(s.id_all, inputs.id_queries[s.id_rows])


@pytest.mark.parametrize("calibration", ["cross", "split"])
def test_each_language_with_enough_queries_gets_its_own_threshold(calibration: str) -> None:
    inputs = _inputs()
    cfg = TrainConfig(m=4, target_frr=TARGET, calibration=calibration)
    plain = train(inputs, cfg)
    res = train(inputs, replace(cfg, per_language=True))
    model = res.model
    # the global threshold and everything else as without per-language thresholds
    assert model.threshold == plain.model.threshold and plain.model.language_thresholds == {}
    assert model.params["language_calibration"] == "per-language"
    table = model.metrics["language_calibration"]
    positions, _ = res.search.calibration_scores  # type: ignore[misc]
    if calibration == "cross":  # every ID training query's out-of-fold score
        assert len(positions) == 96 and {k: r["n"] for k, r in table.items()} == {
            "de": 5,
            "en": 50,
            "nl": 40,
        }
    else:  # the calibration part's
        assert res.splits is not None and len(positions) == len(res.splits.id_cal)
        assert sum(r["n"] for r in table.values()) <= len(res.splits.id_cal)
    assert model.language_thresholds == pytest.approx(_own_thresholds(res))
    assert "de" not in model.language_thresholds  # 5 queries: the global threshold
    if calibration == "cross":
        assert table["de"]["threshold"] is None
        assert model.language_thresholds["nl"] != model.language_thresholds["en"]
        assert model.threshold_for("de") == model.threshold_for("und") == model.threshold


def test_per_language_needs_the_languages_and_the_frr_rule() -> None:
    inputs = _inputs()
    with pytest.raises(DataError, match="language of each ID training query"):
        train(replace(inputs, id_languages=None), TrainConfig(m=4, per_language=True))
    with pytest.raises(DataError, match="95 languages for 96"):
        langs = inputs.id_languages
        assert langs is not None
        train(replace(inputs, id_languages=langs[:-1]), TrainConfig(m=4, per_language=True))
    with pytest.raises(ConfigError, match="frr threshold rule"):
        train(inputs, TrainConfig(m=4, per_language=True, threshold_rule="balanced"))


def test_the_report_lists_each_languages_threshold(tmp_path: Path) -> None:
    inputs = replace(_inputs(), id_languages_given=90)  # the rows gave 90, 6 were detected
    cfg = TrainConfig(m=4, target_frr=TARGET, per_language=True)
    res = train(inputs, cfg)
    data = report_data(inputs, cfg, res)
    assert data.summary["language_thresholds"] == res.model.language_thresholds
    assert (data.summary["id_languages_given"], data.summary["id_languages_detected"]) == (90, 6)
    assert set(data.languages) == {"de", "en", "nl"}
    page = write_report(data, tmp_path).read_text()
    section = page.split("## Per-language thresholds")[1].split("\n## ")[0]
    assert "| de | 5 | global (too few) | - |" in section
    assert f"| nl | 40 | {res.model.language_thresholds['nl']:.6g} |" in section
