"""Split-conformal threshold."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.errors import ConfigError
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
