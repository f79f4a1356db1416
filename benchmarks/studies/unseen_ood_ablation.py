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


def _best(knn: bool) -> Any:
    """The floor's best block alone (floor_select="best"); with ``knn``, a kNN column
    (k = 10) joins the features and the floor, one PC fewer where the budget needs it."""

    def change(c: Candidate) -> Candidate:
        feats = list(c.params.get("features", ()))
        m, params = c.m, dict(c.params)
        if knn:
            at = feats.index("residual") + 1 + ("max_cosine" in feats)
            feats = [*feats[:at], "knn", *feats[at:]]
            params["knn_ks"] = [10]
            n_other = 3 + ("max_cosine" in feats) + 1 + 6 * ("neighbours" in feats)
            m = min(m, MAX_DIMS - n_other)
        floor = [b for b in ("residual", "max_cosine", "knn", "neighbours") if b in feats]
        params.update({"features": feats, "floor": floor, "floor_select": "best"})
        return replace(c, m=m, params=params)

    return change


KB_ONLY = ["residual", "max_cosine"]
WITH_ID = [*KB_ONLY, "neighbours"]
# name -> (grid change of the floorless grid, CombinedDetector class attributes meanwhile)
VARIANTS: dict[str, tuple[Any, dict[str, float]]] = {
    # the regression alone (the default before the floor)
    "no_floor": (lambda c: c, {}),
    # floor of KB distances only (residual norms, max-cosine)
    "floor_kb": (_floor(KB_ONLY), {}),
    # + the distances to the labelled ID queries (the ID half of the neighbours block):
    # the default
    "floor_kb_id": (_floor(WITH_ID), {}),
    # the same with the regression pinned at the ID 95th percentile, as the floor is
    "floor_kb_id_sup95": (_floor(WITH_ID), {"SUPERVISED_QUANTILE": 0.95}),
    # the one OOD-free block that best separates the labelled training queries
    "floor_best": (_best(knn=False), {}),
    # the same with a kNN column among the features and the floor's blocks
    "floor_best_knn": (_best(knn=True), {}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--kbs", default=None)
    ap.add_argument("--protocols", default="unseen-ood,standard")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    settings = load_settings()
    enc = load_encoder(settings.scoring, threads=1)
    cache = EmbeddingCache(enc, None, progress=False)
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
