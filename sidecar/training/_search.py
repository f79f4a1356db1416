"""Hyperparameter search on a validation split carved from the training data.

:func:`carve_splits` cuts the labelled training embeddings (never evaluation data) into a
fit part, a validation part and held-out ID calibration queries, with a fixed seed.
:func:`search` fits every candidate of a detector's grid (m, radius quantile, C, ...) on
the fit part, ranks them by validation AUROC (ties: fewer dimensions), refits the winner on
fit + validation and calibrates its threshold with the conformal quantile on the
calibration queries. Neither function accepts evaluation queries.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import OODModel, detector_class, fit_ood_model
from sidecar.training._metrics import auroc

log = logging.getLogger(__name__)

MAX_DIMS = 32
# Residual norms at several k: the combined detector sees all of them.
COMBINED_RESIDUAL_KS = (16, 32, 64)


@dataclass(frozen=True)
class TrainingSplits:
    """Training embeddings cut for search and calibration; shapes (n, dim), float32."""

    kb: np.ndarray
    id_fit: np.ndarray
    id_val: np.ndarray
    id_cal: np.ndarray
    ood_fit: np.ndarray | None = None
    ood_val: np.ndarray | None = None

    @property
    def has_ood(self) -> bool:
        return self.ood_fit is not None and len(self.ood_fit) >= 2


def _take(E: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(E[np.sort(idx)], dtype=np.float32)


def carve_splits(
    kb: np.ndarray,
    id_train: np.ndarray,
    ood_train: np.ndarray | None = None,
    *,
    seed: int = 0,
    val_fraction: float = 0.2,
    cal_fraction: float = 0.2,
    max_id_fit: int = 6000,
    max_ood_fit: int = 4000,
    max_ood_val: int = 2000,
    target_frr: float = 0.05,
) -> TrainingSplits:
    """Cut training embeddings into fit / validation / calibration parts (seeded).

    ID training queries: ``cal_fraction`` to calibration, ``val_fraction`` to validation,
    the rest (at most ``max_id_fit``) to fitting. Calibration gets at least
    ``ceil(1 / target_frr) - 1`` queries when there are enough, the fewest for which the
    conformal quantile can reach ``target_frr``. OOD training queries: a random subset of
    at most ``max_ood_val`` for validation and ``max_ood_fit`` for fitting.
    """
    rng = np.random.default_rng(seed)
    n = len(id_train)
    if n < 5:
        raise DataError(
            f"need at least 5 ID training queries to fit, validate and calibrate; got {n}"
        )
    perm = rng.permutation(n)
    n_cal = max(2, round(cal_fraction * n), min(math.ceil(1 / target_frr) - 1, n // 3))
    n_val = max(2, round(val_fraction * n))
    cal, val, fit = perm[:n_cal], perm[n_cal : n_cal + n_val], perm[n_cal + n_val :][:max_id_fit]
    ood_fit = ood_val = None
    if ood_train is not None and len(ood_train) >= 4:
        operm = rng.permutation(len(ood_train))
        n_oval = min(max_ood_val, max(2, round(val_fraction * len(ood_train))))
        ood_val = _take(ood_train, operm[:n_oval])
        ood_fit = _take(ood_train, operm[n_oval : n_oval + max_ood_fit])
    return TrainingSplits(
        np.asarray(kb, dtype=np.float32),
        _take(id_train, fit),
        _take(id_train, val),
        _take(id_train, cal),
        ood_fit,
        ood_val,
    )


@dataclass(frozen=True)
class Candidate:
    """One point of a search grid."""

    detector: str
    m: int = 13
    params: Mapping[str, Any] = field(default_factory=dict)
    residual_ks: tuple[int, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "m": self.m,
            "params": dict(self.params),
            "residual_ks": list(self.residual_ks) if self.residual_ks else None,
        }


def default_grid(detector: str) -> list[Candidate]:
    """The search grid of ``detector``: m and its own radius / sides / C / width.

    Kept small on purpose: every candidate refits the KB PCA.
    """
    c = Candidate
    if detector in ("epsilon_ball", "epsilon_cube", "epsilon_rect"):
        return [c(detector, m, {"quantile": q}) for m in (8, 13) for q in (0.95, 0.99)]
    if detector == "logreg":
        return [c(detector, m, {"C": C}) for m in (13, MAX_DIMS) for C in (0.1, 1.0)]
    if detector == "svm":
        return [c(detector, 13, {"C": 1.0, "max_samples": 2000})]
    if detector == "gmm":
        return [c(detector, m, {"n_components": 4}) for m in (8, 13)]
    if detector == "residual":
        return [c(detector, 13, {}, (k,)) for k in (32, 64)]
    if detector == "combined":
        n_res = len(COMBINED_RESIDUAL_KS)
        with_cos = {"features": ["pcs", "residual", "max_cosine"]}
        out = [
            c(detector, m, {"C": C, **with_cos}, COMBINED_RESIDUAL_KS)
            for m in (20, MAX_DIMS - n_res - 1)
            for C in (0.1, 1.0)
        ]
        out += [
            c(
                detector,
                MAX_DIMS - n_res,
                {"C": C, "features": ["pcs", "residual"]},
                COMBINED_RESIDUAL_KS,
            )
            for C in (0.1, 1.0)
        ]
        return out
    if detector == "knn":
        return [c(detector, 13, {"n_neighbors": 10})]
    return [c(detector)]  # max_cosine, mahalanobis: nothing to tune


@dataclass
class SearchResult:
    """The refitted, calibrated winner and the whole validation table."""

    model: OODModel
    best: Candidate
    val_auroc: float | None
    table: list[dict[str, Any]]
    val_scores: tuple[np.ndarray, np.ndarray] | None  # (ID, OOD) scores of the winner


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
) -> OODModel:
    id_emb, ood_emb = splits.id_fit, splits.ood_fit
    if final and splits.has_ood and splits.ood_val is not None:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
        ood_emb = np.vstack([splits.ood_fit, splits.ood_val])  # type: ignore[list-item]
    elif final:
        id_emb = np.vstack([splits.id_fit, splits.id_val])
    crit = criterion if splits.has_ood else "evr"
    ks = cand.residual_ks
    if ks is not None:
        k_max = min(64, len(splits.kb) - 1, splits.kb.shape[1])
        ks = tuple(sorted({min(k, k_max) for k in ks}))
    m = min(cand.m, len(splits.kb) - 1)
    return fit_ood_model(
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
        detector_params=dict(cand.params),
        residual_ks=ks,
        pca_method=pca_method,
    )


def search(
    splits: TrainingSplits,
    detector: str,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    criterion: str = "pvalue",
    grid: Sequence[Candidate] | None = None,
    seed: int = 0,
    target_frr: float = 0.05,
    pca_method: str = "auto",
) -> SearchResult:
    """Pick ``detector``'s hyperparameters by validation AUROC, refit, calibrate.

    Without OOD training queries there is no validation AUROC: the grid's first candidate
    that fits is used (the detectors that need OOD labels raise ConfigError).
    """
    cands = list(grid) if grid is not None else default_grid(detector)
    if not cands:
        raise ConfigError(f"empty search grid for {detector!r}")
    if detector_class(detector).needs_ood and not splits.has_ood:
        raise ConfigError(f"detector {detector!r} needs OOD training queries")
    table: list[dict[str, Any]] = []
    best: tuple[float, int, int] | None = None
    best_cand: Candidate | None = None
    best_scores = None
    can_rank = splits.has_ood and splits.ood_val is not None
    for i, cand in enumerate(cands):
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
            key = (val, -model.dims, -i)
            if best is None or key > best:
                best, best_cand, best_scores = key, cand, (s_id, s_ood)
        elif best_cand is None:
            best_cand = cand
        table.append(row)
        if not can_rank:
            break
    if best_cand is None:
        raise ConfigError(f"no candidate of {detector!r} could be fitted: {table}")
    model = _fit(
        splits,
        best_cand,
        kb_name=kb_name,
        encoder=encoder,
        criterion=criterion,
        seed=seed,
        target_frr=target_frr,
        final=True,
        pca_method=pca_method,
    )
    return SearchResult(model, best_cand, None if best is None else best[0], table, best_scores)


_FULL_SPACE = frozenset({"max_cosine", "knn", "mahalanobis"})


def fixed_fit(
    splits: TrainingSplits,
    cand: Candidate,
    *,
    kb_name: str,
    encoder: Mapping[str, Any],
    criterion: str,
    seed: int = 0,
    target_frr: float = 0.05,
    pca_method: str = "auto",
) -> OODModel:
    """Fit one candidate on fit + validation and calibrate it (no search)."""
    return _fit(
        splits,
        cand,
        kb_name=kb_name,
        encoder=encoder,
        criterion=criterion,
        seed=seed,
        target_frr=target_frr,
        final=True,
        pca_method=pca_method,
    )
