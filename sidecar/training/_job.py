"""The retraining job: inputs to a calibrated, searched, reported model.

Steps: read the KB and labelled queries (or precomputed embeddings), embed what is text
(cached), carve fit / validation / calibration splits (seeded), search the detector's
hyperparameters on validation AUROC (the candidates within one standard error of the best
are the finalists; cross-calibration keeps the finalist with the best out-of-fold balanced
accuracy at its threshold, split calibration the one with the fewest dimensions), refit and
calibrate the conformal threshold, then build the artifact and the report. Wall time and
peak memory are recorded.

The shipped model is refitted on fit + validation (split calibration) or on every ID
training query of the splits (cross-calibration, the default; the fit part holds at most
6,000, so above about 10,000 ID queries the rest are left out), so it is never scored on
the validation split: every ``val_*`` metric and every validation figure of the report
comes from models fitted on the fit part only.
"""

from __future__ import annotations

import functools
import logging
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import (
    PROBE_TEXTS,
    CombinedDetector,
    DenyTopics,
    OODModel,
    detector_kinds,
)
from sidecar.training._centering import centering_stats, centred_inputs
from sidecar.training._fitting import FitProgress
from sidecar.training._grid import MAX_DIMS, Candidate, combined_grid, default_grid
from sidecar.training._languages import calibrate_languages
from sidecar.training._metrics import auroc, balanced_accuracy, fpr_at_tpr, paper_accuracy
from sidecar.training._search import FULL_SPACE_DETECTORS, search
from sidecar.training._splits import (
    OOD_CAL_FRACTION,
    TrainingSplits,
    carve_splits,
    near_duplicate_groups,
)
from sidecar.training._train_config import TrainConfig, TrainInputs, TrainResult

log = logging.getLogger(__name__)


def check_config(cfg: TrainConfig, kb_shape: tuple[int, int] | None = None) -> None:
    """Refuse a configuration no search could fit, before any input is read.

    With ``kb_shape`` (documents, dimensions) the candidates are judged as that KB clips
    them (fewer PCs and merged residual ks on a tiny KB); without, as requested.
    """
    kinds = detector_kinds()
    if cfg.detector not in kinds:
        raise ConfigError(f"unknown detector {cfg.detector!r}; one of {', '.join(kinds)}")
    top = cfg.m if cfg.m is not None else (cfg.m_range[1] if cfg.m_range else None)
    if top is not None and top > MAX_DIMS and cfg.detector not in FULL_SPACE_DETECTORS:
        raise ConfigError(
            f"m={top}: {cfg.detector} models take at most {MAX_DIMS} input dimensions "
            "(the PCs and any extra features), the budget that keeps scoring in microseconds"
        )
    if cfg.per_language and cfg.threshold_rule != "frr":
        raise ConfigError(
            "per-language thresholds are conformal quantiles: they need the frr threshold rule"
        )
    if cfg.floor is not None and cfg.detector != "combined":
        flag = "--floor" if cfg.floor else "--no-floor"
        raise ConfigError(f"{flag} applies to the combined detector, not {cfg.detector!r}")
    if cfg.neighbour_bank is not None:
        feats = cfg.features
        if cfg.detector != "combined" or (feats is not None and "neighbours" not in feats):
            raise ConfigError(
                "--neighbour-bank applies to the combined detector's neighbours block"
            )
    if cfg.features is not None:
        blocks = CombinedDetector.FEATURE_BLOCKS
        if cfg.detector != "combined":
            raise ConfigError(f"--features applies to the combined detector, not {cfg.detector!r}")
        unknown = [f for f in cfg.features if f not in blocks]
        if not cfg.features or unknown:
            raise ConfigError(
                f"--features takes blocks among {','.join(blocks)}; "
                f"got {','.join(cfg.features) or 'none'}"
            )
    low = cfg.m if cfg.m is not None else (cfg.m_range[0] if cfg.m_range else None)
    if low is not None and cfg.detector == "combined":
        grid = build_grid(cfg)
        if kb_shape is not None:
            grid = [c.fitted_to_kb(*kb_shape) for c in grid]
        fewest = min(grid, key=lambda c: c.m + _extra_dims(c))
        least = _extra_dims(fewest)
        if fewest.m + least > MAX_DIMS:  # every candidate would be fitted, then dropped
            raise ConfigError(
                f"m={low}: combined models add at least {least} features to their PCs "
                f"and take at most {MAX_DIMS} input dimensions in all; use m <= "
                f"{MAX_DIMS - least}"
            )


