"""Per-language thresholds: their conformal calibration, their use in ``predict`` and their
round trip through the model's plain state (old states without them still load)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sidecar.errors import DataError, InvalidModelState
from sidecar.scoring import (
    UNDETERMINED_LANGUAGE,
    OODModel,
    fit_ood_model,
    language_thresholds,
    min_calibration_size,
    model_from_state,
    model_state,
    recalibrate_by_language,
)


@pytest.fixture(scope="module")
def model() -> OODModel:
    rng = np.random.default_rng(0)
    centre = np.zeros(16, dtype=np.float32)
    centre[0] = 1.0

    def around(c: np.ndarray, n: int, spread: float) -> np.ndarray:
        X = c + spread * rng.standard_normal((n, 16)).astype(np.float32)
        return X / np.linalg.norm(X, axis=1, keepdims=True)

    other = np.zeros(16, dtype=np.float32)
    other[1] = 1.0
    return fit_ood_model(
        kb="kb",
        encoder={"name": "fake", "dim": 16},
        kb_embeddings=around(centre, 40, 0.2),
        id_embeddings=around(centre, 60, 0.2),
        ood_embeddings=around(other, 60, 0.2),
        detector="max_cosine",
        criterion="evr",
        m=4,
        target_frr=0.05,
    )


def test_each_language_with_enough_queries_gets_its_conformal_threshold() -> None:
    need = min_calibration_size(0.05)  # 19
    scores = np.r_[np.linspace(0, 1, 40), np.linspace(5, 6, need), np.linspace(9, 10, need - 1)]
    langs = ["en"] * 40 + ["nl"] * need + ["de"] * (need - 1)
    langs[0] = UNDETERMINED_LANGUAGE
    thr, table = language_thresholds(scores, langs, 0.05)
    assert set(thr) == {"en", "nl"}  # German: one query short
    assert 0.9 < thr["en"] <= 1.0 and 5.9 < thr["nl"] <= 6.0
    assert table["de"] == {"n": need - 1, "threshold": None, "calibration_frr": None}
    assert table["en"]["n"] == 39 and "und" not in table
    with pytest.raises(DataError, match="languages for"):
        language_thresholds(scores, langs[:-1], 0.05)


def test_recalibration_by_language_keeps_a_global_threshold_and_adds_the_rest(
    model: OODModel,
) -> None:
    rng = np.random.default_rng(1)
    E = 0.2 * rng.standard_normal((40, 16)).astype(np.float32)
    E[:, 0] += 1.0
    langs = ["en"] * 20 + ["nl"] * 19 + ["und"]
    new = recalibrate_by_language(model, E, langs, 0.05)
    assert set(new.language_thresholds) == {"en", "nl"} and new.version is None
    assert new.metrics["language_calibration"]["nl"]["n"] == 19
    assert new.params["language_calibration"] == "per-language"
    s = new.score(E)
    # each threshold is the conformal one of its language's own scores
    assert new.language_thresholds["nl"] == pytest.approx(np.max(s[20:39]))
    assert new.threshold_for("nl") == new.language_thresholds["nl"]
    assert new.threshold_for("ja") == new.threshold == new.threshold_for(None)
    pred = new.predict(E, langs)
    assert np.array_equal(pred, s > np.array([new.threshold_for(x) for x in langs]))
    with pytest.raises(DataError, match="languages for"):
        new.predict(E, langs[:3])


def test_language_thresholds_survive_the_state_and_old_states_load(model: OODModel) -> None:
    with_langs = dataclasses.replace(model, language_thresholds={"nl": 0.25, "de": 0.5})
    section, arrays = model_state(with_langs)
    assert section["language_thresholds"] == {"de": 0.5, "nl": 0.25}
    back = model_from_state(section, arrays, kb="kb", encoder=model.encoder)
    assert back.language_thresholds == {"de": 0.5, "nl": 0.25}
    old, _ = model_state(model)
    assert "language_thresholds" not in old  # a model without them writes what it did
    assert model_from_state(old, arrays, kb="kb", encoder=model.encoder).language_thresholds == {}
    for bad in ({"nl": "high"}, ["nl"], {"nl": True}):
        with pytest.raises(InvalidModelState, match="language_thresholds"):
            model_from_state(
                {**section, "language_thresholds": bad}, arrays, kb="kb", encoder=model.encoder
            )
    with pytest.raises(DataError, match="not a finite number"):
        dataclasses.replace(model, language_thresholds={"nl": float("nan")})


def test_a_global_recalibration_drops_per_language_thresholds_of_older_traffic(
    model: OODModel,
) -> None:
    from sidecar.scoring import recalibrate

    rng = np.random.default_rng(2)
    E = 0.2 * rng.standard_normal((40, 16)).astype(np.float32)
    E[:, 0] += 1.0
    per = recalibrate_by_language(model, E, ["nl"] * 40, 0.05)
    assert set(per.language_thresholds) == {"nl"}
    again = recalibrate(per, E, 0.05)
    assert again.language_thresholds == {} and "language_calibration" not in again.metrics
    assert again.metrics["recalibrated_from"]["language_thresholds"] == per.language_thresholds
