"""Recalibrate a trained model's threshold on new in-domain queries, as a new artifact.

Behind ``sidecar calibrate``: the threshold becomes the conformal quantile of the scores
of ID queries drawn from live traffic (:func:`sidecar.scoring.recalibrate`); nothing else
is refitted. :func:`recalibrate_release` adds what a release needs around it: the target
rate (the model's own by default), the new artifact, and how many of the queries repeat
the model's training queries (their figures are optimistic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_store import Artifact
from sidecar.errors import DataError
from sidecar.persistence import model_to_artifact
from sidecar.scoring import DEFAULT_TARGET_FRR, OODModel, recalibrate, recalibrate_by_language


@dataclass(frozen=True)
class Recalibration:
    """A recalibrated model: the new ``model`` and its ``artifact`` (a new version), the
    ``target_frr`` it was calibrated to, the replaced threshold's figures (``source``,
    the new model's ``metrics["recalibrated_from"]``) and ``training_copies``, the number
    of queries that repeat the model's training queries (0 for a model that keeps none)."""

    model: OODModel
    artifact: Artifact
    target_frr: float
    source: dict[str, Any]
    training_copies: int


def recalibrate_release(
    model: OODModel,
    E: np.ndarray,
    target_frr: float | None = None,
    languages: Sequence[str | None] | None = None,
    live: np.ndarray | None = None,
    *,
    query_languages: Sequence[str | None] | None = None,
    live_languages: Sequence[str | None] | None = None,
) -> Recalibration:
    """``model`` recalibrated on ``E`` for ``target_frr`` (default: the model's own target);
    with ``languages`` (each query's), also per language
    (:func:`sidecar.scoring.recalibrate_by_language`).

    Parameters
    ----------
    model : OODModel
    E : ndarray of shape (n, dim)
        In-domain query embeddings the model was not fitted on.
    target_frr : float in (0, 1) or None
        False-reject rate to calibrate to; None keeps the model's own target
        (``params["target_frr"]``, else ``DEFAULT_TARGET_FRR``).
    languages : sequence of str or None
        Each query's language: also a threshold per language with enough queries.
    live : ndarray of shape (n_live, dim) or None
        A sample of unlabelled live traffic (ID and OOD as they come): the share the new
        threshold refuses is recorded as ``metrics["calibration_ood_share"]``, the share
        the worker exports and compares its live OOD share with.
    query_languages, live_languages : sequence of str or None, optional
        Each query's (each live query's) language, for a model centred by language
        (:meth:`~sidecar.scoring.OODModel.center`); ``languages`` serves when given.
        Without, a centred model uses its global mean.
    """
    target = target_frr or float(model.params.get("target_frr") or DEFAULT_TARGET_FRR)
    told = languages if languages is not None else query_languages
    if languages is None:
        new = recalibrate(model, E, target, told)
    else:
        new = recalibrate_by_language(model, E, languages, target)
    if live is not None:
        if len(live) == 0:
            raise DataError("the live traffic sample is empty")
        refused = new.predict(live, live_languages)
        new = new.with_metrics(
            calibration_ood_share=float(np.mean(refused)), n_live_sample=len(live)
        )
    copies = model.training_copies(E, told)
    return Recalibration(
        model=new,
        artifact=model_to_artifact(new),
        target_frr=target,
        source=new.metrics["recalibrated_from"],
        training_copies=0 if copies is None else int(copies.sum()),
    )
