"""Split-conformal calibration of the decision threshold."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# The default share of answerable (ID) queries the calibrated threshold may refuse. With a
# rate r, balanced accuracy cannot exceed 1 - r / 2 (5 % caps it at 0.975); at 1 % the
# conformal quantile needs at least 99 held-out ID queries to be valid.
DEFAULT_TARGET_FRR = 0.01
# (calibration size, target) pairs already warned about as too small
_WARNED: set[tuple[int, float]] = set()


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
    if rank > n:
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
        rank = n
    return float(s[rank - 1])
