"""Hyperparameter search on a validation split carved from the training data.

:func:`run_search` (or :func:`search`, the same with keyword settings) fits every
candidate of a detector's grid (m, radius quantile, C, ...) on the fit part of the
:func:`carve_splits` splits and ranks them by validation AUROC; the one-standard-error
shortlist (:mod:`._shortlist`) keeps those it cannot tell apart. With split calibration
the shortlist's smallest candidate (fewest input dimensions) wins; it is refitted on fit +
validation and calibrated on the calibration queries. With cross-calibration, the default,
the shortlisted candidates (the first ``MAX_FINALISTS`` of it, fewest dimensions first)
are scored out of fold on every ID training query and on the OOD fit + validation queries,
and the one with the best out-of-fold balanced accuracy at its own cross-calibrated
threshold wins: validation AUROC cannot tell the shortlist apart, the operating point the
model will run at, measured on all those queries, can (where the OOD queries cannot fill
the folds, the shortlist's first wins). The winner is fitted on every ID training query of
the splits and keeps the threshold of its out-of-fold scores. The threshold is the
conformal quantile for a target false-reject rate (``threshold_rule="frr"``, the default),
or the one that maximises balanced accuracy on held-out ID and OOD calibration queries
(``"balanced"``, split calibration). The refit has seen the validation split, so every
figure reported as "validation" comes from the winner as fitted on the fit part only
(``SearchResult.val_model``). No evaluation query reaches the search.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import (
    DEFAULT_TARGET_FRR,
    OODModel,
    detector_class,
    detector_table,
    needs_ood_error,
)
from sidecar.training._cross import MAX_FINALISTS, OutOfFold, cross_calibrated, decide_out_of_fold
from sidecar.training._drift import expected_frr
from sidecar.training._fitting import (
    SILENT,
    THRESHOLD_RULES,
    FitProgress,
    fit_candidate,
    with_balanced_threshold,
)
from sidecar.training._grid import MAX_DIMS, Candidate, default_grid
from sidecar.training._metrics import auroc
from sidecar.training._shortlist import SELECTIONS, Ranked, shortlist
from sidecar.training._splits import TrainingSplits

log = logging.getLogger(__name__)

# PC selection criteria, in the order ``criterion="auto"`` prefers them on a tie.
CRITERIA = ("pvalue", "evr")
# How the shipped model's conformal threshold is calibrated (see search).
CALIBRATIONS = ("split", "cross")
# Detectors in the full embedding space (the registry's ``full_space``): the MAX_DIMS
# budget does not apply to them.
FULL_SPACE_DETECTORS = frozenset(k for k in detector_table() if detector_class(k).full_space)


def resolve_calibration(threshold_rule: str, calibration: str | None) -> str:
    """The calibration a search uses: ``None`` means cross for the frr rule, else split."""
    if calibration is None:
        return "cross" if threshold_rule == "frr" else "split"
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"calibration must be one of {CALIBRATIONS}, not {calibration!r}")
    if calibration == "cross" and threshold_rule != "frr":
        raise ConfigError("cross-calibration applies to the 'frr' threshold rule only")
    return calibration


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
    # (positions in splits.id_all, scores): the held-out or out-of-fold ID scores the
    # shipped conformal threshold is the quantile of (None under the balanced rule); a
    # per-language calibration reuses them.
    calibration_scores: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class SearchConfig:
    """How :func:`run_search` searches a detector's grid, decides and calibrates.

    ``criterion``: ``"pvalue"``, ``"evr"`` or ``"auto"`` (both, the better winner kept).
    ``grid``: the candidates (None: the detector's :func:`default_grid`). ``seed`` seeds
    every fit and fold. ``target_frr``: target false-reject rate of the threshold.
    ``pca_method``: the KB subspace's solver. ``threshold_rule``: ``"frr"`` or
    ``"balanced"``. ``selection``: how validation shortlists (:func:`shortlist`).
    ``calibration``: ``"split"``, ``"cross"`` or None (:func:`resolve_calibration`).
    """

    criterion: str = "pvalue"
    grid: tuple[Candidate, ...] | None = None
    seed: int = 0
    target_frr: float = DEFAULT_TARGET_FRR
    pca_method: str = "auto"
    threshold_rule: str = "frr"
    selection: str = "one_se"
    calibration: str | None = None


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
    """:func:`run_search` with the :class:`SearchConfig` fields as keyword arguments."""
    config = SearchConfig(
        criterion=criterion,
        grid=None if grid is None else tuple(grid),
        seed=seed,
        target_frr=target_frr,
        pca_method=pca_method,
        threshold_rule=threshold_rule,
        selection=selection,
        calibration=calibration,
    )
    return run_search(splits, detector, config, kb_name=kb_name, encoder=encoder, progress=progress)


def run_search(
    splits: TrainingSplits,
    detector: str,
    config: SearchConfig,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    progress: FitProgress | None = None,
) -> SearchResult:
    """Shortlist ``detector``'s hyperparameters by validation AUROC, decide, refit, calibrate.

    ``config.selection``: how the validation AUROCs shortlist the candidates
    (:func:`shortlist`); the kept row of the returned table has ``"picked": True``.
    ``config.calibration`` (threshold rule ``"frr"``): ``"cross"`` (the default, ``None``)
    compares the shortlisted candidates out of fold at the operating point
    (:func:`decide_out_of_fold`; their rows gain ``finalist`` and ``oof_*`` figures), fits
    the winner on all ID training queries and calibrates on their out-of-fold scores
    (:func:`cross_calibrated`); ``"split"`` keeps the shortlist's first, refits it on fit +
    validation and calibrates on the calibration part (the finite-sample conformal guarantee
    holds).

    ``config.criterion``: ``"pvalue"``, ``"evr"``, or ``"auto"``, which searches the grid
    under both and keeps the better of the two winners (p-value on a tie; its table rows
    carry a ``criterion`` key): by out-of-fold balanced accuracy under cross-calibration, as
    each winner was chosen, else by validation AUROC. ``config.threshold_rule``: ``"frr"``
    (conformal quantile for ``target_frr``) or ``"balanced"`` (best balanced accuracy on
    ``splits.id_cal`` / ``splits.ood_cal``).

    Without OOD training queries there is no validation AUROC: the grid's first candidate
    that fits is used (the detectors that need OOD labels raise ConfigError), and the PCs
    are chosen by EVR. ``progress`` is told about every model fit (both searches' under
    ``"auto"``).
    """
    progress = progress or SILENT
    if config.criterion == "auto":
        if splits.has_ood:
            return _search_both_criteria(splits, detector, config, kb_name, encoder, progress)
        config = dataclasses.replace(config, criterion="evr")
    cands, calibration = _checked_search(splits, detector, config)
    how: dict[str, Any] = {
        "kb_name": kb_name,
        "encoder": encoder,
        "criterion": config.criterion,
        "seed": config.seed,
        "target_frr": config.target_frr,
        "pca_method": config.pca_method,
        "progress": progress,
    }
    graded = _score_grid(splits, cands, how)
    oof: OutOfFold | None = None
    if graded.fitted:
        pos, oof = _decide(splits, graded.fitted, config.selection, calibration, how)
        kept, kept_row, cand, fit_only, scores = graded.fitted[pos]
        kept_row["picked"] = True
        graded = dataclasses.replace(
            graded, first=(cand, fit_only), scores=scores, val_auroc=kept.val_auroc
        )
    if graded.first is None:
        reasons = Counter(str(row.get("skipped", "not ranked")) for row in graded.table)
        summary = "; ".join(f"{why} ({n} of {len(graded.table)})" for why, n in reasons.items())
        raise ConfigError(f"no candidate of {detector!r} could be fitted: {summary}")
    best_cand, best_model = graded.first
    model, cal_scores = _refit_and_calibrate(
        splits, best_cand, oof, calibration, config.threshold_rule, how
    )
    result = _assemble(splits, model, best_cand, best_model, graded, config.threshold_rule)
    return dataclasses.replace(result, calibration_scores=cal_scores)


def _search_both_criteria(
    splits: TrainingSplits,
    detector: str,
    config: SearchConfig,
    kb_name: str,
    encoder: Mapping[str, Any],
    progress: FitProgress,
) -> SearchResult:
    """``criterion="auto"``: the search under each of CRITERIA, the better winner kept
    (see :func:`run_search`), both tables merged."""
    runs: dict[str, SearchResult] = {}
    refused: dict[str, DataError] = {}
    for c in CRITERIA:
        try:
            runs[c] = run_search(
                splits,
                detector,
                dataclasses.replace(config, criterion=c),
                kb_name=kb_name,
                encoder=encoder,
                progress=progress,
            )
        except DataError as exc:  # e.g. too few ID queries for the t-test
            refused[c] = exc
    if not runs:
        raise refused[CRITERIA[0]]
    for c, why in refused.items():
        log.warning("criterion auto: %s criterion left out: %s", c, why)

    # The runs' winners compared as each was chosen: by out-of-fold balanced
    # accuracy where both have it (cross-calibration), else by validation AUROC.
    key = "oof_balanced_accuracy"
    by_oof = all(key in r.model.metrics for r in runs.values())

    def ranked(c: str) -> float:
        v = runs[c].model.metrics[key] if by_oof else runs[c].val_auroc
        return -math.inf if v is None else float(v)

    win = max(runs, key=ranked)  # the first of CRITERIA (p-value) on a tie
    rows = [
        {
            **row,
            "criterion": c,
            "picked": c == win and bool(row.get("picked")),
            # the other criterion's own pick, compared with the winner and beaten
            "criterion_pick": c != win and bool(row.get("picked")),
        }
        for c in runs
        for row in runs[c].table
    ]
    rows += [{"criterion": c, "m": "-", "skipped": str(why)} for c, why in refused.items()]
    return dataclasses.replace(runs[win], table=rows)


def _checked_search(
    splits: TrainingSplits, detector: str, config: SearchConfig
) -> tuple[list[Candidate], str]:
    """The grid to search and the calibration to use; ConfigError or DataError for a
    search that could not succeed, said in terms of the input."""
    cands = list(config.grid) if config.grid is not None else default_grid(detector)
    if not cands:
        raise ConfigError(f"empty search grid for {detector!r}")
    if config.threshold_rule not in THRESHOLD_RULES:
        raise ConfigError(
            f"threshold rule must be one of {THRESHOLD_RULES}, got {config.threshold_rule!r}"
        )
    if detector_class(detector).needs_ood and not splits.has_ood:
        raise ConfigError(needs_ood_error(detector))
    if config.selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {SELECTIONS}, not {config.selection!r}")
    if config.criterion == "pvalue" and splits.has_ood and len(splits.id_fit) < 2:
        # Every candidate would fail its t-test alike: say why once, in terms of the input.
        n_held = len(splits.id_val) + len(splits.id_cal)
        raise DataError(
            f"p-value selection needs at least 2 ID training queries to fit on; "
            f"{len(splits.id_fit) + n_held} leave {len(splits.id_fit)} once validation and "
            f"calibration take {n_held}: give more ID training queries, or --criterion evr"
        )
    return cands, resolve_calibration(config.threshold_rule, config.calibration)


# (validation figures, table row, candidate, model fitted on the fit part, val scores)
_Fitted = tuple[Ranked, dict[str, Any], Candidate, OODModel, Any]


@dataclass(frozen=True)
class _Graded:
    """The grid fitted on the fit part: the table, the ranked candidates, and the pick
    (the first candidate that fits where nothing can be ranked)."""

    table: list[dict[str, Any]]
    fitted: list[_Fitted]
    first: tuple[Candidate, OODModel] | None = None
    scores: tuple[np.ndarray, np.ndarray] | None = None
    val_auroc: float | None = None


def _score_grid(splits: TrainingSplits, cands: Sequence[Candidate], how: dict[str, Any]) -> _Graded:
    """Fit every candidate on the fit part and score it on the validation split; without
    OOD validation queries, stop at the first candidate that fits."""
    progress = how["progress"]
    table: list[dict[str, Any]] = []
    fitted: list[_Fitted] = []
    can_rank = splits.has_ood and splits.ood_val is not None
    if can_rank:
        progress.planned(len(cands))
    for cand in cands:
        if not can_rank:  # the first candidate that fits is used
            progress.planned(1)
        try:
            model = fit_candidate(splits, cand, final=False, **how)
        except (ConfigError, DataError) as exc:
            log.info("candidate %s skipped: %s", cand, exc)
            table.append({**cand.describe(), "skipped": str(exc)})
            continue
        if model.dims > MAX_DIMS and not detector_class(model.detector_name).full_space:
            table.append({**cand.describe(), "skipped": f"{model.dims} dims > {MAX_DIMS}"})
            continue
        row = {**cand.describe(), "dims": model.dims}
        table.append(row)
        if not can_rank:
            row["picked"] = True
            return _Graded(table, fitted, first=(cand, model))
        s_id, s_ood = model.score(splits.id_val), model.score(splits.ood_val)
        val = auroc(s_id, s_ood)
        row["val_auroc"] = round(val, 6)
        figures = Ranked(val, model.dims, int(s_id.size), int(s_ood.size))
        fitted.append((figures, row, cand, model, (s_id, s_ood)))
    return _Graded(table, fitted)


def _decide(
    splits: TrainingSplits,
    fitted: Sequence[_Fitted],
    selection: str,
    calibration: str,
    how: dict[str, Any],
) -> tuple[int, OutOfFold | None]:
    """The position in ``fitted`` of the kept candidate: the shortlist's first, or under
    cross-calibration its best out of fold (with those out-of-fold scores)."""
    order = shortlist([r[0] for r in fitted], selection)
    if calibration == "cross" and len(order) > 1:
        finalists = [(j, fitted[j][1], fitted[j][2]) for j in order[:MAX_FINALISTS]]
        return decide_out_of_fold(splits, finalists, how)
    return order[0], None


def _refit_and_calibrate(
    splits: TrainingSplits,
    cand: Candidate,
    oof: OutOfFold | None,
    calibration: str,
    threshold_rule: str,
    how: dict[str, Any],
) -> tuple[OODModel, tuple[np.ndarray, np.ndarray] | None]:
    """The shipped model: ``cand`` cross-calibrated on every ID training query, or refitted
    on fit + validation and calibrated on the calibration part; and the ID scores its
    conformal threshold is the quantile of, with their positions in ``splits.id_all``
    (None under the balanced rule)."""
    if calibration == "cross":
        model, done = cross_calibrated(splits, cand, oof=oof, **how)
        return model, (np.arange(done.id_scores.size), done.id_scores)
    how["progress"].planned(1)
    model = fit_candidate(splits, cand, final=True, threshold_rule=threshold_rule, **how)
    n_cal = len(splits.id_cal)
    cal_groups = None if splits.id_groups is None else splits.id_groups[-n_cal:]
    s_cal = model.score(splits.id_cal)
    drift = expected_frr(s_cal, cal_groups, how["target_frr"], seed=how["seed"])
    model = dataclasses.replace(
        model,
        metrics={**model.metrics, "calibration": "split", "expected_frr": drift},
        params={**model.params, "calibration": "split"},
    )
    if threshold_rule != "frr":
        return model, None
    n_all = len(splits.id_fit) + len(splits.id_val) + n_cal
    return model, (np.arange(n_all - n_cal, n_all), s_cal)


def _assemble(
    splits: TrainingSplits,
    model: OODModel,
    best_cand: Candidate,
    best_model: OODModel,
    graded: _Graded,
    threshold_rule: str,
) -> SearchResult:
    """The result: the shipped model, and the fit-only model its validation figures are of
    (at the threshold rule the shipped one uses)."""
    val_model = (
        best_model if threshold_rule == "frr" else with_balanced_threshold(best_model, splits)
    )
    return SearchResult(model, best_cand, graded.val_auroc, graded.table, graded.scores, val_model)
