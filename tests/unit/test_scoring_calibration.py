"""Split-conformal threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sidecar.errors import ConfigError
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import conformal_threshold


def test_rank_formula() -> None:
    scores = np.arange(1.0, 20.0)  # n = 19, alpha = 0.1 -> rank ceil(20 * 0.9) = 18
    assert conformal_threshold(scores, 0.1) == 18.0


def test_frr_is_at_most_the_target_on_exchangeable_data() -> None:
    rng = np.random.default_rng(0)
    alpha, n_cal, trials = 0.05, 200, 400
    rates = []
    for _ in range(trials):
        cal = rng.standard_t(3, size=n_cal)
        test = rng.standard_t(3, size=500)
        rates.append(np.mean(test > conformal_threshold(cal, alpha)))
    # Marginal guarantee: E[FRR] <= alpha (and >= alpha - 1/(n+1)); margin for 400 trials.
    assert np.mean(rates) <= alpha + 0.004
    assert np.mean(rates) >= alpha - 1 / (n_cal + 1) - 0.004


def test_too_few_scores_fall_back_to_the_max() -> None:
    assert conformal_threshold([0.3, 0.1, 0.2], 0.05) == 0.3


def test_bad_target() -> None:
    with pytest.raises(ConfigError):
        conformal_threshold([1.0, 2.0], 0.0)


def test_cli_defaults_follow_the_library_default_target_frr() -> None:
    from click.testing import CliRunner

    from sidecar.cli import main
    from sidecar.scoring import DEFAULT_TARGET_FRR

    for cmd in ("train", "eval"):
        out = CliRunner().invoke(main, [cmd, "--help"]).output
        assert f"[default: {DEFAULT_TARGET_FRR}" in " ".join(out.split()), cmd


def test_too_few_calibration_queries_warn_once_per_size_and_target(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    scores = np.linspace(0.0, 1.0, 37)  # 37 < 1 / 0.0123 - 1: the guarantee cannot hold
    with caplog.at_level(logging.DEBUG, logger="sidecar.scoring._calibration"):
        for _ in range(3):  # a search calibrates every candidate on the same part
            assert conformal_threshold(scores, 0.0123) == 1.0
        conformal_threshold(scores[:36], 0.0123)  # another size: its own warning
    levels = [r.levelno for r in caplog.records if "too few" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.WARNING]


@pytest.mark.parametrize(("target", "n"), [(0.01, 99), (0.02, 49), (0.05, 19), (0.1, 9)])
def test_min_calibration_size_is_the_first_size_with_a_conformal_rank(target, n) -> None:
    from sidecar.scoring import min_calibration_size

    assert min_calibration_size(target) == n
    rank = math.ceil((n + 1) * (1 - target))  # the conformal rank of n scores
    assert rank <= n and math.ceil(n * (1 - target)) > n - 1  # n has one, n - 1 has none


def _shifted_model():
    """A logreg model fitted on one ID cloud, and ID queries that drifted away from it."""
    from sidecar.scoring import fit_ood_model

    rng = np.random.default_rng(3)
    dim = 12
    centre = np.r_[1.0, np.zeros(dim - 1)]
    kb = centre + 0.3 * rng.normal(size=(80, dim))
    ids, ood = (
        centre + 0.3 * rng.normal(size=(300, dim)),
        -centre + 0.3 * rng.normal(size=(300, dim)),
    )
    model = fit_ood_model(
        kb="t",
        encoder={"name": "fake", "dim": dim},
        kb_embeddings=kb,
        id_embeddings=ids[:200],
        ood_embeddings=ood,
        calibration_embeddings=ids[200:],
        detector="logreg",
        m=3,
        target_frr=0.05,
    )
    drift = -0.5 * centre  # live ID traffic, halfway towards the OOD cloud
    live = centre + drift + 0.3 * rng.normal(size=(2000, dim))
    return model, live


def test_recalibrating_on_drifted_id_queries_brings_the_refusal_rate_back_to_target() -> None:
    from model_store import decode, encode
    from sidecar.scoring import recalibrate

    model, live = _shifted_model()
    cal, judged = live[:400], live[400:]
    before = float(np.mean(model.score(judged) > model.threshold))
    assert before > 0.10  # the drift breaks the trained threshold's 5% promise
    new = recalibrate(model, cal, 0.05)
    after = float(np.mean(new.score(judged) > new.threshold))
    assert after <= 0.05 + 0.02  # 1,600 judged queries: about 1.4 points of noise
    assert new.threshold == conformal_threshold(model.score(cal), 0.05)
    np.testing.assert_array_equal(new.score(judged), model.score(judged))  # nothing refitted
    old = new.metrics["recalibrated_from"]
    assert old["threshold"] == model.threshold
    assert old["calibration_frr"] == model.metrics["calibration_frr"]
    assert old["frr_on_recalibration_queries"] == pytest.approx(
        np.mean(model.score(cal) > model.threshold)
    )
    assert new.metrics["calibration"] == "recalibrated" and new.metrics["n_calibration"] == 400
    assert new.params["target_frr"] == 0.05 and new.version is None
    # a new artifact (new version id) that loads back with the new threshold
    a, b = model_to_artifact(model), model_to_artifact(new)
    assert a.version != b.version
    back = model_from_artifact(decode(*encode(b)))
    assert back.threshold == new.threshold
    assert back.metrics["recalibrated_from"]["threshold"] == model.threshold


def test_recalibration_refuses_too_few_queries_for_the_target() -> None:
    from sidecar.errors import DataError
    from sidecar.scoring import recalibrate

    model, live = _shifted_model()
    with pytest.raises(DataError, match=r"98 ID queries cannot calibrate .* at least 99"):
        recalibrate(model, live[:98], 0.01)
    assert recalibrate(model, live[:99], 0.01).metrics["n_calibration"] == 99


def test_a_balanced_rule_model_recalibrated_says_frr_and_keeps_the_old_rule() -> None:
    import dataclasses

    from sidecar.scoring import recalibrate

    model, live = _shifted_model()
    balanced = dataclasses.replace(model, params={**model.params, "threshold_rule": "balanced"})
    new = recalibrate(balanced, live[:200], 0.05)
    assert new.params["threshold_rule"] == "frr"
    assert new.metrics["recalibrated_from"]["threshold_rule"] == "balanced"
