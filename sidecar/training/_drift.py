"""How far the realised false-reject rate may drift from the target: group-wise held-out
calibration.

A conformal threshold keeps its false-reject rate on queries exchangeable with the ones it
was calibrated on. Live users ask about topics, and in wordings, that the calibration set
may not hold. :func:`expected_frr` measures what that does on the training data itself:
the calibration scores are cut into folds, each a set of whole query groups (a question
and its paraphrases, near-duplicates), and each fold is judged at the threshold the other
folds give. The spread over folds is the drift to expect when the live ID traffic holds
groups the calibration set lacks; it says nothing of OOD kinds nobody collected.
"""

from __future__ import annotations

import numpy as np

from sidecar.scoring import conformal_threshold, quiet_calibration
from sidecar.training._splits import group_folds

# Folds of the group-wise held-out calibration (fewer where there are fewer groups).
DRIFT_FOLDS = 5


def expected_frr(
    scores: np.ndarray,
    groups: np.ndarray | None,
    target_frr: float,
    *,
    folds: int = DRIFT_FOLDS,
    seed: int = 0,
) -> dict[str, float | int] | None:
    """False-reject rates of held-out groups of ID queries at the threshold of the others.

    Parameters
    ----------
    scores : ndarray of shape (n,)
        OOD scores of held-out ID queries (out-of-fold, or the calibration split's).
    groups : ndarray of shape (n,) or None
        Group label of each query (None: one group each).
    target_frr : float in (0, 1)

    Returns
    -------
    dict or None
        ``{"target", "mean", "min", "max", "folds", "n"}``: the realised rate averaged over
        the folds (each judged by a threshold it did not calibrate), the best and worst
        fold; None where fewer than two groups leave nothing to hold out.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    g = np.arange(s.size) if groups is None else np.asarray(groups)
    k = min(folds, len(np.unique(g)))
    if k < 2:
        return None
    rates = []
    with quiet_calibration():
        for held in group_folds(g, k, np.random.default_rng(seed)):
            rest = np.setdiff1d(np.arange(s.size), held)
            thr = conformal_threshold(s[rest], target_frr)
            rates.append(float(np.mean(s[held] > thr)))
    return {
        "target": float(target_frr),
        "mean": float(np.mean(rates)),
        "min": min(rates),
        "max": max(rates),
        "folds": k,
        "n": int(s.size),
    }
