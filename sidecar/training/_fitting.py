"""One candidate of a search grid fitted on the training splits, and its threshold.

:func:`fit_candidate` fits a :class:`~sidecar.training._grid.Candidate` on the fit part of
:class:`~sidecar.training._splits.TrainingSplits` (or, ``final``, on fit + validation) and
calibrates it on the held-out ID queries; :func:`fixed_fit` is the same without a search
around it. :func:`balanced_threshold` is the ``"balanced"`` threshold rule. The search
(:mod:`sidecar.training._search`) and the cross-calibration
(:mod:`sidecar.training._cross`) fit every model through here, and tell a
:class:`FitProgress` about each fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import DEFAULT_TARGET_FRR, OODModel, fit_ood_model
from sidecar.training._grid import Candidate
from sidecar.training._splits import TrainingSplits

THRESHOLD_RULES = ("frr", "balanced")


class FitProgress(Protocol):
    """Told about a search's model fits, e.g. to drive a progress bar: ``planned(n)`` when
    ``n`` more fits are due (the total grows as the search learns how many finalists and
    folds it needs), ``fitted()`` after each one, a candidate that could not be fitted
    included. Fits planned for a finalist that drops out of fold are not all run, so the
    fitted count can end below the planned one, never above it."""

    def planned(self, n: int) -> None: ...

    def fitted(self) -> None: ...


class _Silent:
    def planned(self, n: int) -> None:
        pass

    def fitted(self) -> None:
        pass


SILENT = _Silent()


def balanced_threshold(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    """The threshold maximising balanced accuracy of ``score > threshold`` = OOD.

    Among the maximising thresholds, the middle one of the best run is returned, placed
    halfway between two adjacent observed scores.

    Parameters
    ----------
    id_scores : ndarray of shape (n_id,)
        Scores of held-out ID queries.
    ood_scores : ndarray of shape (n_ood,)
        Scores of held-out OOD queries.

    Returns
    -------
    float
    """
    s_id = np.asarray(id_scores, dtype=np.float64).ravel()
    s_ood = np.asarray(ood_scores, dtype=np.float64).ravel()
    if s_id.size == 0 or s_ood.size == 0:
        raise DataError("a balanced threshold needs held-out ID and OOD scores")
    cuts = np.unique(np.concatenate([s_id, s_ood]))
    # threshold candidates: below everything, between neighbours, at the top
    cand = np.concatenate([[cuts[0] - 1.0], (cuts[:-1] + cuts[1:]) / 2.0, [cuts[-1]]])
    tpr_id = np.searchsorted(np.sort(s_id), cand, side="right") / s_id.size  # ID accepted
    tnr_ood = 1.0 - np.searchsorted(np.sort(s_ood), cand, side="right") / s_ood.size
    ba = (tpr_id + tnr_ood) / 2.0
    best = np.flatnonzero(ba >= ba.max() - 1e-12)
    return float(cand[best[len(best) // 2]])


def fit_candidate(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    criterion: str,
    seed: int,
    target_frr: float,
    final: bool,
    pca_method: str = "auto",
    threshold_rule: str = "frr",
    progress: FitProgress = SILENT,
) -> OODModel:
    """``cand`` fitted on the fit part (``final``: fit + validation), its PCs and residual
    ks clipped to what the KB allows, calibrated on ``splits.id_cal``; with ``final`` and
    the ``"balanced"`` rule, its threshold then moved to the best balanced accuracy."""
    id_emb, ood_emb = splits.id_fit, splits.ood_fit
    if final and splits.has_ood and splits.ood_val is not None:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
        ood_emb = splits.ood_fit_val
    elif final:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
    crit = criterion if splits.has_ood else "evr"
    fit = cand.fitted_to_kb(*splits.kb.shape)
    try:
        model = fit_ood_model(
            kb=kb_name,
            encoder=encoder,
            kb_embeddings=splits.kb,
            id_embeddings=id_emb,
            ood_embeddings=ood_emb if splits.has_ood else None,
            calibration_embeddings=splits.id_cal,
            detector=cand.detector,
            criterion=crit,
            m=fit.m,
            target_frr=target_frr,
            seed=seed,
            detector_params=dict(fit.params),
            residual_ks=fit.residual_ks,
            pca_method=pca_method,
            subspaces=splits.subspaces,
            deny_topics=splits.deny,
        )
    finally:
        progress.fitted()
    if not final or threshold_rule == "frr":
        return model
    return with_balanced_threshold(model, splits)


def with_balanced_threshold(model: OODModel, splits: TrainingSplits) -> OODModel:
    """``model`` with its threshold moved to the best balanced accuracy on calibration data."""
    if splits.ood_cal is None:
        raise ConfigError(
            "threshold rule 'balanced' needs OOD training queries to hold some out for "
            "calibration (at least 8)"
        )
    s_id, s_ood = model.score(splits.id_cal), model.score(splits.ood_cal)
    thr = balanced_threshold(s_id, s_ood)
    metrics = {
        **model.metrics,
        "threshold_rule": "balanced",
        "n_ood_calibration": int(s_ood.size),
        "calibration_frr": float(np.mean(s_id > thr)),
        "calibration_fpr": float(np.mean(s_ood <= thr)),
    }
    params = {**model.params, "threshold_rule": "balanced"}
    return dataclasses.replace(model, threshold=thr, metrics=metrics, params=params)


def fixed_fit(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    criterion: str,
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    pca_method: str = "auto",
    final: bool = True,
) -> OODModel:
    """Fit one candidate and calibrate it (no search).

    ``final=True`` fits on fit + validation (a model to use); ``final=False`` on the fit
    part only, for figures scored on the validation split.
    """
    return fit_candidate(
        splits,
        cand,
        kb_name=kb_name,
        encoder=encoder,
        criterion=criterion,
        seed=seed,
        target_frr=target_frr,
        final=final,
        pca_method=pca_method,
    )
