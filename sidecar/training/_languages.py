"""Per-language thresholds at training time: each query language with enough ID training
queries gets a conformal threshold of its own, calibrated on the same held-out or
out-of-fold scores as the global threshold (``sidecar train --per-language``).

The calibration scores of the search (:attr:`SearchResult.calibration_scores`) are the
ones the global threshold is the quantile of; the splits' ``id_rows`` say which training
query each came from, so each score meets the language told for its query. A language
with fewer queries than the conformal rank needs (99 for 1 %, 19 for 5 %) keeps the
global threshold, and so does a query whose language could not be told.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import OODModel, with_language_thresholds
from sidecar.training._search import SearchResult
from sidecar.training._splits import TrainingSplits


def calibrate_languages(
    model: OODModel,
    search: SearchResult,
    splits: TrainingSplits,
    languages: Sequence[str | None],
    target_frr: float,
) -> OODModel:
    """``model`` (the search's shipped one) with per-language thresholds.

    Parameters
    ----------
    model : OODModel
    search : SearchResult
        The search that made ``model``; its ``calibration_scores`` are reused.
    splits : TrainingSplits
        The splits it searched; ``id_rows`` map their rows to the training queries.
    languages : sequence of str or None
        The language of each ID training query, in the order they were given.
    target_frr : float in (0, 1)
    """
    if search.calibration_scores is None:
        raise ConfigError("per-language thresholds are conformal: they need the frr threshold rule")
    if splits.id_rows is None:
        raise DataError("the splits do not say which training query each row is")
    if int(splits.id_rows.max(initial=-1)) >= len(languages):
        raise DataError(
            f"{len(languages)} languages for at least {int(splits.id_rows.max()) + 1} "
            "ID training queries"
        )
    positions, scores = search.calibration_scores
    langs = [languages[int(splits.id_rows[p])] for p in positions]
    return with_language_thresholds(model, scores, langs, target_frr)
