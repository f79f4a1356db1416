"""The recalibration study: drifted evaluation ID queries, recalibrated on one half and
judged on the other, get the refusal rate back to the target."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.bench._recalibration import recalibration_study
from sidecar.errors import ConfigError
from sidecar.evaluation import KBTask

DIM = 48


def _embed(texts):
    """Training ID and KB texts around one centre; evaluation ID texts ("live") drifted
    towards the OOD side, which no training query shows."""
    centre = np.r_[3.0, np.zeros(DIM - 1)]
    rows = []
    for t in texts:
        r = np.random.default_rng(sum(ord(c) * 31**i for i, c in enumerate(t)) % 2**32)
        base = {"kb": centre, "idt": centre, "live": 0.6 * centre}.get(t.rstrip("0123456789"))
        v = (base if base is not None else -centre) + r.normal(size=DIM)
        rows.append(v.astype(np.float32))
    return np.asarray(rows)


def _task(cross_fit: int = 0, n_live: int = 600) -> KBTask:
    def mk(p: str, n: int) -> tuple[str, ...]:
        return tuple(f"{p}{i}" for i in range(n))

    return KBTask(
        "t", mk("kb", 80), mk("idt", 200), mk("oodt", 200), mk("live", n_live), mk("oode", 300),
        cross_fit=cross_fit,
    )  # fmt: skip


def test_the_recalibrated_threshold_keeps_its_target_on_the_judged_half() -> None:
    out = recalibration_study(
        _task(), _embed, encoder={"name": "fake", "dim": DIM}, detector="logreg", target_frr=0.05
    )
    shipped, recal = out["shipped"], out["recalibrated"]
    assert shipped["false_reject_rate"] > 0.10  # the drift breaks the shipped promise
    assert recal["false_reject_rate"] <= 0.05 + 0.02  # 300 judged per half: noise ~1.3 pt
    assert recal["threshold"] > shipped["threshold"]
    assert [h["n_recalibration"] + h["n_judged_id"] for h in out["halves"]] == [600, 600]
    assert out["n_ood_judged"] == 300
    for key in ("false_reject_rate", "ood_accept_rate", "balanced_accuracy"):
        halves = [h["recalibrated"][key] for h in out["halves"]]
        assert recal[key] == pytest.approx(np.mean(halves))


def test_a_cross_fitted_benchmark_has_no_live_half() -> None:
    with pytest.raises(ConfigError, match="cross-fitted"):
        recalibration_study(_task(cross_fit=5), _embed, encoder={"name": "fake", "dim": DIM})


def test_halves_too_small_for_the_target_are_refused_before_training() -> None:
    from sidecar.errors import DataError

    seen: list[str] = []

    def embed(texts):
        seen.extend(texts)
        return _embed(texts)

    with pytest.raises(DataError, match=r"fewer than the 99 a false-reject rate of 0\.01 needs"):
        # 1% needs 99 queries; 150 evaluation ID queries make halves of 75
        recalibration_study(_task(n_live=150), embed, encoder={"name": "fake", "dim": DIM})
    assert not any(t.startswith("kb") for t in seen)  # the KB was never even embedded
