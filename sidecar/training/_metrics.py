"""Detection metrics. Scores are OOD scores: higher means more out-of-domain.

OOD is the positive class for AUROC. FPR at 95% TPR follows the OOD literature: the
threshold accepts 95% of the ID queries, and the figure is the share of OOD queries
accepted with them.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

# The figures of one detector on one KB (and of their means) in an evaluation report.
METRIC_KEYS = (
    "auroc",
    "fpr_at_95tpr",
    "balanced_accuracy",
    "paper_accuracy",
    "false_reject_rate",
    "ood_accept_rate",
    "dims",
    "us_per_query",
)


def _scores(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(id_scores, dtype=np.float64).ravel()
    b = np.asarray(ood_scores, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("need at least one ID and one OOD score")
    return a, b


def auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    """Area under the ROC curve, OOD positive."""
    a, b = _scores(id_scores, ood_scores)
    y = np.r_[np.zeros(a.size), np.ones(b.size)]
    return float(roc_auc_score(y, np.r_[a, b]))


def fpr_at_tpr(id_scores: np.ndarray, ood_scores: np.ndarray, tpr: float = 0.95) -> float:
    """Share of OOD scores at or below the threshold that accepts ``tpr`` of the ID scores."""
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    a, b = _scores(id_scores, ood_scores)
    thr = np.sort(a)[int(np.ceil(tpr * a.size)) - 1]
    return float(np.mean(b <= thr))


# False-positive rates (in-domain queries refused) at which an evaluation report keeps the
# ROC curve: dense at the low rates an operator sets a threshold at, sparse above.
ROC_FPR_GRID = (
    0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.7, 0.8, 0.9, 1.0,
)  # fmt: skip


def roc_points(
    id_scores: np.ndarray, ood_scores: np.ndarray, fpr_grid: tuple[float, ...] = ROC_FPR_GRID
) -> dict[str, list[float]]:
    """The ROC curve (OOD positive) sampled at ``fpr_grid``.

    Returns ``{"fpr": [...], "tpr": [...]}``: for each false-positive rate (share of ID
    scores above the threshold), the largest true-positive rate (share of OOD scores above
    it) any threshold reaches without exceeding that rate. Curves sampled on one grid can be
    averaged across KBs point by point.
    """
    a, b = _scores(id_scores, ood_scores)
    y = np.r_[np.zeros(a.size), np.ones(b.size)]
    fpr, tpr, _ = roc_curve(y, np.r_[a, b], drop_intermediate=False)
    grid = np.asarray(fpr_grid, dtype=np.float64)
    # roc_curve's fpr is non-decreasing: the last point at or below each grid rate has the
    # highest tpr reachable there.
    idx = np.searchsorted(fpr, grid + 1e-12, side="right") - 1
    return {"fpr": [float(x) for x in grid], "tpr": [round(float(tpr[i]), 5) for i in idx]}


def balanced_accuracy(id_scores: np.ndarray, ood_scores: np.ndarray, threshold: float) -> float:
    """Mean of the ID accept rate and the OOD reject rate; OOD means ``score > threshold``."""
    a, b = _scores(id_scores, ood_scores)
    return float((np.mean(a <= threshold) + np.mean(b > threshold)) / 2)


def paper_accuracy(
    id_scores: np.ndarray, ood_scores: np.ndarray, threshold: float, seed: int = 0
) -> float:
    """Accuracy on a balanced sample: the larger side is subsampled (seeded) to the smaller."""
    a, b = _scores(id_scores, ood_scores)
    n = min(a.size, b.size)
    rng = np.random.default_rng(seed)
    a = rng.choice(a, n, replace=False) if a.size > n else a
    b = rng.choice(b, n, replace=False) if b.size > n else b
    return float((np.sum(a <= threshold) + np.sum(b > threshold)) / (2 * n))


def auroc_standard_error(value: float, n_id: int, n_ood: int) -> float:
    """Standard error of an AUROC of ``value`` measured on ``n_id`` ID and ``n_ood`` OOD scores.

    Hanley & McNeil (1982), "The meaning and use of the area under a ROC curve", eq. 2,
    with their exponential approximations of Q1 and Q2. Zero for a perfect separation.
    """
    if n_id < 1 or n_ood < 1:
        raise ValueError("need at least one ID and one OOD score")
    a = float(value)
    q1, q2 = a / (2.0 - a), 2.0 * a * a / (1.0 + a)
    var = (a * (1.0 - a) + (n_ood - 1) * (q1 - a * a) + (n_id - 1) * (q2 - a * a)) / (n_id * n_ood)
    return float(np.sqrt(max(var, 0.0)))
