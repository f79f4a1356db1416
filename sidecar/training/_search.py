"""Hyperparameter search on a validation split carved from the training data.

:func:`carve_splits` cuts the labelled training embeddings (never evaluation data) into a
fit part, a validation part and held-out ID calibration queries, with a fixed seed.
:func:`search` fits every candidate of a detector's grid (m, radius quantile, C, ...) on
the fit part and ranks them by validation AUROC. The candidates within one standard error
of the best form a shortlist (the one-standard-error rule; ``selection="best"`` keeps the
best alone). With split calibration the shortlist's smallest candidate (fewest input
dimensions) wins; it is refitted on fit + validation and calibrated on the calibration
queries. With cross-calibration, the default, the shortlisted candidates (the first
``MAX_FINALISTS`` of it, fewest dimensions first) are scored out of fold on every
ID training query and on the OOD fit + validation queries, and the one with the best
out-of-fold balanced accuracy at its own cross-calibrated threshold wins: validation
AUROC cannot tell the shortlist apart, the operating point the model will run at,
measured on all those queries, can (where the OOD queries cannot fill the folds, the
shortlist's first wins). The winner is fitted on every ID training query of the splits
and keeps the threshold of its out-of-fold scores. The threshold is the conformal
quantile for a target false-reject rate (``threshold_rule="frr"``, the default), or the
one that maximises balanced accuracy on held-out ID and OOD calibration queries
(``"balanced"``, split calibration). The refit has seen the validation split, so every
figure reported as "validation" comes from the winner as fitted on the fit part only
(``SearchResult.val_model``). Neither function accepts evaluation queries.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import (
    DEFAULT_TARGET_FRR,
    OODModel,
    conformal_threshold,
    detector_class,
    fit_ood_model,
)
from sidecar.training._grid import MAX_DIMS, Candidate, default_grid
from sidecar.training._metrics import auroc, auroc_standard_error
from sidecar.training._splits import TrainingSplits, group_folds

# PC selection criteria, in the order ``criterion="auto"`` prefers them on a tie.
CRITERIA = ("pvalue", "evr")

log = logging.getLogger(__name__)

THRESHOLD_RULES = ("frr", "balanced")
# How the search shortlists its candidates (see shortlist).
SELECTIONS = ("one_se", "best")
# How the shipped model's conformal threshold is calibrated (see search).
CALIBRATIONS = ("split", "cross")
# Folds of the cross-calibration.
CROSS_FOLDS = 5
# At most this many shortlisted candidates are compared out of fold (each costs
# CROSS_FOLDS fits).
MAX_FINALISTS = 8


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


_SILENT = _Silent()


def resolve_calibration(threshold_rule: str, calibration: str | None) -> str:
    """The calibration a search uses: ``None`` means cross for the frr rule, else split."""
    if calibration is None:
        return "cross" if threshold_rule == "frr" else "split"
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"calibration must be one of {CALIBRATIONS}, not {calibration!r}")
    if calibration == "cross" and threshold_rule != "frr":
        raise ConfigError("cross-calibration applies to the 'frr' threshold rule only")
    return calibration


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


@dataclass(frozen=True)
class Ranked:
    """One fitted candidate's validation figures, as :func:`shortlist` sees them."""

    val_auroc: float
    dims: int
    n_id: int
    n_ood: int


def shortlist(rows: Sequence[Ranked], selection: str = "one_se") -> list[int]:
    """Positions in ``rows`` (grid order) of the candidates validation cannot tell apart,
    in the order validation prefers them; the first is the pick where validation decides
    alone (split calibration).

    ``"best"``: the highest validation AUROC alone (ties: fewer dimensions, then grid
    order). ``"one_se"``: every candidate whose validation AUROC is within one standard
    error (Hanley & McNeil) of the best one's, fewest dimensions first, then the higher
    AUROC, then grid order. A difference smaller than the validation split can measure
    does not buy extra dimensions: the smaller model is cheaper and, with few labelled
    queries, generalises better (the one-standard-error rule of Breiman et al., 1984).
    """
    if selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {SELECTIONS}, not {selection!r}")
    if not rows:
        raise ValueError("no candidates to pick from")
    best = max(range(len(rows)), key=lambda j: (rows[j].val_auroc, -rows[j].dims, -j))
    if selection == "best":
        return [best]
    top = rows[best]
    floor = top.val_auroc - auroc_standard_error(top.val_auroc, top.n_id, top.n_ood)
    near = [j for j, r in enumerate(rows) if r.val_auroc >= floor]
    return sorted(near, key=lambda j: (rows[j].dims, -rows[j].val_auroc, j))


