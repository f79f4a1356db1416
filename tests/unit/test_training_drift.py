"""Group-wise held-out calibration: the false-reject drift `sidecar train` reports."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.training import carve_splits, search
from sidecar.training._drift import expected_frr
from sidecar.training._grid import Candidate


def test_exchangeable_scores_keep_the_target_on_held_out_groups() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=5000)
    drift = expected_frr(scores, None, 0.05)
    assert drift is not None and drift["folds"] == 5 and drift["n"] == 5000
    assert abs(drift["mean"] - 0.05) < 0.01 and drift["max"] < 0.07


def test_a_group_the_others_do_not_resemble_shows_as_drift() -> None:
    # 10 groups of 100 ID queries; one group (new wording, say) scores higher than the rest:
    # whichever fold holds it is judged by a threshold that never saw it
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(10), 100)
    scores = rng.normal(size=1000) + np.where(groups == 3, 2.5, 0.0)
    drift = expected_frr(scores, groups, 0.01)
    assert drift is not None and drift["target"] == 0.01
    assert drift["max"] > 0.1  # the fold with the shifted group
    assert drift["min"] <= 0.02
    assert expected_frr(scores, np.zeros(1000), 0.01) is None  # one group: nothing held out


@pytest.mark.parametrize("calibration", ["cross", "split"])
def test_a_searched_model_records_its_expected_false_reject_rate(calibration: str) -> None:
    rng = np.random.default_rng(2)
    centre = np.r_[3.0, np.zeros(15)]

    def unit(X: np.ndarray) -> np.ndarray:
        return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)

    kb, idq = unit(centre + rng.normal(size=(80, 16))), unit(centre + rng.normal(size=(200, 16)))
    ood = unit(rng.normal(size=(120, 16)))
    splits = carve_splits(kb, idq, ood, seed=0, id_groups=np.arange(200) // 4)
    res = search(
        splits,
        "logreg",
        kb_name="t",
        encoder={"name": "fake", "dim": 16},
        grid=[Candidate("logreg", 4, {"C": 1.0})],
        target_frr=0.05,
        calibration=calibration,
    )
    drift = res.model.metrics["expected_frr"]
    assert drift["target"] == 0.05 and drift["folds"] == 5
    assert drift["min"] <= drift["mean"] <= drift["max"]
    n_cal = 200 if calibration == "cross" else len(splits.id_cal)
    assert drift["n"] == n_cal
