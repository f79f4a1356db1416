"""The report of a ``sidecar train`` run: what it shows, from fit-only models.

:func:`report_data` gathers the ROC curves of each detector and baseline, the ID / OOD
score histograms, accuracy against m under both criteria and the loadings of the selected
PCs; every validation figure comes from a model fitted without the validation split.
:func:`build_report` writes the page (:mod:`sidecar.training._report`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import OODModel, detector_table
from sidecar.training._fitting import fixed_fit, with_balanced_threshold
from sidecar.training._grid import MAX_DIMS, default_grid
from sidecar.training._job import grouped_splits
from sidecar.training._metrics import paper_accuracy
from sidecar.training._report import ReportData, pc_loadings, write_report
from sidecar.training._splits import TrainingSplits
from sidecar.training._train_config import TrainConfig, TrainInputs, TrainResult

# The detectors whose ROC the report draws: every one, in the registry's table order.
REPORT_DETECTORS = detector_table()
M_CURVE = (4, 8, 13, 20, 28)


def build_report(
    inputs: TrainInputs,
    cfg: TrainConfig,
    result: TrainResult,
    out_dir: str | Path,
    extra_summary: dict[str, Any] | None = None,
) -> Path:
    """ROC of each detector and baseline, histograms, accuracy vs m, PC loadings."""
    data = report_data(inputs, cfg, result, extra_summary)
    return write_report(data, out_dir, m_metric="balanced-sample accuracy (validation)")


def report_data(
    inputs: TrainInputs,
    cfg: TrainConfig,
    result: TrainResult,
    extra_summary: dict[str, Any] | None = None,
) -> ReportData:
    """What :func:`build_report` shows; every validation figure from fit-only models."""
    model = result.model
    splits = result.splits if result.splits is not None else grouped_splits(inputs, cfg).splits
    notes: list[str] = []
    roc: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    curve: dict[str, list[tuple[int, float]]] = {}
    has_val_ood = splits.has_ood and splits.ood_val is not None
    if has_val_ood:
        roc = _roc_scores(inputs, cfg, result, splits, notes)
        curve = {crit: _m_curve(inputs, cfg, result, splits, crit) for crit in ("evr", "pvalue")}
        notes.append(
            "Accuracy against m is on a balanced validation sample at each model's "
            f"calibrated threshold (rule {cfg.threshold_rule!r}, as the shipped model's); "
            "the other detectors use default parameters."
        )
    else:
        notes.append("No OOD training queries: ROC curves and accuracy against m need them.")
    notes += _criterion_notes(cfg, model.criterion, has_val_ood)
    notes.append(
        "Validation figures (val_* metrics, ROC curves, histograms, accuracy against m) "
        "come from models fitted without the validation split, each at its own threshold; "
        "the shipped model is refitted on the validation split too (and, cross-calibrated, "
        "on the calibration part), with its own threshold."
    )
    val_model = result.search.val_model
    if result.search.val_scores is not None:
        s_id, s_ood = result.search.val_scores
    else:
        s_id, s_ood = val_model.score(splits.id_val), np.zeros(0)
    return ReportData(
        f"OOD model for KB '{inputs.kb_name}'",
        _summary(inputs, cfg, result, extra_summary),
        roc,
        (model.detector_name, s_id, s_ood, val_model.threshold),
        curve,
        _loadings(inputs, cfg, model),
        notes,
        list(result.search.table),
        dict(model.metrics.get("language_calibration") or {}),
    )


def _roc_scores(
    inputs: TrainInputs,
    cfg: TrainConfig,
    result: TrainResult,
    splits: TrainingSplits,
    notes: list[str],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Validation (ID, OOD) scores of every other detector at its default parameters,
    fitted on the fit part, and of the shipped one as fitted there; a detector that cannot
    be fitted gets a line in ``notes``."""
    model = result.model
    assert splits.ood_val is not None
    roc: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for det in REPORT_DETECTORS:
        if det == model.detector_name:
            continue
        try:
            cand = default_grid(det)[0]
            other = fixed_fit(
                splits,
                replace(cand, m=min(cand.m, model.m or cand.m)),
                kb_name=inputs.kb_name,
                encoder=inputs.encoder,
                criterion=model.criterion,  # the shipped model's (resolved under auto)
                seed=cfg.seed,
                target_frr=cfg.target_frr,
                pca_method=cfg.pca_method,
                final=False,
            )
        except (ConfigError, DataError) as exc:
            notes.append(f"{det} not shown: {exc}")
            continue
        roc[det] = (other.score(splits.id_val), other.score(splits.ood_val))
    # The shipped model was refitted on the validation split too: show fit-only scores.
    if result.search.val_scores is not None:
        roc[f"{model.detector_name} (shipped)"] = result.search.val_scores
    return roc


