"""Probe: ways to combine the supervised regression with OOD-free evidence, at fixed
hyperparameters (no search, no calibration), under the unseen-OOD and standard protocols.

Every holdout of ``sidecar eval --ood-protocol unseen-ood`` (and every KB under the standard
protocol) is fitted once: m = 13, C = 1, residual k = 16 / 32 / 64, the neighbours block at
k = 1 / 3 / 10, plus a kNN column (k = 10) for the OOD-free candidates. Cross-fitted
benchmarks (covid) use 5 random folds of the evaluation queries (not the harness's grouped
folds), and at most 4,000 OOD training queries are fitted. AUROC only: it ranks ideas fast;
the harness (``unseen_ood_ablation.py``) measures the chosen ones with search and
calibration.

Variants: the KB-only scores; the regression (``default``, the shipped features); the
regression on the distance columns alone (``dist``, ``dist+nb``); sign-constrained
regressions (distances to the KB and the ID queries >= 0, to the OOD queries <= 0; PCs free,
absent, or squared with weights >= 0); the mean of pinned OOD-free columns (``zmean ...``,
pinned by ID training rows: 0 at the median, 1 at the 95th percentile), alone and as a
floor under the pinned regression (``max ... supQ``: the regression pinned at its ID
quantile Q). ``sel1`` / ``sel2``: the one / two OOD-free blocks with the best AUROC on the
training rows.

Run: ``python benchmarks/studies/unseen_ood_fusion_probe.py covid
benchmarks/results/unseen_ood_fusion_probe_covid.json [KB,KB,...]``
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import minimize
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from sidecar.encoders import load_encoder
from sidecar.evaluation import KBTask, load_benchmark, select_kbs, unseen_holdouts
from sidecar.evaluation._unseen import drop_near_copies
from sidecar.scoring import fit_ood_model
from sidecar.settings import load_settings
from sidecar.training import EmbeddingCache

DATA = "/work/shared/data"
Pair = tuple[np.ndarray, np.ndarray]


def auroc(a: np.ndarray, b: np.ndarray) -> float:
    return float(roc_auc_score(np.r_[np.zeros(len(a)), np.ones(len(b))], np.r_[a, b]))


def signed_logreg(X: np.ndarray, y: np.ndarray, C: float, signs: list[int]) -> tuple[Any, float]:
    """Balanced L2 logistic regression with weight signs: +1 (>= 0), -1 (<= 0), 0 (free)."""
    mu, sd = X.mean(0), X.std(0)
    sd[sd <= 0] = 1
    Z = (X - mu) / sd
    w0 = np.where(y == 1, 0.5 / y.mean(), 0.5 / (1 - y.mean()))
    s = np.where(y == 1, 1.0, -1.0)

    def loss(p: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = p[:-1], p[-1]
        z = s * (Z @ w + b)
        g = -s / (1 + np.exp(z))
        value = (w0 * np.logaddexp(0, -z)).sum() / len(y) + (w @ w) / (2 * C * len(y))
        grad = np.r_[Z.T @ (w0 * g) / len(y) + w / (C * len(y)), (w0 * g).sum() / len(y)]
        return value, grad

    bounds = [(0, None) if v > 0 else (None, 0) if v < 0 else (None, None) for v in signs]
    r = minimize(loss, np.zeros(X.shape[1] + 1), jac=True, method="L-BFGS-B",
                 bounds=[*bounds, (None, None)])  # fmt: skip
    w = r.x[:-1] / sd
    return w, float(r.x[-1] - w @ mu)


def pinned(ref: np.ndarray, v: np.ndarray, q: float) -> np.ndarray:
    c = np.median(ref)
    spread = np.quantile(ref, q) - c
    return (v - c) / (spread if spread > 0 else 1.0)


def variants(Ft: np.ndarray, y: np.ndarray, Fi: np.ndarray, Fo: np.ndarray, m: int) -> dict:
    """Scores of the ID / OOD evaluation rows under every variant."""
    R, COS, KNN = [m, m + 1, m + 2], m + 3, m + 4
    NBI, NBO, PCS = [m + 5, m + 6, m + 7], [m + 8, m + 9, m + 10], list(range(m))
    DIST = [*R, COS, KNN]
    ID = Ft[y == 0]
    out: dict[str, Pair] = {
        "residual64": (Fi[:, R[2]], Fo[:, R[2]]),
        "maxcos": (Fi[:, COS], Fo[:, COS]),
        "knn10": (Fi[:, KNN], Fo[:, KNN]),
    }

    def lr(cols: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mu, sd = Ft[:, cols].mean(0), Ft[:, cols].std(0) + 1e-12
        c = LogisticRegression(C=1.0, class_weight="balanced", max_iter=2000)
        c.fit((Ft[:, cols] - mu) / sd, y)
        return tuple(c.decision_function((F[:, cols] - mu) / sd) for F in (Fi, Fo, ID))  # type: ignore[return-value]

    a, b, sup_id = lr(PCS + R + [COS] + NBI + NBO)
    out["default"] = (a, b)
    out["dist"] = lr(DIST)[:2]
    out["dist+nb"] = lr(DIST + NBI + NBO)[:2]
    signs = [1] * len(DIST) + [1] * 3 + [-1] * 3
    for name, cols, sg, f in [
        ("signed(pcs free)", PCS + DIST + NBI + NBO, [0] * m + signs, lambda X: X),
        ("signed(no pcs)", DIST + NBI + NBO, signs, lambda X: X),
        ("signed(pc^2>=0)", PCS + DIST + NBI + NBO, [1] * m + signs,
         lambda X: np.c_[X[:, :m] ** 2, X[:, m:]]),
    ]:  # fmt: skip
        w, w0 = signed_logreg(f(Ft[:, cols]), y, 1.0, sg)
        out[name] = (f(Fi[:, cols]) @ w + w0, f(Fo[:, cols]) @ w + w0)

    def zmean(F: np.ndarray, cols: list[int]) -> np.ndarray:
        return np.mean([pinned(ID[:, j], F[:, j], 0.95) for j in cols], axis=0)

    blocks = {"res": R, "cos": [COS], "knn": [KNN], "nbi": NBI}
    train_auc = {k: auroc(zmean(ID, c), zmean(Ft[y == 1], c)) for k, c in blocks.items()}
    ranked = sorted(train_auc, key=lambda k: train_auc[k])
    floors = {
        "sel1": blocks[ranked[-1]],
        "sel2": [c for k in ranked[-2:] for c in blocks[k]],
        "res3cos": [*R, COS],
        "res3cos+nbi": [*R, COS, *NBI],
        "r64cosknn+nbi": [R[2], COS, KNN, *NBI],
        "all": [*R, COS, KNN, *NBI],
    }
    for name, cols in floors.items():
        zi, zo = zmean(Fi, cols), zmean(Fo, cols)
        out[f"zmean {name}"] = (zi, zo)
        for q in (0.95, 0.99):
            out[f"max {name} sup{q}"] = (
                np.maximum(pinned(sup_id, a, q), zi),
                np.maximum(pinned(sup_id, b, q), zo),
            )
    return out


def folds_of(task: KBTask, embed: Callable, rng: np.random.Generator) -> list[tuple]:
    """(ID train, ID eval, OOD train, OOD eval) embeddings per fold."""
    oodt = embed(task.ood_train)
    if task.cross_fit <= 1:
        return [(embed(task.id_train), embed(task.id_eval), oodt, embed(task.ood_eval))]
    ide, oode = embed(task.id_eval), embed(task.ood_eval)
    fi, fo = rng.permutation(len(ide)) % 5, rng.permutation(len(oode)) % 5
    out = []
    for k in range(5):
        train_ood = oodt if not task.ood_eval_trains else np.vstack([oodt, oode[fo != k]])
        out.append((ide[fi != k], ide[fi == k], train_ood, oode[fo == k]))
    return out


def run(task: KBTask, embed: Callable, rng: np.random.Generator) -> dict[str, float]:
    kb = embed(task.kb_texts)
    pooled: dict[str, tuple[list, list]] = {}
    for idt, ide, oodt, oode in folds_of(task, embed, rng):
        if len(oodt) > 4000:
            oodt = oodt[rng.choice(len(oodt), 4000, replace=False)]
        model = fit_ood_model(
            kb="probe", encoder={"name": "probe", "dim": kb.shape[1]}, kb_embeddings=kb,
            id_embeddings=idt, ood_embeddings=oodt, detector="combined", m=13,
            residual_ks=(16, 32, 64),
            detector_params={"C": 1.0, "knn_ks": [10], "neighbour_ks": [1, 3, 10],
                             "features": ["pcs", "residual", "max_cosine", "knn", "neighbours"]},
        )  # fmt: skip
        Ft = model.features(np.vstack([idt, oodt]))
        y = np.r_[np.zeros(len(idt)), np.ones(len(oodt))]
        got = variants(Ft, y, model.features(ide), model.features(oode), model.m)
        for k, (a, b) in got.items():
            pooled.setdefault(k, ([], []))
            pooled[k][0].append(a)
            pooled[k][1].append(b)
    return {k: auroc(np.concatenate(a), np.concatenate(b)) for k, (a, b) in pooled.items()}


def main() -> None:
    bench, out_path = sys.argv[1], sys.argv[2]
    kbs = sys.argv[3] if len(sys.argv) > 3 else None
    enc = load_encoder(load_settings().scoring, threads=1)
    embed = EmbeddingCache(enc, None, progress=False).embed
    tasks = select_kbs(load_benchmark(bench, DATA), kbs, bench)
    rows = [(f"{h.task.name}|{h.family}", drop_near_copies(h.task, embed)[0], h.kind)
            for h in unseen_holdouts(bench, tasks, DATA)]  # fmt: skip
    rows += [(f"{t.name}|standard", t, "standard") for t in tasks]
    rng = np.random.default_rng(0)
    result: dict[str, Any] = {"benchmark": bench, "kbs": kbs, "encoder": enc.name, "rows": {}}
    for name, task, kind in rows:
        result["rows"][name] = {"kind": kind, "auroc": run(task, embed, rng)}
        print(name, flush=True)
    keys = list(next(iter(result["rows"].values()))["auroc"])
    for kind in ("ood_family", "standard"):
        sel = [r["auroc"] for r in result["rows"].values() if r["kind"] == kind]
        result[f"mean_{kind}"] = {k: float(np.mean([r[k] for r in sel])) for k in keys}
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
