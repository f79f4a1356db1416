"""Ablation: variants of the combined detector's grid under the unseen-OOD and standard
protocols (``sidecar eval`` machinery, combined only; the baselines' figures come from the
recorded ``eval_*_dev*.json``).

Run: ``python benchmarks/studies/unseen_ood_ablation.py --benchmark covid --variants
no_floor,floor_kb_id --out benchmarks/results/unseen_ood_ablation_covid.json``
(``--kbs`` for a subset, ``--protocols unseen-ood`` for one protocol).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from sidecar.encoders import load_encoder
from sidecar.evaluation import evaluate_benchmark, load_benchmark, select_kbs
from sidecar.evaluation._unseen import unseen_holdouts
from sidecar.evaluation._unseen_run import evaluate_unseen
from sidecar.scoring import CombinedDetector
from sidecar.settings import load_settings
from sidecar.training import Candidate, EmbeddingCache, combined_grid
from sidecar.training._grid import MAX_DIMS


def _floor(blocks: list[str]) -> Any:
    def change(c: Candidate) -> Candidate:
        feats = list(c.params.get("features", ()))
        return replace(c, params={**c.params, "floor": [b for b in blocks if b in feats]})

    return change


def _with_knn(c: Candidate, select: str) -> Candidate:
    """``c`` with a kNN column (k = 10) among its features and every OOD-free block in its
    floor (``select``: the floor's ``floor_select``), one PC fewer where the budget needs it."""
    feats = list(c.params.get("features", ()))
    m, params = c.m, dict(c.params)
    at = feats.index("residual") + 1 + ("max_cosine" in feats)
    feats = [*feats[:at], "knn", *feats[at:]]
    params["knn_ks"] = [10]
    n_other = 3 + ("max_cosine" in feats) + 1 + 6 * ("neighbours" in feats)
    m = min(m, MAX_DIMS - n_other)
    floor = [b for b in ("residual", "max_cosine", "knn", "neighbours") if b in feats]
    params.update({"features": feats, "floor": floor, "floor_select": select})
    return replace(c, m=m, params=params)


def _best(knn: bool) -> Any:
    """The floor's best block alone (floor_select="best"); with ``knn``, a kNN column
    (k = 10) joins the features and the floor, one PC fewer where the budget needs it."""

    def change(c: Candidate) -> Candidate:
        if knn:
            return _with_knn(c, "best")
        feats = list(c.params.get("features", ()))
        floor = [b for b in ("residual", "max_cosine", "knn", "neighbours") if b in feats]
        return replace(c, params={**c.params, "floor": floor, "floor_select": "best"})

    return change


# The floor's scales before the cross-fitted pins became the default (see
# CombinedDetector.FLOOR_QUANTILE): the floor at the ID 95th percentile, the regression at
# the 99th of its in-sample log-odds.
EARLY = {"SUPERVISED_PIN": "in_sample", "FLOOR_QUANTILE": 0.95}
# The default's.
PINNED = {"SUPERVISED_PIN": "cross_fit", "FLOOR_QUANTILE": 0.99}
KB_ONLY = ["residual", "max_cosine"]
WITH_ID = [*KB_ONLY, "neighbours"]
# name -> (grid change of the floorless grid, CombinedDetector class attributes meanwhile)
VARIANTS: dict[str, tuple[Any, dict[str, Any]]] = {
    # the regression alone (the default before the floor)
    "no_floor": (lambda c: c, {}),
    # floor of KB distances only (residual norms, max-cosine)
    "floor_kb": (_floor(KB_ONLY), EARLY),
    # + the distances to the labelled ID queries (the ID half of the neighbours block):
    # the opt-in floor of the previous release
    "floor_kb_id": (_floor(WITH_ID), EARLY),
    # the same with the regression pinned at the ID 95th percentile, as the floor is
    "floor_kb_id_sup95": (_floor(WITH_ID), {**EARLY, "SUPERVISED_QUANTILE": 0.95}),
    # the one OOD-free block that best separates the labelled training queries
    "floor_best": (_best(knn=False), EARLY),
    # the same with a kNN column among the features and the floor's blocks
    "floor_best_knn": (_best(knn=True), EARLY),
    # the default floor plus a kNN column (k = 10) in the features and the floor (mean)
    "floor_knn": (lambda c: _with_knn(c, "mean"), EARLY),
    # the default floor, the regression pinned by out-of-fold log-odds of the ID rows
    # (in-sample ones are optimistic: the fit saw those rows)
    "floor_kb_id_oof": (_floor(WITH_ID), {**PINNED, "FLOOR_QUANTILE": 0.95}),
    # the same with both terms pinned at the ID 99th percentile: the default
    "floor_kb_id_oof99": (_floor(WITH_ID), PINNED),
    # floor_best, floor_best_knn and floor_knn with the default's pins
    "floor_best_oof99": (_best(knn=False), PINNED),
    "floor_best_knn_oof99": (_best(knn=True), PINNED),
    "floor_knn_oof99": (lambda c: _with_knn(c, "mean"), PINNED),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--kbs", default=None)
    ap.add_argument("--protocols", default="unseen-ood,standard")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache-dir", default=None, help="embedding cache folder")
    args = ap.parse_args()
    settings = load_settings()
    enc = load_encoder(settings.scoring, threads=1)
    cache = EmbeddingCache(enc, args.cache_dir, progress=False)
    tasks = select_kbs(load_benchmark(args.benchmark, args.data_dir), args.kbs, args.benchmark)
    encoder = {"name": enc.name, "dim": enc.dim}
    out_path = Path(args.out)
    out: dict[str, Any] = json.loads(out_path.read_text()) if out_path.is_file() else {}
    out.setdefault("benchmark", args.benchmark)
    out.setdefault("variants", {})
    for name in args.variants.split(","):
        change, attrs = VARIANTS[name]
        grid = [change(c) for c in combined_grid(floor=False)]
        saved = {k: getattr(CombinedDetector, k) for k in attrs}
        for k, v in attrs.items():
            setattr(CombinedDetector, k, v)
        row = out["variants"].setdefault(name, {"kbs": args.kbs})
        t0 = time.perf_counter()
        with threadpool_limits(limits=1):
            if "unseen-ood" in args.protocols:
                holdouts = unseen_holdouts(args.benchmark, tasks, args.data_dir)
                rep = evaluate_unseen(
                    args.benchmark,
                    "dev",
                    holdouts,
                    cache.embed,
                    encoder=encoder,
                    detectors=["combined"],
                    grids={"combined": grid},
                    progress=False,
                )
                row["unseen_ood"] = {
                    "mean": rep.get("mean", {}).get("combined"),
                    "groups": {g: v["mean"]["combined"] for g, v in rep["groups"].items()},
                    "worst": rep.get("worst", {}).get("combined"),
                    "holdouts": [
                        {k: h[k] for k in ("kb", "held_out", "group")}
                        | {
                            k: h["detectors"]["combined"][k]
                            for k in (
                                "auroc",
                                "fpr_at_95tpr",
                                "false_reject_rate",
                                "ood_accept_rate",
                                "dims",
                            )
                        }
                        for h in rep["holdouts"]
                    ],
                }
            if "standard" in args.protocols:
                rep = evaluate_benchmark(
                    args.benchmark,
                    "dev",
                    tasks,
                    cache.embed,
                    encoder=encoder,
                    detectors=["combined"],
                    grids={"combined": grid},
                    progress=False,
                    protocol=False,
                )
                row["standard"] = {
                    "mean": rep["mean"]["combined"],
                    "kbs": {
                        kb: {
                            k: v["combined"][k]
                            for k in (
                                "auroc",
                                "fpr_at_95tpr",
                                "false_reject_rate",
                                "ood_accept_rate",
                                "dims",
                            )
                        }
                        for kb, v in rep["kbs"].items()
                    },
                }
        for k, v in saved.items():
            setattr(CombinedDetector, k, v)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(
            name, json.dumps({k: v for k, v in row.items() if k != "holdouts"})[:2000], flush=True
        )
        out_path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