def _m_curve(
    inputs: TrainInputs,
    cfg: TrainConfig,
    result: TrainResult,
    splits: TrainingSplits,
    crit: str,
) -> list[tuple[int, float]]:
    """(m, balanced-sample validation accuracy) of the kept candidate at each m of
    M_CURVE that fits the dims budget and the KB, its PCs chosen by ``crit``."""
    model, best = result.model, result.search.best
    assert splits.ood_val is not None
    extra = model.dims - model.m
    pts = []
    for m in M_CURVE:
        if m + extra > MAX_DIMS or m >= len(inputs.kb):
            continue
        try:
            mm = fixed_fit(
                splits,
                replace(best, m=m),
                kb_name=inputs.kb_name,
                encoder=inputs.encoder,
                criterion=crit,
                seed=cfg.seed,
                target_frr=cfg.target_frr,
                pca_method=cfg.pca_method,
                final=False,
            )
            if cfg.threshold_rule == "balanced":  # as the shipped model's figures
                mm = with_balanced_threshold(mm, splits)
        except (ConfigError, DataError):
            continue
        s_id, s_ood = mm.score(splits.id_val), mm.score(splits.ood_val)
        pts.append((m, paper_accuracy(s_id, s_ood, mm.threshold)))
    return pts


def _criterion_notes(cfg: TrainConfig, used: str, has_val_ood: bool) -> list[str]:
    """Why the PCs were chosen by ``used`` where another criterion was asked for."""
    if cfg.criterion == "auto" and used != "auto":
        return [
            f"Criterion auto: {used} was kept (see the search table)."
            if has_val_ood
            else "Criterion auto: without OOD training queries the PCs are chosen by EVR."
        ]
    if cfg.criterion != used:
        return [
            f"Criterion {cfg.criterion} was asked for; the PCs were chosen by "
            f"{used}: p-value selection needs OOD training queries."
        ]
    return []


def _loadings(inputs: TrainInputs, cfg: TrainConfig, model: OODModel) -> list[Any]:
    """The selected PCs' loadings on a bounded, seeded sample of the KB documents."""
    if not (model.m and model.explained_variance_ratio is not None):
        return []
    ids = inputs.kb_ids or [str(i) for i in range(len(inputs.kb))]
    texts = inputs.kb_texts or [""] * len(inputs.kb)
    n_show = min(len(inputs.kb), 2000)  # loadings table: a bounded sample of big KBs
    idx = np.random.default_rng(cfg.seed).permutation(len(inputs.kb))[:n_show]
    kb_langs = None if inputs.kb_languages is None else [inputs.kb_languages[i] for i in idx]
    # the KB as the model saw it: centred by language for a centred model
    proj = (model.center(inputs.kb[idx], kb_langs) - model.mean) @ np.asarray(model.components).T
    return pc_loadings(
        proj,
        [ids[i] for i in idx],
        [texts[i] for i in idx],
        list(model.selected_pcs),
        np.asarray(model.explained_variance_ratio),
    )


def _summary(
    inputs: TrainInputs,
    cfg: TrainConfig,
    result: TrainResult,
    extra_summary: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report's summary table: the shipped model, its settings and its figures."""
    model = result.model
    return {
        "kb": inputs.kb_name,
        "encoder": inputs.encoder["name"],
        **({"encoder_source": inputs.encoder_source} if inputs.encoder_source else {}),
        "detector": model.detector_name,
        "criterion": model.criterion,
        **({"criterion_requested": cfg.criterion} if cfg.criterion != model.criterion else {}),
        "m": model.m,
        "dims": model.dims,
        "selected_pcs": [int(p) for p in model.selected_pcs],
        "threshold": model.threshold,
        "target_frr": cfg.target_frr,
        "threshold_rule": cfg.threshold_rule,
        "calibration": model.metrics.get("calibration", "split"),
        **({"language_thresholds": model.language_thresholds} if cfg.per_language else {}),
        "params": result.search.best.describe(),
        **result.validation,
        **result.stats,
        **(extra_summary or {}),
    }
