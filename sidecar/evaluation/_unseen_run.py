"""Run the unseen-OOD protocol (:mod:`._unseen`) and assemble its report.

Every holdout is evaluated as the standard protocol evaluates a KB (search on a validation
split of the training data, calibration on held-out ID training queries, one scoring of
the evaluation queries), without the p-value-vs-EVR refits. The report gives, per held-out
family, what an operator sets a gate by: AUROC, FPR at 95% TPR, and at the calibrated
threshold the false-reject rate (against the target) and the OOD-accept rate.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sidecar.evaluation._datasets import KBTask
from sidecar.evaluation._evaluate import DETECTORS, Embed, evaluate_task
from sidecar.evaluation._targets import PRODUCT_DETECTOR
from sidecar.evaluation._unseen import (
    ID_PHRASING,
    OOD_FAMILY,
    TRAINING_FREE,
    Holdout,
    drop_near_copies,
)
from sidecar.scoring import DEFAULT_TARGET_FRR
from sidecar.training import METRIC_KEYS, NEAR_DUPLICATE_COS, resolve_calibration

# The figures the per-family tables keep, and which way is worse for each.
WORST = {
    "auroc": min,
    "fpr_at_95tpr": max,
    "false_reject_rate": max,
    "ood_accept_rate": max,
    "balanced_accuracy": min,
}


def evaluate_unseen(
    benchmark: str,
    split: str,
    holdouts: Sequence[Holdout],
    embed: Embed,
    *,
    encoder: Mapping[str, Any],
    detectors: Sequence[str] = DETECTORS,
    criterion: str = "pvalue",
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    threshold_rule: str = "frr",
    fold_grouping: str = "grouped",
    calibration: str | None = None,
    grids: Mapping[str, Any] | None = None,
    progress: bool = True,
    deny_topics: Any = None,
) -> dict[str, Any]:
    """Evaluate every detector on every holdout and return the report JSON
    (``deny_topics``: a :class:`~sidecar.scoring.DenyTopics` every model screens for)."""
    from tqdm.auto import tqdm

    calibration = resolve_calibration(threshold_rule, calibration)  # refuse a bad pair first
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for h in tqdm(holdouts, desc=f"unseen-ood {benchmark}", unit="holdout", disable=not progress):
        task, dropped = drop_near_copies(h.task, embed)
        res = evaluate_task(
            task,
            embed,
            encoder=encoder,
            detectors=detectors,
            criterion=criterion,
            seed=seed,
            target_frr=target_frr,
            protocol=False,
            grids=grids,
            threshold_rule=threshold_rule,
            fold_grouping=fold_grouping,
            calibration=calibration,
            deny_topics=deny_topics,
        )
        rows.append({**_describe(h, task, dropped), "detectors": res["detectors"]})
    out: dict[str, Any] = {
        "benchmark": benchmark,
        "split": split,
        "ood_protocol": "unseen-ood",
        "encoder": encoder["name"],
        "criterion": criterion,
        "seed": seed,
        "target_frr": target_frr,
        "threshold_rule": threshold_rule,
        "fold_grouping": fold_grouping,
        "calibration": calibration,
        "holdouts": rows,
        **summarise(rows, detectors),
        "leakage_guards": {
            "held_out_family": "never in training, validation or calibration, in any fold",
            "training_texts_equal_to_held_out_texts": "removed (lower-cased, punctuation "
            "and spacing ignored)",
            "training_near_copies_of_held_out_queries": f"removed (cosine >= "
            f"{NEAR_DUPLICATE_COS}); counted per holdout as near_copies_dropped",
        },
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    out["targets"] = unseen_targets(out)
    return out


def _describe(h: Holdout, task: KBTask, dropped: int) -> dict[str, Any]:
    return {
        "kb": task.name,
        "held_out": h.family,
        "group": h.group,
        "kind": h.kind,
        "n_id_train": len(task.id_train),
        "n_ood_train": len(task.ood_train),
        "n_id_eval": len(task.id_eval),
        "n_ood_eval": len(task.ood_eval),
        "near_copies_dropped": dropped,
        "cross_fit": task.cross_fit,
    }


def _mean(rows: Sequence[Mapping[str, Any]], det: str) -> dict[str, float]:
    return {
        k: float(np.mean([r["detectors"][det][k] for r in rows]))
        for k in METRIC_KEYS
        if all(k in r["detectors"][det] for r in rows)
    }


def _worst(rows: Sequence[Mapping[str, Any]], det: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, pick in WORST.items():
        vals = [(r["detectors"][det][key], f"{r['kb']}|{r['held_out']}") for r in rows]
        value, where = pick(vals, key=lambda v: v[0])
        out[key] = {"value": float(value), "holdout": where}
    return out


def summarise(rows: Sequence[Mapping[str, Any]], detectors: Sequence[str]) -> dict[str, Any]:
    """Means and worst cases per group of holdouts, and over the OOD-family holdouts."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    by_group = {
        g: {
            "kind": rs[0]["kind"],
            "holdouts": len(rs),
            "mean": {d: _mean(rs, d) for d in detectors},
            "worst": {d: _worst(rs, d) for d in detectors},
        }
        for g, rs in groups.items()
    }
    fam = [r for r in rows if r["kind"] == OOD_FAMILY]
    out: dict[str, Any] = {"groups": by_group}
    if fam:
        # every held-out family weighs the same, whatever its kind
        out["mean"] = {d: _mean(fam, d) for d in detectors}
        out["worst"] = {d: _worst(fam, d) for d in detectors}
    return out


def unseen_targets(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The default against the best training-free baseline on the held-out families, and
    the realised false-reject rate against the target."""
    prod, mean = PRODUCT_DETECTOR, report.get("mean") or {}
    out: list[dict[str, Any]] = []
    base = [d for d in TRAINING_FREE if d in mean]
    if prod in mean and base:
        best = max(base, key=lambda d: mean[d]["auroc"])
        gap = mean[prod]["auroc"] - mean[best]["auroc"]
        out.append(
            {
                "target": f"unseen OOD: mean AUROC of {prod} >= best training-free baseline "
                f"({', '.join(base)})",
                "measured": {
                    prod: mean[prod]["auroc"],
                    "best_baseline": best,
                    "baseline": mean[best]["auroc"],
                    "gap": gap,
                },
                "met": gap >= 0,
            }
        )
    target = float(report.get("target_frr", DEFAULT_TARGET_FRR))
    for group, g in (report.get("groups") or {}).items():
        row = g["mean"].get(prod)
        if row is None or "false_reject_rate" not in row:
            continue
        worst = g["worst"][prod]["false_reject_rate"]
        out.append(
            {
                "target": f"realised false-reject rate of {prod} within twice the target "
                f"{target}, {group}"
                + (" (ID wording shifted)" if g["kind"] == ID_PHRASING else ""),
                "measured": {"mean": row["false_reject_rate"], "worst": worst["value"]},
                "met": row["false_reject_rate"] <= 2 * target,
            }
        )
    return out
