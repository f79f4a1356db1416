"""Cross-calibration: out-of-fold scores, the finalists' decision, the shipped model.

Under cross-calibration (the search's default) every ID training query of the splits is
scored by the candidate fitted on the other folds (:func:`out_of_fold`; folds keep
near-duplicate groups whole). The shortlisted finalists are compared by out-of-fold
balanced accuracy at their own conformal thresholds (:func:`decide_out_of_fold`), and the
winner is fitted on every ID training query with the conformal quantile of its
out-of-fold scores as threshold (:func:`cross_calibrated`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import OODModel, conformal_threshold
from sidecar.training._drift import expected_frr
from sidecar.training._fitting import SILENT, fit_candidate
from sidecar.training._grid import Candidate
from sidecar.training._splits import TrainingSplits, group_folds

log = logging.getLogger(__name__)

# Folds of the cross-calibration.
CROSS_FOLDS = 5
# At most this many shortlisted candidates are compared out of fold (each costs
# CROSS_FOLDS fits).
MAX_FINALISTS = 8


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold scores of one candidate over every training query (see out_of_fold)."""

    id_scores: np.ndarray
    ood_scores: np.ndarray | None  # None where the OOD queries were not folded
    folds: int

    def at_threshold(self, target_frr: float) -> dict[str, float] | None:
        """False-reject / OOD-accept rates and balanced accuracy at the conformal threshold
        of the out-of-fold ID scores; None without out-of-fold OOD scores."""
        if self.ood_scores is None:
            return None
        thr = conformal_threshold(self.id_scores, target_frr)
        frr = float(np.mean(self.id_scores > thr))
        oar = float(np.mean(self.ood_scores <= thr))
        return {
            "oof_false_reject_rate": frr,
            "oof_ood_accept_rate": oar,
            "oof_balanced_accuracy": 1.0 - (frr + oar) / 2.0,
        }


def out_of_fold(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    folds: int = CROSS_FOLDS,
    fold_ood: bool = True,
    **fit: Any,
) -> OutOfFold:
    """Score every ID training query of the splits (fit, validation and calibration) by
    ``cand`` fitted on the other folds; with ``fold_ood``, the OOD fit + validation
    queries are folded alongside and scored the same way when they fill the folds.

    Folds keep groups whole (``splits.id_groups`` / ``splits.ood_groups`` where known);
    there are fewer folds where there are fewer ID groups, at least the three carve_splits
    needs. OOD queries not folded (``fold_ood=False``, or in fewer groups than folds) are
    seen by every fit, and there are no out-of-fold OOD scores.
    """
    E, ood = splits.id_all, splits.ood_fit_val
    groups = np.arange(len(E)) if splits.id_groups is None else splits.id_groups
    folds = fold_count(splits, folds)
    rng = np.random.default_rng(fit["seed"])
    id_folds = group_folds(groups, folds, rng)
    # Per fold: the OOD queries its fit sees, and the held-out ones (rows, embeddings).
    ood_folds: list[tuple[np.ndarray | None, np.ndarray, np.ndarray]] = []
    oof_ood = np.empty(0)
    if ood is not None and fold_ood:
        og = np.arange(len(ood)) if splits.ood_groups is None else splits.ood_groups
        if len(np.unique(og)) >= folds:
            ood_folds = [
                (ood[np.setdiff1d(np.arange(len(ood)), h)], h, ood[h])
                for h in group_folds(og, folds, rng)
            ]
            oof_ood = np.empty(len(ood))
    oof = np.empty(len(E))
    for f, held in enumerate(id_folds):
        rest = np.setdiff1d(np.arange(len(E)), held)
        ood_part = ood_folds[f][0] if ood_folds else ood
        # the fold model's own threshold is unused; calibrating it on E only keeps it quiet
        part = TrainingSplits(
            splits.kb, E[rest], E[held], E, ood_part, subspaces=splits.subspaces, deny=splits.deny
        )
        model = fit_candidate(part, cand, final=False, **fit)
        oof[held] = model.score(E[held])
        if ood_folds:
            _, held_ood, held_emb = ood_folds[f]
            oof_ood[held_ood] = model.score(held_emb)
    return OutOfFold(oof, oof_ood if ood_folds else None, folds)


def fold_count(splits: TrainingSplits, folds: int = CROSS_FOLDS) -> int:
    """The folds :func:`out_of_fold` makes (and fits): ``folds``, or fewer where there are
    fewer ID groups (carve_splits needs 3 groups, not 5)."""
    n = len(splits.id_all) if splits.id_groups is None else len(np.unique(splits.id_groups))
    return min(folds, n)


