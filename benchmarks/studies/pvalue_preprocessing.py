"""Ablation behind benchmarks/results/pvalue_preprocessing_dev.json,
benchmarks/results/pvalue_spread_dev.json and benchmarks/results/pvalue_groups_dev.json
(not a test; run by hand).

Does the reference implementation's preprocessing change the paper's p-value-vs-EVR
comparison? Its code (github.com/toastedqu/rag_safety_pca) z-scores the KB embeddings
before PCA and runs the t-test on class-balanced ID / OOD samples; the product fits PCA
on the raw embeddings and tests every fit query. This script refits the protocol's
candidates (``PROTOCOL_CANDIDATES``, m = 13, seed 0, 1% target FRR) on each KB under
each variant and prints p-value minus EVR per detector::

    python benchmarks/studies/pvalue_preprocessing.py clinc150 raw,std,std_bal \
        --data-dir ../shared/data --json out.json

The variants swap one piece of the pipeline in this process only (see ``VARIANTS``):
the preprocessing, or the per-PC test (``raw_spread`` and ``raw_locscale`` add a test of
spread, which a t-test on the values cannot see; ``raw_groups`` and ``raw_groups_rr`` test
ID against each k-means group of the OOD queries, since a mixture of sibling domains can
hide the shift of each one behind a pooled mean).
Benchmarks whose KBs have no training queries (covid is cross-fitted) are not supported.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import sidecar.scoring._fit as fit_module
from sidecar.evaluation._evaluate import PROTOCOL_CANDIDATES
from sidecar.evaluation._targets import PAPER_DETECTORS
from sidecar.scoring._subspace import KBSubspace, select_pvalue
from sidecar.training._fitting import fixed_fit
from sidecar.training._metrics import auroc, paper_accuracy
from sidecar.training._splits import carve_splits

VARIANTS = {
    "raw": "the product: PCA of raw KB embeddings, t-test on every fit query",
    "raw_bal": "t-test on a seeded class-balanced subsample",
    "std": "embeddings z-scored per dimension with the KB's mean and sd (correlation PCA)",
    "std_bal": "std + class-balanced t-test",
    "paper": "the reference code: PCs of z-scored KB embeddings, unscaled queries projected",
    "paper_bal": "paper + class-balanced t-test",
    "raw_spread": "spread only: Welch t-test on |z - class median| per PC (Brown-Forsythe)",
    "raw_locscale": "the lower of the Welch p-values on z and on |z - class median| per PC",
    "raw_groups": "Welch t-test of ID against each k-means group of the OOD queries; a PC's "
    "p-value is its lowest over the groups",
    "raw_groups_rr": "as raw_groups, but the groups take turns: each adds its own "
    "lowest-p PC not yet chosen",
}


def _balanced_pvalue(Z_id: np.ndarray, Z_ood: np.ndarray, m: int) -> np.ndarray:
    n = min(len(Z_id), len(Z_ood))
    rng = np.random.default_rng(0)

    def cut(Z: np.ndarray) -> np.ndarray:
        return Z[np.sort(rng.choice(len(Z), n, replace=False))] if len(Z) > n else Z

    return select_pvalue(cut(Z_id), cut(Z_ood), m)


def _spread_test(Z_id: np.ndarray, Z_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|t| and p of a Welch t-test on absolute deviations from each class's median."""
    from scipy.stats import ttest_ind

    A = np.abs(Z_id - np.median(Z_id, axis=0))
    B = np.abs(Z_ood - np.median(Z_ood, axis=0))
    t, p = ttest_ind(A, B, axis=0, equal_var=False)
    return np.nan_to_num(np.abs(t)), np.nan_to_num(p, nan=1.0)


def _lowest_p(t: np.ndarray, p: np.ndarray, m: int) -> np.ndarray:
    """The ``m`` lowest p-values, ties by larger |t|, then lower index (as select_pvalue)."""
    return np.asarray(np.lexsort((np.arange(len(p)), -t, p))[:m], dtype=np.int64)


def _spread_pvalue(Z_id: np.ndarray, Z_ood: np.ndarray, m: int) -> np.ndarray:
    return _lowest_p(*_spread_test(np.asarray(Z_id), np.asarray(Z_ood)), m)


def _locscale_pvalue(Z_id: np.ndarray, Z_ood: np.ndarray, m: int) -> np.ndarray:
    from scipy.stats import ttest_ind

    A, B = np.asarray(Z_id), np.asarray(Z_ood)
    t_loc, p_loc = ttest_ind(A, B, axis=0, equal_var=False)
    t_loc, p_loc = np.nan_to_num(np.abs(t_loc)), np.nan_to_num(p_loc, nan=1.0)
    t_sc, p_sc = _spread_test(A, B)
    return _lowest_p(np.maximum(t_loc, t_sc), np.minimum(p_loc, p_sc), m)


def _ood_groups(Z_ood: np.ndarray, n_groups: int = 8) -> list[np.ndarray]:
    from sklearn.cluster import KMeans

    labels = KMeans(n_groups, n_init=4, random_state=0).fit_predict(Z_ood)
    return [Z_ood[labels == g] for g in range(n_groups) if np.sum(labels == g) >= 2]


