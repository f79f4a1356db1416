"""Per-language thresholds: one conformal threshold per query language that has enough ID
queries to calibrate it, the global threshold for every other.

One threshold can refuse a language's answerable queries far more often than the target
says: an encoder places one language's queries a little further from the KB than
another's, and a threshold calibrated on a mix of languages (or on the KB's language
alone) sits where the mix put it. Calibrating each language on its own ID queries gives
each its own false-reject rate back; a language with too few queries for the conformal
rank keeps the global threshold, whose guarantee covers the mix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._calibration import conformal_threshold, min_calibration_size, recalibrate

if TYPE_CHECKING:
    from sidecar.scoring._model import OODModel

# What a language detector says when it cannot tell: such queries meet the global threshold.
UNDETERMINED_LANGUAGE = "und"


def language_thresholds(
    id_scores: Any, languages: Sequence[str | None], target_frr: float
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Conformal thresholds per language, and what each rests on.

    Parameters
    ----------
    id_scores : ndarray of shape (n,)
        OOD scores of held-out ID queries.
    languages : sequence of str or None, length n
        Each query's language; None and ``"und"`` calibrate no language.
    target_frr : float in (0, 1)

    Returns
    -------
    thresholds : dict of str to float
        Languages with at least :func:`min_calibration_size` queries.
    table : dict of str to dict
        Per language seen: ``n``, its ``threshold`` (None: too few, the global one
        applies) and ``calibration_frr`` at it.
    """
    s = np.asarray(id_scores, dtype=np.float64).ravel()
    if len(languages) != s.size:
        raise DataError(f"{len(languages)} languages for {s.size} calibration scores")
    need = min_calibration_size(target_frr)
    by_lang: dict[str, list[int]] = {}
    for i, lang in enumerate(languages):
        if lang and lang != UNDETERMINED_LANGUAGE:
            by_lang.setdefault(lang, []).append(i)
    thresholds: dict[str, float] = {}
    table: dict[str, dict[str, Any]] = {}
    for lang in sorted(by_lang):
        ls = s[by_lang[lang]]
        thr = conformal_threshold(ls, target_frr) if ls.size >= need else None
        if thr is not None:
            thresholds[lang] = thr
        table[lang] = {
            "n": int(ls.size),
            "threshold": thr,
            "calibration_frr": None if thr is None else float(np.mean(ls > thr)),
        }
    return thresholds, table


def with_language_thresholds(
    model: OODModel, id_scores: Any, languages: Sequence[str | None], target_frr: float
) -> OODModel:
    """``model`` with a threshold per language calibrated on ``id_scores``, its global
    threshold kept.

    Each language with at least :func:`min_calibration_size` of the scores gets the
    conformal threshold of its own (``language_thresholds``); ``metrics["language_calibration"]``
    records every language seen, with its count, threshold (None: it keeps the global
    one) and false-reject rate on its calibration scores; ``params["language_calibration"]``
    says ``"per-language"``. ``version`` becomes None (a new artifact).

    Parameters
    ----------
    model : OODModel
    id_scores : ndarray of shape (n,)
        ``model``'s OOD scores of ID queries it was not fitted on (held out, or out of fold:
        the scores its global threshold was calibrated on).
    languages : sequence of str or None, length n
        Each query's language; None and ``"und"`` calibrate no language.
    target_frr : float in (0, 1)
    """
    thresholds, table = language_thresholds(id_scores, languages, target_frr)
    metrics = {**model.metrics, "language_calibration": table}
    params = {**model.params, "language_calibration": "per-language"}
    return dataclasses.replace(
        model, language_thresholds=thresholds, metrics=metrics, params=params, version=None
    )


def recalibrate_by_language(
    model: OODModel, id_embeddings: Any, languages: Sequence[str | None], target_frr: float
) -> OODModel:
    """``model`` recalibrated on new ID queries, globally and per language.

    The global threshold is :func:`recalibrate`'s on every query; each language with at
    least :func:`min_calibration_size` of them gets its own conformal threshold on its
    queries alone (:func:`with_language_thresholds`).

    Parameters
    ----------
    model : OODModel
    id_embeddings : ndarray of shape (n, dim)
        In-domain queries the model was not fitted on.
    languages : sequence of str or None, length n
        Each query's detected language.
    target_frr : float in (0, 1)
    """
    E = np.asarray(id_embeddings)
    if len(languages) != len(E):
        raise DataError(f"{len(languages)} languages for {len(E)} calibration queries")
    out = recalibrate(model, E, target_frr, languages)
    return with_language_thresholds(out, out.score(E, languages), languages, target_frr)
