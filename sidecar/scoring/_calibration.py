"""Split-conformal calibration of the decision threshold, and recalibration of a trained
model on ID queries from the traffic it serves."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import numpy as np

from sidecar.errors import ConfigError, DataError

if TYPE_CHECKING:
    from sidecar.scoring._model import OODModel

log = logging.getLogger(__name__)

# The default share of answerable (ID) queries the calibrated threshold may refuse. With a
# rate r, balanced accuracy cannot exceed 1 - r / 2 (5 % caps it at 0.975); at 1 % the
# conformal quantile needs at least 99 held-out ID queries to be valid.
DEFAULT_TARGET_FRR = 0.01
# (calibration size, target) pairs already warned about as too small
_WARNED: set[tuple[int, float]] = set()
# Set inside quiet_calibration(): the caller reports calibration sizes itself.
_QUIET: ContextVar[bool] = ContextVar("_QUIET", default=False)


@contextlib.contextmanager
def quiet_calibration() -> Iterator[None]:
    """No "too few calibration queries" warning inside the block (nor is one counted as
    given): for a caller that reports on the calibration that matters itself, as
    ``sidecar train`` does for the shipped threshold while its search calibrates every
    candidate on a small held-out part."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def conformal_threshold(id_scores: Any, target_frr: float) -> float:
    """Threshold on OOD scores so that an exchangeable new ID query is flagged with
    probability at most ``target_frr``.

    With n held-out ID scores and alpha = ``target_frr``, returns the
    ceil((n + 1)(1 - alpha))-th smallest score; a query is OOD when its score is strictly
    greater. If n is too small for that rank (n < 1/alpha - 1), the largest score is
    returned and the guarantee does not hold (a warning is logged).

    Parameters
    ----------
    id_scores : ndarray of shape (n,)
        OOD scores of held-out ID queries (not used for fitting).
    target_frr : float in (0, 1)

    Returns
    -------
    float
    """
    if not 0.0 < target_frr < 1.0:
        raise ConfigError(f"target_frr must be in (0, 1), got {target_frr}")
    s = np.sort(np.asarray(id_scores, dtype=np.float64).ravel())
    if s.size == 0 or not np.isfinite(s).all():
        raise DataError("conformal calibration needs finite scores of held-out ID queries")
    n = s.size
    rank = math.ceil((n + 1) * (1.0 - target_frr))
    if rank > n and not _QUIET.get():
        # once per size and target: a search calibrates every candidate on the same part
        level = logging.DEBUG if (n, target_frr) in _WARNED else logging.WARNING
        _WARNED.add((n, target_frr))
        log.log(
            level,
            "only %s calibration queries: too few for a false-reject rate of %s; "
            "using the largest score",
            n,
            target_frr,
        )
    return float(s[min(rank, n) - 1])


def min_calibration_size(target_frr: float) -> int:
    """The fewest held-out ID scores for which the conformal rank exists at ``target_frr``
    (99 at 1%, 19 at 5%)."""
    if not 0.0 < target_frr < 1.0:
        raise ConfigError(f"target_frr must be in (0, 1), got {target_frr}")
    n = max(1, math.floor((1.0 - target_frr) / target_frr) - 1)
    while math.ceil((n + 1) * (1.0 - target_frr)) > n:
        n += 1
    return n


# Metrics that describe the operating point of the threshold a recalibration replaces.
_OLD_POINT = (
    "calibration",
    "calibration_folds",
    "n_calibration",
    "calibration_frr",
    "calibration_fpr",
    "n_ood_calibration",
    "threshold_rule",
    "oof_false_reject_rate",
    "oof_ood_accept_rate",
    "oof_balanced_accuracy",
)


def recalibrate(
    model: OODModel, id_embeddings: Any, target_frr: float, languages: Any = None
) -> OODModel:
    """``model`` with its threshold recalibrated on new ID queries; nothing else refitted.

    The threshold becomes the split-conformal quantile of the scores of ``id_embeddings``
    for ``target_frr``. When those queries are exchangeable with the ID traffic to come
    (drawn from it, and never trained on), the share of in-domain queries refused is at
    most ``target_frr`` in expectation, whatever the training data: this is how a model
    whose threshold misses its target on live traffic (a shift the training queries did not
    show) gets its promise back without retraining. The figures of the replaced threshold
    move under ``metrics["recalibrated_from"]``, with the rate at which it refused these
    queries; the other metrics (validation, training) are kept as they were. Per-language
    thresholds (:func:`recalibrate_by_language`), calibrated on older traffic, go with the
    old threshold (recorded beside it).

    Parameters
    ----------
    model : OODModel
    id_embeddings : ndarray of shape (n, dim)
        Embeddings of in-domain queries the model has not been fitted on; n at least
        :func:`min_calibration_size` of ``target_frr`` (99 for 1%).
    target_frr : float in (0, 1)
    languages : sequence of str or None, optional
        Each query's language, which a centred model subtracts the mean of
        (:meth:`OODModel.center`); without, a centred model uses its global mean.

    Returns
    -------
    OODModel
        A new model (a new version once stored); ``version`` is None.
    """
    need = min_calibration_size(target_frr)
    scores = model.score(id_embeddings, languages)
    n = int(scores.size)
    if n < need:
        raise DataError(
            f"{n} ID queries cannot calibrate a false-reject rate of {target_frr:g}: "
            f"the conformal quantile needs at least {need}"
        )
    thr = conformal_threshold(scores, target_frr)
    old = {k: model.metrics[k] for k in _OLD_POINT if k in model.metrics}
    old.update(
        {
            "version": model.version,
            "threshold": float(model.threshold),
            "target_frr": model.params.get("target_frr"),
            "threshold_rule": model.params.get("threshold_rule", "frr"),
            "frr_on_recalibration_queries": float(np.mean(scores > model.threshold)),
        }
    )
    if model.language_thresholds:  # calibrated on older traffic: they go with the old point
        old["language_thresholds"] = dict(model.language_thresholds)
    metrics = {
        k: v for k, v in model.metrics.items() if k not in (*_OLD_POINT, "language_calibration")
    }
    metrics.update(
        {
            "calibration": "recalibrated",
            "n_calibration": n,
            "calibration_frr": float(np.mean(scores > thr)),
            "recalibrated_from": old,
        }
    )
    params = {
        **model.params,
        "target_frr": float(target_frr),
        "threshold_rule": "frr",
        "calibration": "recalibrated",
    }
    return dataclasses.replace(
        model,
        threshold=thr,
        metrics=metrics,
        params=params,
        language_thresholds={},
        version=None,
    )