def _group_tests(Z_id: np.ndarray, Z_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|t| and p of Welch t-tests of ID against each OOD group: shape (n_groups, k)."""
    from scipy.stats import ttest_ind

    A, groups = np.asarray(Z_id), _ood_groups(np.asarray(Z_ood))
    ts, ps = zip(*(ttest_ind(A, B, axis=0, equal_var=False) for B in groups), strict=True)
    return np.nan_to_num(np.abs(np.array(ts))), np.nan_to_num(np.array(ps), nan=1.0)


def _groups_pvalue(Z_id: np.ndarray, Z_ood: np.ndarray, m: int) -> np.ndarray:
    t, p = _group_tests(Z_id, Z_ood)
    return _lowest_p(t.max(0), p.min(0), m)


def _groups_rr_pvalue(Z_id: np.ndarray, Z_ood: np.ndarray, m: int) -> np.ndarray:
    t, p = _group_tests(Z_id, Z_ood)
    ranked = [list(_lowest_p(t[g], p[g], p.shape[1])) for g in range(len(p))]
    chosen: list[int] = []
    while len(chosen) < m:
        for order in ranked:
            pc = next(j for j in order if j not in chosen)
            chosen.append(int(pc))
            if len(chosen) == m:
                break
    return np.asarray(chosen, dtype=np.int64)


@contextmanager
def _variant(name: str) -> Iterator[None]:
    """Swap the t-test input and the PCA fit for the duration of one variant."""
    orig_select, orig_fit = fit_module.select_pvalue, KBSubspace.fit

    def paper_fit(self: KBSubspace, X: Any, y: Any = None) -> KBSubspace:
        X = np.asarray(X, dtype=np.float64)
        mu, sd = X.mean(0), X.std(0) + 1e-8
        orig_fit(self, (X - mu) / sd)
        self.mean_ = mu  # queries are centred but not scaled, as in the reference code
        return self

    if name.endswith("_bal"):
        fit_module.select_pvalue = _balanced_pvalue
    if name == "raw_spread":
        fit_module.select_pvalue = _spread_pvalue
    if name == "raw_locscale":
        fit_module.select_pvalue = _locscale_pvalue
    if name == "raw_groups":
        fit_module.select_pvalue = _groups_pvalue
    if name == "raw_groups_rr":
        fit_module.select_pvalue = _groups_rr_pvalue
    if name.startswith("paper"):
        KBSubspace.fit = paper_fit  # type: ignore[method-assign]
    try:
        yield
    finally:
        fit_module.select_pvalue = orig_select
        KBSubspace.fit = orig_fit  # type: ignore[method-assign]


def _identity(X: np.ndarray) -> np.ndarray:
    return X


def _zscore(kb: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    mu, sd = kb.mean(0), kb.std(0) + 1e-8
    return lambda X: ((X - mu) / sd).astype(np.float32)


def run(benchmark: str, variants: list[str], data_dir: str) -> dict[str, Any]:
    from sidecar.encoders import available_cpus, load_encoder
    from sidecar.evaluation import load_benchmark
    from sidecar.settings import load_settings
    from sidecar.training import EmbeddingCache

    enc = load_encoder(load_settings().scoring, threads=available_cpus())
    embed = EmbeddingCache(enc, None, progress=False).embed
    info = {"name": enc.name, "dim": enc.dim}
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    for task in load_benchmark(benchmark, data_dir, "dev"):
        if not task.ood_train:
            raise SystemExit(f"{benchmark} KB {task.name} has no OOD training queries")
        E = {k: embed(getattr(task, k)) for k in ("kb_texts", "id_train", "ood_train")}
        E_ide, E_oode = embed(task.id_eval), embed(task.ood_eval)
        for var in variants:
            scale = _zscore(E["kb_texts"]) if var.startswith("std") else _identity
            splits = carve_splits(*(scale(E[k]) for k in E), seed=0)
            with _variant(var):
                for cand in PROTOCOL_CANDIDATES:
                    for crit in ("evr", "pvalue"):
                        model = fixed_fit(
                            splits, cand, kb_name=task.name, encoder=info, criterion=crit
                        )
                        s_id, s_ood = model.score(scale(E_ide)), model.score(scale(E_oode))
                        t = model.threshold
                        r = rows.setdefault(var, {}).setdefault(f"{cand.detector}/{crit}", {})
                        r.setdefault("paper_accuracy", []).append(
                            paper_accuracy(s_id - t, s_ood - t, 0.0, seed=0)
                        )
                        r.setdefault("auroc", []).append(auroc(s_id, s_ood))
        print(task.name, flush=True)
    out: dict[str, Any] = {}
    for var, by in rows.items():
        dets = sorted({k.split("/")[0] for k in by})
        row: dict[str, Any] = {}
        for d in dets:
            row[d] = {
                metric: {
                    "evr": float(np.mean(by[f"{d}/evr"][metric])),
                    "pvalue": float(np.mean(by[f"{d}/pvalue"][metric])),
                    "diff": float(
                        np.mean(by[f"{d}/pvalue"][metric]) - np.mean(by[f"{d}/evr"][metric])
                    ),
                }
                for metric in ("paper_accuracy", "auroc")
            }
        row["paper_detectors_mean_diff"] = {
            metric: float(np.mean([row[d][metric]["diff"] for d in PAPER_DETECTORS]))
            for metric in ("paper_accuracy", "auroc")
        }
        out[var] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benchmark", choices=["clinc150", "stackexchange"])
    ap.add_argument("variants", help=f"comma-separated, of {sorted(VARIANTS)}")
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    res = run(args.benchmark, variants, args.data_dir)
    for var, row in res.items():
        print(var, "paper six, p-value minus EVR:", row["paper_detectors_mean_diff"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": args.benchmark, "variants": res}, f, indent=1)


if __name__ == "__main__":
    main()