def _extra_dims(cand: Candidate) -> int:
    """Features a combined candidate adds to its m PCs (see ``OODModel.dims``)."""
    det = CombinedDetector(**cand.params)
    sizes = {
        "residual": len(cand.residual_ks) if cand.residual_ks else 1,  # else one k
        "max_cosine": 1,
        "knn": len(det.knn_ks),
        "neighbours": 2 * len(det.neighbour_ks),
    }
    return sum(sizes.get(block, 0) for block in det.inputs)


def parse_m_range(text: str) -> tuple[int, int]:
    """``"8:32"`` -> (8, 32)."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"--m-range must look like 8:32, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ConfigError(f"--m-range needs 1 <= low <= high, got {text!r}")
    return lo, hi


def _m_values(lo: int, hi: int) -> list[int]:
    return sorted({round(float(v)) for v in np.linspace(lo, hi, min(5, hi - lo + 1))})


def build_grid(cfg: TrainConfig) -> list[Candidate]:
    """The detector's default grid with m fixed (``m``) or spread over ``m_range``."""
    if cfg.detector == "combined":
        base = combined_grid(cfg.features, cfg.neighbour_bank, floor=cfg.floor is not False)
    else:
        base = default_grid(cfg.detector)
    if cfg.m is None and cfg.m_range is None:
        return base
    ms = [cfg.m] if cfg.m is not None else _m_values(*cfg.m_range)  # type: ignore[misc]
    seen: dict[tuple[Any, ...], Candidate] = {}
    for c in base:
        for m in ms:
            new = replace(c, m=int(m))
            seen.setdefault((m, repr(sorted(c.params.items())), c.residual_ks), new)
    return list(seen.values())


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (ru_maxrss is KiB on Linux, B on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024)


def _validation_metrics(model: OODModel, splits: TrainingSplits) -> dict[str, Any]:
    """``model``'s metrics on the validation split, at its own threshold.

    ``model`` must not have been fitted on the validation split (``SearchResult.val_model``).
    Its threshold (``val_threshold``) is split-calibrated on the calibration part, whatever
    the shipped model's calibration.
    """
    s_id = model.score(splits.id_val)
    out: dict[str, Any] = {"n_id_val": len(s_id), "val_threshold": float(model.threshold)}
    if splits.ood_val is None:
        out["val_frr"] = float(np.mean(s_id > model.threshold))
        return out
    s_ood = model.score(splits.ood_val)
    out.update(
        {
            "n_ood_val": len(s_ood),
            "val_auroc": auroc(s_id, s_ood),
            "val_fpr_at_95tpr": fpr_at_tpr(s_id, s_ood),
            "val_balanced_accuracy": balanced_accuracy(s_id, s_ood, model.threshold),
            "val_paper_accuracy": paper_accuracy(s_id, s_ood, model.threshold),
        }
    )
    return out


# Told how the near-duplicate comparison of a set of training queries goes:
# (which set, "ID" or "OOD", rows done, rows).
GroupingProgress = Callable[[str, int, int], None]