def cross_calibrated(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    oof: OutOfFold | None = None,
    folds: int = CROSS_FOLDS,
    **fit: Any,
) -> tuple[OODModel, OutOfFold]:
    """``cand`` fitted on every ID training query of the splits, its threshold
    cross-calibrated, and the out-of-fold scores it was calibrated on.

    The threshold is the conformal quantile of the out-of-fold scores of every ID training
    query (:func:`out_of_fold`; ``oof`` when the search has them already). Every ID query
    calibrates, instead of the calibration part alone, so the threshold is a less extreme
    order statistic and moves less with the split; the price is the finite-sample
    guarantee, which holds for a split threshold only (the out-of-fold models are not the
    shipped one). The shipped model's OOD side is the OOD fit + validation queries.
    """
    progress = fit.get("progress", SILENT)
    if oof is None:
        progress.planned(fold_count(splits, folds))
        try:
            oof = out_of_fold(splits, cand, folds=folds, **fit)
        except (ConfigError, DataError) as exc:
            # too few OOD queries left in some fold for this candidate: every fold fit
            # sees all of them, as the candidate's own search fit did
            log.info("out-of-fold OOD scores skipped for %s: %s", cand, exc)
            progress.planned(fold_count(splits, folds))
            oof = out_of_fold(splits, cand, folds=folds, fold_ood=False, **fit)
    E, ood = splits.id_all, splits.ood_fit_val
    whole = TrainingSplits(
        splits.kb, E, E[:0], E, ood, subspaces=splits.subspaces, deny=splits.deny
    )
    progress.planned(1)
    model = fit_candidate(whole, cand, final=False, **fit)
    thr = conformal_threshold(oof.id_scores, fit["target_frr"])
    metrics = {
        **model.metrics,
        "calibration": "cross",
        "calibration_folds": oof.folds,
        "n_calibration": int(oof.id_scores.size),
        "calibration_frr": float(np.mean(oof.id_scores > thr)),
        **(oof.at_threshold(fit["target_frr"]) or {}),
        "expected_frr": expected_frr(
            oof.id_scores, splits.id_groups, fit["target_frr"], seed=fit["seed"]
        ),
    }
    params = {**model.params, "calibration": "cross"}
    return dataclasses.replace(model, threshold=thr, metrics=metrics, params=params), oof


def decide_out_of_fold(
    splits: TrainingSplits,
    finalists: Sequence[tuple[int, dict[str, Any], Candidate]],
    how: Mapping[str, Any],
) -> tuple[int, OutOfFold | None]:
    """The finalist with the best out-of-fold balanced accuracy at its own cross-calibrated
    threshold, and its out-of-fold scores (None when the winner has to be rescored).

    ``finalists``: (position in the search's fitted list, table row, candidate), in the
    order validation AUROC prefers them; a tie goes to the earlier one. Each row gains the
    out-of-fold figures. Validation AUROC cannot separate the finalists; the ID and OOD
    training queries, scored out of fold at the operating point the shipped model will run
    at, can (on covid, 357 ID and about 750 OOD queries against a validation split of 73
    ID). A finalist that cannot be fitted on a fold (too few OOD queries left for it) drops
    out; without out-of-fold OOD scores there is nothing to compare and the first finalist
    that could be folded is kept (with its scores); when every finalist drops out, the
    first one is kept and rescored.
    """
    best: tuple[float, int, OutOfFold] | None = None
    how.get("progress", SILENT).planned(len(finalists) * fold_count(splits))
    for rank, (pos, row, cand) in enumerate(finalists):
        row["finalist"] = rank + 1
        try:
            oof = out_of_fold(splits, cand, **how)
        except (ConfigError, DataError) as exc:
            log.info("finalist %s dropped out of fold: %s", cand, exc)
            row["oof_skipped"] = str(exc)
            continue
        figures = oof.at_threshold(float(how["target_frr"]))
        if figures is None:  # the OOD queries do not fill the folds: nothing to compare
            for _, other, _ in finalists:
                other.pop("finalist", None)
                other.pop("oof_skipped", None)
            return pos, oof
        row.update({k: round(v, 6) for k, v in figures.items()})
        if best is None or figures["oof_balanced_accuracy"] > best[0]:
            best = (figures["oof_balanced_accuracy"], pos, oof)
    if best is None:
        return finalists[0][0], None
    return best[1], best[2]
