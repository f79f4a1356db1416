"""Metrics against scikit-learn and hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from sidecar.training import auroc, balanced_accuracy, fpr_at_tpr, paper_accuracy, roc_points
from sidecar.training._metrics import auroc_standard_error


def test_auroc_matches_sklearn() -> None:
    rng = np.random.default_rng(0)
    s_id, s_ood = rng.normal(0, 1, 200), rng.normal(1, 1, 150)
    y = np.r_[np.zeros(200), np.ones(150)]
    assert auroc(s_id, s_ood) == pytest.approx(roc_auc_score(y, np.r_[s_id, s_ood]))


def test_auroc_hand_values() -> None:
    assert auroc(np.array([0.0, 1.0]), np.array([2.0, 3.0])) == 1.0
    assert auroc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 0.0
    # one of four ID/OOD pairs inverted
    assert auroc(np.array([0.0, 2.5]), np.array([2.0, 3.0])) == 0.75


def test_auroc_standard_error_hand_value_and_bootstrap() -> None:
    # Hanley & McNeil eq. 2 by hand: A = 0.9, 50 scores a side -> Q1 = 0.818, Q2 = 0.853.
    assert auroc_standard_error(0.9, 50, 50) == pytest.approx(0.03212, abs=1e-4)
    assert auroc_standard_error(1.0, 40, 60) == 0.0
    # lopsided sides pin the orientation (OOD is the positive class): 20 ID, 500 OOD
    assert auroc_standard_error(0.9, 20, 500) == pytest.approx(0.02232, abs=1e-4)
    assert auroc_standard_error(0.9, 500, 20) == pytest.approx(0.04639, abs=1e-4)
    assert auroc_standard_error(0.9, 500, 500) < auroc_standard_error(0.9, 50, 50)
    # ... and close to the spread of the AUROC over resampled score sets.
    rng = np.random.default_rng(1)
    s_id, s_ood = rng.normal(0, 1, 80), rng.normal(1.5, 1, 120)
    boot = [auroc(rng.choice(s_id, s_id.size), rng.choice(s_ood, s_ood.size)) for _ in range(400)]
    se = auroc_standard_error(auroc(s_id, s_ood), s_id.size, s_ood.size)
    assert se == pytest.approx(float(np.std(boot)), rel=0.3)
    with pytest.raises(ValueError):
        auroc_standard_error(0.5, 0, 10)


def test_fpr_at_95tpr_hand_value() -> None:
    s_id = np.arange(100, dtype=float)  # 95 % of ID accepted at threshold 94
    s_ood = np.array([10.0, 94.0, 94.5, 200.0])
    assert fpr_at_tpr(s_id, s_ood, 0.95) == 0.5
    for bad in (0.0, -0.1, 1.5):  # 0 used to index the largest ID score
        with pytest.raises(ValueError, match="tpr must be in"):
            fpr_at_tpr(s_id, s_ood, bad)


def test_roc_points_hand_values_and_area() -> None:
    s_id = np.arange(10, dtype=float)  # refusing the top k ID queries: fpr k/10
    s_ood = np.array([5.5, 9.5, 20.0, 30.0])
    roc = roc_points(s_id, s_ood, (0.0, 0.1, 0.2, 0.5, 1.0))
    assert roc["fpr"] == [0.0, 0.1, 0.2, 0.5, 1.0]
    # above 9: 3 of 4 OOD caught with no ID refused; the fourth (5.5) only once the ID
    # queries 6..9 are refused too (fpr 0.4, within 0.5)
    assert roc["tpr"] == [0.75, 0.75, 0.75, 1.0, 1.0]
    rng = np.random.default_rng(2)
    a, b = rng.normal(0, 1, 2000), rng.normal(1.5, 1, 2000)
    fine = roc_points(a, b, tuple(np.linspace(0, 1, 401)))
    # the step curve sampled finely has (nearly) the area AUROC measures
    assert np.trapezoid(fine["tpr"], fine["fpr"]) == pytest.approx(auroc(a, b), abs=0.005)
    assert all(np.diff(roc_points(a, b)["tpr"]) >= 0)


def test_balanced_accuracy_matches_sklearn() -> None:
    rng = np.random.default_rng(1)
    s_id, s_ood = rng.normal(0, 1, 300), rng.normal(1.5, 1, 80)
    thr = 0.7
    y = np.r_[np.zeros(300), np.ones(80)]
    pred = np.r_[s_id, s_ood] > thr
    assert balanced_accuracy(s_id, s_ood, thr) == pytest.approx(balanced_accuracy_score(y, pred))


def test_paper_accuracy_balances_classes_with_a_seed() -> None:
    s_id = np.r_[np.zeros(90), np.full(10, 5.0)]  # 10 % of ID wrong
    s_ood = np.full(20, 5.0)  # all OOD right
    a = paper_accuracy(s_id, s_ood, 1.0, seed=3)
    assert a == paper_accuracy(s_id, s_ood, 1.0, seed=3)
    assert 0.5 <= a <= 1.0
    # equal sizes: plain accuracy
    assert paper_accuracy(np.array([0.0, 2.0]), np.array([2.0, 2.0]), 1.0) == 0.75


def test_metrics_refuse_empty_sides() -> None:
    with pytest.raises(ValueError):
        auroc(np.array([]), np.array([1.0]))
