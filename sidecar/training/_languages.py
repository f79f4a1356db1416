"""Per-language thresholds at training time: each query language with enough ID training
queries gets a conformal threshold of its own, calibrated on the same held-out or
out-of-fold scores as the global threshold (``sidecar train --per-language``).

The calibration scores of the search (:attr:`SearchResult.calibration_scores`) are the
ones the global threshold is the quantile of; the splits' ``id_rows`` say which training
query each came from, so each score meets the language told for its query. A language
with fewer queries than the conformal rank needs (99 for 1 %, 19 for 5 %) keeps the
global threshold, and so does a query whose language could not be told.

A query's language is the one its row gives (``"language"``, a BCP-47 tag read as its
primary subtag), else the language detector's, told as the worker tells a query's
(:func:`query_languages`); ``sidecar calibrate --per-language`` tells them the same way.
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


def query_languages(
    texts: Sequence[str],
    given: Sequence[str | None] | None,
    encoder: str,
    candidates: Sequence[str] = (),
) -> tuple[list[str | None], int]:
    """Each query's language: the one its row gave, else the language detector's.

    The detector chooses among ``candidates`` (``scoring.languages``), else the languages
    of the encoder named ``encoder`` (:func:`sidecar.encoders.detector_languages`), as the
    worker's does; it is not loaded when every row gave its language.

    Parameters
    ----------
    texts : sequence of str, length n
    given : sequence of str or None, length n; or None
        The language code each row gave (None: none); None when no row was read for it.
    encoder : str
        The name of the encoder of the model the languages are for.
    candidates : sequence of str

    Returns
    -------
    languages : list of str, length n
    n_given : int
        How many came from the rows.
    """
    out: list[str | None] = list(given) if given is not None else [None] * len(texts)
    if len(out) != len(texts):
        raise DataError(f"{len(out)} languages for {len(texts)} queries")
    todo = [i for i, lang in enumerate(out) if lang is None]
    if todo:
        from sidecar.encoders import LanguageDetector, detector_languages

        detector = LanguageDetector(detector_languages(encoder, candidates))
        for i, lang in zip(todo, detector.detect([texts[i] for i in todo]), strict=True):
            out[i] = lang
    return out, len(texts) - len(todo)
