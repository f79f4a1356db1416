"""Held-out figures and release gates behind ``sidecar check``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.stats import beta

from sidecar.errors import DataError
from sidecar.training._holdout import Gate, holdout_figures, rate_interval


class _FirstColumn:
    """A model whose OOD score is the first column of the row."""

    threshold = 0.5

    def score(self, E: np.ndarray, languages: object = None) -> np.ndarray:
        return np.asarray(E, dtype=np.float64)[:, 0]

    def training_copies(self, E: np.ndarray, languages: object = None) -> None:
        return None  # keeps no training queries


def test_rate_interval_is_the_exact_binomial_one() -> None:
    assert rate_interval(0, 70) == pytest.approx((0.0, 1 - 0.025 ** (1 / 70)))
    low, high = rate_interval(5, 100)
    assert low == pytest.approx(beta.ppf(0.025, 5, 96))
    assert high == pytest.approx(beta.ppf(0.975, 6, 95))
    assert rate_interval(10, 10)[1] == 1.0


def _rows(values: list[float]) -> np.ndarray:
    return np.c_[values, np.zeros(len(values))]


def test_figures_count_at_the_models_threshold() -> None:
    model: Any = _FirstColumn()
    ids = _rows([0.1, 0.2, 0.5, 0.9])  # 0.5 is not above the threshold: accepted
    oods = _rows([0.6, 0.4, 0.95])
    f = holdout_figures(model, ids, oods)
    assert (f["false_reject"]["count"], f["false_reject"]["n"]) == (1, 4)
    assert (f["ood_accept"]["count"], f["ood_accept"]["n"]) == (1, 3)
    assert f["balanced_accuracy"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert f["auroc"]["low"] <= f["auroc"]["value"] <= f["auroc"]["high"]
    only_id = holdout_figures(model, ids, None)
    assert "ood_accept" not in only_id and "auroc" not in only_id
    with pytest.raises(DataError, match="no held-out ID"):
        holdout_figures(model, ids[:0], oods)


def test_gates_judge_the_measured_value_or_the_worse_interval_end() -> None:
    f = holdout_figures(_FirstColumn(), _rows([0.1] * 99 + [0.9]), _rows([0.9] * 50))  # type: ignore[arg-type]
    frr = Gate("--max-frr", "false_reject", 0.02)
    assert frr.judge(f, conservative=False)["met"]  # 1 of 100 refused
    v = frr.judge(f, conservative=True)  # the interval reaches 5.4%
    assert not v["met"] and v["measured"] == f["false_reject"]["high"]
    assert Gate("--min-auroc", "auroc", 0.99).judge(f, conservative=False)["met"]
    with pytest.raises(DataError, match="needs OOD queries"):
        Gate("--max-ood-accept", "ood_accept", 0.1).judge(
            holdout_figures(_FirstColumn(), _rows([0.1]), None),  # type: ignore[arg-type]
            conservative=False,
        )


def test_an_id_query_without_a_score_counts_as_refused() -> None:
    f = holdout_figures(_FirstColumn(), _rows([0.1, float("nan")]), _rows([0.9, float("nan")]))  # type: ignore[arg-type]
    assert f["false_reject"]["count"] == 1  # as OODModel.predict: refused
    assert f["ood_accept"]["count"] == 0


def test_a_perfect_separation_of_few_queries_proves_little_about_auroc() -> None:
    f = holdout_figures(_FirstColumn(), _rows([0.1] * 3), _rows([0.9] * 3))  # type: ignore[arg-type]
    assert f["auroc"]["value"] == 1.0 and f["auroc"]["low"] < 0.9
    gate = Gate("--min-auroc", "auroc", 0.99)
    assert gate.judge(f, conservative=False)["met"]
    assert not gate.judge(f, conservative=True)["met"]
    many = holdout_figures(_FirstColumn(), _rows([0.1] * 300), _rows([0.9] * 300))  # type: ignore[arg-type]
    assert many["auroc"]["low"] > 0.99  # many queries do bound it