def query_groups(
    inputs: TrainInputs, cfg: TrainConfig, progress: GroupingProgress | None = None
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Group labels of the ID and OOD training queries (None: one group per query).

    The given groups (paraphrases), joined with near-duplicates unless
    ``cfg.group_near_duplicates`` is off. The splits keep each group in one of fit /
    validation / calibration, and cross-calibration keeps it in one fold: a calibration
    query whose near copy was fitted on scores as more in-domain than a new query does,
    and the threshold would then refuse more in-domain traffic than its target.
    """
    out: list[np.ndarray | None] = []
    for kind, E, given in (
        ("ID", inputs.id_queries, inputs.id_groups),
        ("OOD", inputs.ood_queries, inputs.ood_groups),
    ):
        if E is None:
            out.append(None)
        elif cfg.group_near_duplicates:
            told = None if progress is None else functools.partial(progress, kind)
            out.append(near_duplicate_groups(E, given, progress=told))
        else:  # carve_splits checks the labels against the rows
            out.append(None if given is None else np.asarray(given))
    return out[0], out[1]


def _n_groups(groups: np.ndarray | None, n: int) -> int:
    return n if groups is None else len(np.unique(groups))


@dataclass(frozen=True)
class GroupedSplits:
    """The training splits and the groups they keep whole."""

    splits: TrainingSplits
    # Number of ID / OOD groups over every training query (the query count when each
    # query is its own group).
    n_id_groups: int
    n_ood_groups: int
    # Whether near-duplicates were joined (False when off, or when the groups they made
    # were too large to split and the job fell back to the given groups alone).
    near_duplicates_grouped: bool


def grouped_splits(
    inputs: TrainInputs,
    cfg: TrainConfig,
    progress: GroupingProgress | None = None,
    group_on: TrainInputs | None = None,
) -> GroupedSplits:
    """The seeded fit / validation / calibration cut (plus OOD calibration for 'balanced'),
    each group of training queries whole in one part.

    A small training set whose near-duplicate groups no split can place (e.g. 5 ID queries,
    two of them near copies) falls back to the given groups, with a warning, rather than
    failing; an error then means the given groups themselves are too large.
    ``group_on``: the same inputs as encoded, when ``inputs`` are centred (the
    near-duplicate cosine is a property of the texts, measured where it was chosen).
    """
    grouping = group_on or inputs
    id_groups, ood_groups = query_groups(grouping, cfg, progress)
    joined = cfg.group_near_duplicates

    def carve(id_g: np.ndarray | None, ood_g: np.ndarray | None) -> TrainingSplits:
        return carve_splits(
            inputs.kb,
            inputs.id_queries,
            inputs.ood_queries,
            seed=cfg.seed,
            target_frr=cfg.target_frr,
            ood_cal_fraction=OOD_CAL_FRACTION if cfg.threshold_rule == "balanced" else 0.0,
            id_groups=id_g,
            ood_groups=ood_g,
            deny=deny_topics_of(inputs),
        )

    try:
        splits = carve(id_groups, ood_groups)
    except DataError as exc:
        if not joined:
            raise
        joined = False
        id_groups, ood_groups = query_groups(grouping, replace(cfg, group_near_duplicates=False))
        splits = carve(id_groups, ood_groups)  # fails again where groups were not the cause
        log.warning("%s; split without near-duplicate groups instead", exc)
    n_ood = 0 if inputs.ood_queries is None else len(inputs.ood_queries)
    return GroupedSplits(
        splits,
        _n_groups(id_groups, len(inputs.id_queries)),
        _n_groups(ood_groups, n_ood),
        joined,
    )


def deny_topics_of(inputs: TrainInputs) -> DenyTopics | None:
    """The denied topics ``inputs`` carry, or None."""
    if inputs.deny_embeddings is None:
        return None
    return DenyTopics(tuple(inputs.deny_topics), inputs.deny_embeddings)


def _splits(inputs: TrainInputs, cfg: TrainConfig) -> TrainingSplits:
    """Just the splits of :func:`grouped_splits`."""
    return grouped_splits(inputs, cfg).splits


def train(
    inputs: TrainInputs,
    cfg: TrainConfig,
    tick: Callable[[str], None] | None = None,
    fits: FitProgress | None = None,
) -> TrainResult:
    """Search, fit and calibrate one model.

    ``tick(step)`` is called as each step starts (``"split"``, then ``"search"``; while
    near-duplicates are grouped, ``"grouping ID queries 4,000/20,000"`` and so on), and
    ``fits`` is told about every model fit of the search.
    """
    step = tick or (lambda _s: None)
    t0 = time.perf_counter()
    if inputs.kb.ndim != 2 or inputs.kb.shape[1] != int(inputs.encoder["dim"]):
        raise DataError(f"KB embeddings of shape {inputs.kb.shape} do not match the encoder")
    check_config(cfg, (int(inputs.kb.shape[0]), int(inputs.kb.shape[1])))
    if cfg.per_language and inputs.id_languages is None:
        raise DataError("per-language thresholds need the language of each ID training query")
    if inputs.id_languages is not None and len(inputs.id_languages) != len(inputs.id_queries):
        raise DataError(
            f"{len(inputs.id_languages)} languages for {len(inputs.id_queries)} ID training queries"
        )
    raw, centering = inputs, None
    if cfg.center_languages:
        inputs, centering = centred_inputs(inputs)
    step("split")
    grouped = grouped_splits(
        inputs,
        cfg,
        lambda kind, done, n: step(f"grouping {kind} queries {done:,}/{n:,}"),
        group_on=raw,
    )
    splits = grouped.splits
    step("search")
    t1 = time.perf_counter()
    res = search(
        splits,
        cfg.detector,
        kb_name=inputs.kb_name,
        encoder=inputs.encoder,
        criterion=cfg.criterion,
        grid=build_grid(cfg),
        seed=cfg.seed,
        target_frr=cfg.target_frr,
        pca_method=cfg.pca_method,
        threshold_rule=cfg.threshold_rule,
        calibration=cfg.calibration,
        progress=fits,
    )
    t2 = time.perf_counter()
    validation = _validation_metrics(res.val_model, splits)
    stats = {
        "n_kb": len(inputs.kb),
        "n_id_queries": len(inputs.id_queries),
        "n_ood_queries": 0 if inputs.ood_queries is None else len(inputs.ood_queries),
        # groups the splits and folds keep whole (queries, when each is its own)
        "n_id_groups": grouped.n_id_groups,
        "n_ood_groups": grouped.n_ood_groups,
        "near_duplicates_grouped": grouped.near_duplicates_grouped,
        # queries in the splits: the fit parts' caps (6,000 ID, 4,000 + 2,000 OOD) leave
        # the rest out
        "n_id_used": len(splits.id_all),
        "n_ood_used": sum(
            len(p) for p in (splits.ood_fit, splits.ood_val, splits.ood_cal) if p is not None
        ),
        "candidates": len(res.table),
        "search_and_fit_s": round(t2 - t1, 3),
        "train_total_s": round(t2 - t0, 3),
        "pca_method": res.model.params.get("pca_method"),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        **({"centering": centering_stats(centering)} if centering is not None else {}),
    }
    model = res.model.with_metrics(
        **{k: v for k, v in validation.items()}, val_auroc_search=res.val_auroc
    )
    if cfg.per_language:
        assert inputs.id_languages is not None
        # whose word each ID query's language is: its row's, or the detector's
        stats["id_languages_given"] = inputs.id_languages_given
        stats["id_languages_detected"] = len(inputs.id_languages) - inputs.id_languages_given
        model = calibrate_languages(model, res, splits, inputs.id_languages, cfg.target_frr)
    if inputs.encoder_probes is not None:
        model = replace(
            model, encoder_probes=inputs.encoder_probes, encoder_probe_texts=PROBE_TEXTS
        )
    if centering is not None:  # last: everything above scored centred embeddings as given
        model = replace(model, centering=centering)
    return TrainResult(model, res, stats, validation, splits)