@dataclass
class SearchResult:
    """The refitted, calibrated winner and the whole validation table.

    ``model`` is what ships: refitted on fit + validation (split calibration) or on every
    ID training query (cross-calibration); ``val_model`` is the same
    candidate fitted on the fit part only and calibrated the same way, the model that
    ``val_auroc`` and ``val_scores`` (out of sample) belong to.
    """

    model: OODModel
    best: Candidate
    val_auroc: float | None
    table: list[dict[str, Any]]
    val_scores: tuple[np.ndarray, np.ndarray] | None  # (ID, OOD) scores of val_model
    val_model: OODModel


def _fit(
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
    progress: FitProgress = _SILENT,
) -> OODModel:
    id_emb, ood_emb = splits.id_fit, splits.ood_fit
    if final and splits.has_ood and splits.ood_val is not None:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
        ood_emb = splits.ood_fit_val
    elif final:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
    crit = criterion if splits.has_ood else "evr"
    ks = cand.residual_ks
    if ks is not None:
        k_max = min(64, len(splits.kb) - 1, splits.kb.shape[1])
        ks = tuple(sorted({min(k, k_max) for k in ks}))
    m = min(cand.m, len(splits.kb) - 1)
    params = dict(cand.params)
    if "knn_ks" in params:
        params["knn_ks"] = [min(int(k), len(splits.kb)) for k in params["knn_ks"]]
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
            m=m,
            target_frr=target_frr,
            seed=seed,
            detector_params=params,
            residual_ks=ks,
            pca_method=pca_method,
            subspaces=splits.subspaces,
        )
    finally:
        progress.fitted()
    if not final or threshold_rule == "frr":
        return model
    return _balanced(model, splits)


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold scores of one candidate over every training query (see _out_of_fold)."""

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


def _out_of_fold(
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
    folds = _fold_count(splits, folds)
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
        part = TrainingSplits(splits.kb, E[rest], E[held], E, ood_part, subspaces=splits.subspaces)
        model = _fit(part, cand, final=False, **fit)
        oof[held] = model.score(E[held])
        if ood_folds:
            _, held_ood, held_emb = ood_folds[f]
            oof_ood[held_ood] = model.score(held_emb)
    return OutOfFold(oof, oof_ood if ood_folds else None, folds)


def _fold_count(splits: TrainingSplits, folds: int = CROSS_FOLDS) -> int:
    """The folds :func:`_out_of_fold` makes (and fits): ``folds``, or fewer where there are
    fewer ID groups (carve_splits needs 3 groups, not 5)."""
    n = len(splits.id_all) if splits.id_groups is None else len(np.unique(splits.id_groups))
    return min(folds, n)


def _cross_calibrated(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    oof: OutOfFold | None = None,
    folds: int = CROSS_FOLDS,
    **fit: Any,
) -> OODModel:
    """``cand`` fitted on every ID training query of the splits, its threshold
    cross-calibrated.

    The threshold is the conformal quantile of the out-of-fold scores of every ID training
    query (:func:`_out_of_fold`; ``oof`` when the search has them already). Every ID query
    calibrates, instead of the calibration part alone, so the threshold is a less extreme
    order statistic and moves less with the split; the price is the finite-sample
    guarantee, which holds for a split threshold only (the out-of-fold models are not the
    shipped one). The shipped model's OOD side is the OOD fit + validation queries.
    """
    progress = fit.get("progress", _SILENT)
    if oof is None:
        progress.planned(_fold_count(splits, folds))
        try:
            oof = _out_of_fold(splits, cand, folds=folds, **fit)
        except (ConfigError, DataError) as exc:
            # too few OOD queries left in some fold for this candidate: every fold fit
            # sees all of them, as the candidate's own search fit did
            log.info("out-of-fold OOD scores skipped for %s: %s", cand, exc)
            progress.planned(_fold_count(splits, folds))
            oof = _out_of_fold(splits, cand, folds=folds, fold_ood=False, **fit)
    E, ood = splits.id_all, splits.ood_fit_val
    whole = TrainingSplits(splits.kb, E, E[:0], E, ood, subspaces=splits.subspaces)
    progress.planned(1)
    model = _fit(whole, cand, final=False, **fit)
    thr = conformal_threshold(oof.id_scores, fit["target_frr"])
    metrics = {
        **model.metrics,
        "calibration": "cross",
        "calibration_folds": oof.folds,
        "n_calibration": int(oof.id_scores.size),
        "calibration_frr": float(np.mean(oof.id_scores > thr)),
        **(oof.at_threshold(fit["target_frr"]) or {}),
    }
    params = {**model.params, "calibration": "cross"}
    return dataclasses.replace(model, threshold=thr, metrics=metrics, params=params)


def _balanced(model: OODModel, splits: TrainingSplits) -> OODModel:
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


def search(
    splits: TrainingSplits,
    detector: str,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    criterion: str = "pvalue",
    grid: Sequence[Candidate] | None = None,
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    pca_method: str = "auto",
    threshold_rule: str = "frr",
    selection: str = "one_se",
    calibration: str | None = None,
    progress: FitProgress | None = None,
) -> SearchResult:
    """Shortlist ``detector``'s hyperparameters by validation AUROC, decide, refit, calibrate.

    ``selection``: how the validation AUROCs shortlist the candidates (:func:`shortlist`);
    the kept row of the returned table has ``"picked": True``. ``calibration`` (threshold
    rule ``"frr"``): ``"cross"`` (the default, ``None``) compares the shortlisted
    candidates out of fold at the operating point (:func:`_decide_out_of_fold`; their rows
    gain ``finalist`` and ``oof_*`` figures), fits the winner on all ID training queries
    and calibrates on their out-of-fold scores (:func:`_cross_calibrated`); ``"split"``
    keeps the shortlist's first, refits it on fit + validation and calibrates on the
    calibration part (the finite-sample conformal guarantee holds).

    ``criterion``: ``"pvalue"``, ``"evr"``, or ``"auto"``, which searches the grid under
    both and keeps the better of the two winners (p-value on a tie; its table rows carry a
    ``criterion`` key): by out-of-fold balanced accuracy under cross-calibration, as each
    winner was chosen, else by validation AUROC. ``threshold_rule``: ``"frr"`` (conformal
    quantile for ``target_frr``) or ``"balanced"`` (best balanced accuracy on
    ``splits.id_cal`` / ``splits.ood_cal``).

    Without OOD training queries there is no validation AUROC: the grid's first candidate
    that fits is used (the detectors that need OOD labels raise ConfigError), and the
    PCs are chosen by EVR. ``progress`` is told about every model fit (both searches' under
    ``"auto"``).
    """
    progress = progress or _SILENT
    if criterion == "auto":
        if not splits.has_ood:
            criterion = "evr"
        else:
            runs = {
                c: search(
                    splits,
                    detector,
                    kb_name=kb_name,
                    encoder=encoder,
                    criterion=c,
                    grid=grid,
                    seed=seed,
                    target_frr=target_frr,
                    pca_method=pca_method,
                    threshold_rule=threshold_rule,
                    selection=selection,
                    calibration=calibration,
                    progress=progress,
                )
                for c in CRITERIA
            }

            # The runs' winners compared as each was chosen: by out-of-fold balanced
            # accuracy where both have it (cross-calibration), else by validation AUROC.
            key = "oof_balanced_accuracy"
            by_oof = all(key in runs[c].model.metrics for c in CRITERIA)

            def ranked(c: str) -> float:
                v = runs[c].model.metrics[key] if by_oof else runs[c].val_auroc
                return -math.inf if v is None else float(v)

            win = max(CRITERIA, key=ranked)  # the first of CRITERIA (p-value) on a tie
            rows = [
                {**row, "criterion": c, "picked": c == win and bool(row.get("picked"))}
                for c in CRITERIA
                for row in runs[c].table
            ]
            return dataclasses.replace(runs[win], table=rows)
    cands = list(grid) if grid is not None else default_grid(detector)
    if not cands:
        raise ConfigError(f"empty search grid for {detector!r}")
    if threshold_rule not in THRESHOLD_RULES:
        raise ConfigError(
            f"threshold rule must be one of {THRESHOLD_RULES}, got {threshold_rule!r}"
        )
    if detector_class(detector).needs_ood and not splits.has_ood:
        raise ConfigError(f"detector {detector!r} needs OOD training queries")
    if selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {SELECTIONS}, not {selection!r}")
    calibration = resolve_calibration(threshold_rule, calibration)
    table: list[dict[str, Any]] = []
    best_cand: Candidate | None = None
    best_model: OODModel | None = None
    best_scores = None
    val_auroc: float | None = None
    # (validation figures, table row, candidate, model fitted on the fit part, val scores)
    fitted: list[tuple[Ranked, dict[str, Any], Candidate, OODModel, Any]] = []
    can_rank = splits.has_ood and splits.ood_val is not None
    if can_rank:
        progress.planned(len(cands))
    for cand in cands:
        if not can_rank:  # the first candidate that fits is used
            progress.planned(1)
        try:
            model = _fit(
                splits,
                cand,
                kb_name=kb_name,
                encoder=encoder,
                criterion=criterion,
                seed=seed,
                target_frr=target_frr,
                final=False,
                pca_method=pca_method,
                progress=progress,
            )
        except (ConfigError, DataError) as exc:
            log.info("candidate %s skipped: %s", cand, exc)
            table.append({**cand.describe(), "skipped": str(exc)})
            continue
        if model.dims > MAX_DIMS and model.detector_name not in _FULL_SPACE:
            table.append({**cand.describe(), "skipped": f"{model.dims} dims > {MAX_DIMS}"})
            continue
        row = {**cand.describe(), "dims": model.dims}
        if can_rank:
            s_id, s_ood = model.score(splits.id_val), model.score(splits.ood_val)
            val = auroc(s_id, s_ood)
            row["val_auroc"] = round(val, 6)
            figures = Ranked(val, model.dims, int(s_id.size), int(s_ood.size))
            fitted.append((figures, row, cand, model, (s_id, s_ood)))
        elif best_cand is None:
            best_cand, best_model = cand, model
            row["picked"] = True
        table.append(row)
        if not can_rank:
            break
    how: dict[str, Any] = {
        "kb_name": kb_name,
        "encoder": encoder,
        "criterion": criterion,
        "seed": seed,
        "target_frr": target_frr,
        "pca_method": pca_method,
        "progress": progress,
    }
    oof: OutOfFold | None = None
    if fitted:
        order = shortlist([r[0] for r in fitted], selection)
        pos = order[0]
        if calibration == "cross" and len(order) > 1:
            pos, oof = _decide_out_of_fold(
                splits, [(j, fitted[j][1], fitted[j][2]) for j in order[:MAX_FINALISTS]], how
            )
        kept, kept_row, best_cand, best_model, best_scores = fitted[pos]
        kept_row["picked"] = True
        val_auroc = kept.val_auroc
    if best_cand is None or best_model is None:
        reasons = Counter(str(row.get("skipped", "not ranked")) for row in table)
        summary = "; ".join(f"{why} ({n} of {len(table)})" for why, n in reasons.items())
        raise ConfigError(f"no candidate of {detector!r} could be fitted: {summary}")
    if calibration == "cross":
        model = _cross_calibrated(splits, best_cand, oof=oof, **how)
    else:
        progress.planned(1)
        model = _fit(splits, best_cand, final=True, threshold_rule=threshold_rule, **how)
        model = dataclasses.replace(
            model,
            metrics={**model.metrics, "calibration": "split"},
            params={**model.params, "calibration": "split"},
        )
    val_model = best_model if threshold_rule == "frr" else _balanced(best_model, splits)
    return SearchResult(model, best_cand, val_auroc, table, best_scores, val_model)


def _decide_out_of_fold(
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
    how.get("progress", _SILENT).planned(len(finalists) * _fold_count(splits))
    for rank, (pos, row, cand) in enumerate(finalists):
        row["finalist"] = rank + 1
        try:
            oof = _out_of_fold(splits, cand, **how)
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


_FULL_SPACE = frozenset({"max_cosine", "knn", "mahalanobis"})


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
    return _fit(
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
