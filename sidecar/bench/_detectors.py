"""Microseconds per query of every detector (``sidecar bench detectors``).

Measured on synthetic unit embeddings (encoder excluded, as in the paper): each detector
is fitted through :func:`~sidecar.scoring.fit_ood_model`, then timed on its own input
(projected queries for the PC detectors, embeddings for the full-space baselines) and,
separately, end to end from embeddings through ``OODModel.score``. Every figure is the
median over repeated timed runs; ratios are taken within one run.
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._report_file import write_report
from sidecar.bench._timing import machine_facts, timeit, us_per_query

_DIM = 384


def _synthetic(n_kb: int, n_id: int, n_ood: int, n_test: int, seed: int) -> dict[str, np.ndarray]:
    """Unit embeddings with a low-rank KB topic and OOD queries from other topics."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(_DIM, 64)))[0].T  # 64 orthonormal directions

    def topic(n: int, centre: np.ndarray, dirs: np.ndarray, noise: float) -> np.ndarray:
        # A decaying spectrum, as sentence-embedding PCA spectra have.
        scales = 0.5 * np.geomspace(1.0, 0.2, dirs.shape[0])
        z = (rng.normal(size=(n, dirs.shape[0])) * scales) @ dirs
        x = centre + z + noise * rng.normal(size=(n, _DIM))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    c_id, id_dirs = basis[0], basis[1:33]
    ood_centres = basis[33:40]

    def ood(n: int) -> np.ndarray:
        parts = [topic(n // 7 + 1, c, basis[40:64], 0.04) for c in ood_centres]
        return np.vstack(parts)[:n]

    return {
        "kb": topic(n_kb, c_id, id_dirs, 0.04),
        "id": topic(n_id, c_id, id_dirs, 0.04),
        "ood": ood(n_ood),
        "test": np.vstack([topic(n_test // 2, c_id, id_dirs, 0.04), ood(n_test - n_test // 2)]),
    }


def _bench_models(
    data: dict[str, np.ndarray],
    m: int,
    repeats: int,
    min_time: float,
    kinds: list[str],
    progress: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    from sidecar.scoring import fit_ood_model

    out: dict[str, Any] = {}
    models: dict[str, Any] = {}
    q256 = data["test"][:256]
    q1 = data["test"][:1]
    for kind in kinds:
        progress.set_description(f"detector {kind}")
        t0 = time.perf_counter()
        model = fit_ood_model(
            kb="bench",
            encoder={"name": "synthetic", "dim": _DIM},
            kb_embeddings=data["kb"],
            id_embeddings=data["id"],
            ood_embeddings=data["ood"],
            detector=kind,
            m=m,
        )
        fit_s = time.perf_counter() - t0
        X256, X1 = model.features(q256), model.features(q1)
        det = model.detector
        out[kind] = {
            "us_per_query_batch1": us_per_query(det.score_samples, X1, repeats, min_time),
            "us_per_query_batch256": us_per_query(det.score_samples, X256, repeats, min_time),
            "model_us_per_query_batch1": us_per_query(model.score, q1, repeats, min_time),
            "model_us_per_query_batch256": us_per_query(model.score, q256, repeats, min_time),
            "dims": model.dims,
            "inputs": list(det.inputs),
            "fit_s": fit_s,
        }
        models[kind] = model
        progress.update(1)
    return out, models


def _python_loop_ball(points: np.ndarray, labels: np.ndarray, eps: float, Q: np.ndarray) -> list:
    """The naive paper rule: every query against every training point, in Python."""
    verdicts = []
    eps2 = eps * eps
    rows = points.tolist()
    labs = labels.tolist()
    for q in Q.tolist():
        n_id = n_ood = 0
        for p, lab in zip(rows, labs, strict=True):
            d2 = 0.0
            for a, b in zip(q, p, strict=True):
                d2 += (a - b) * (a - b)
            if d2 <= eps2:
                if lab:
                    n_ood += 1
                else:
                    n_id += 1
        verdicts.append(1 if n_ood >= n_id else 0)
    return verdicts


def _references(model: Any, test: np.ndarray, repeats: int, min_time: float) -> dict[str, Any]:
    from sklearn.neighbors import RadiusNeighborsClassifier

    det = model.detector
    pts = np.vstack([det.id_points_, det.ood_points_])
    lab = np.r_[np.zeros(len(det.id_points_), int), np.ones(len(det.ood_points_), int)]
    rnc = RadiusNeighborsClassifier(radius=det.epsilon_, outlier_label=1).fit(pts, lab)
    predict = rnc.predict

    def rnc_predict(X: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():  # sklearn warns about its outlier label each call
            warnings.simplefilter("ignore", UserWarning)
            return np.asarray(predict(X))

    X256, X1 = model.features(test[:256]), model.features(test[:1])
    X16 = model.features(test[:16])
    loop_s = timeit(
        lambda: _python_loop_ball(pts, lab, det.epsilon_, X16), repeats=3, min_time=min_time
    )
    ours = us_per_query(det.predict, X256, repeats, min_time)
    ref256 = us_per_query(rnc_predict, X256, repeats, min_time)
    agree = float(np.mean(rnc_predict(X256) == det.predict(X256)))
    return {
        "epsilon_ball_predict_kdtree": {
            "us_per_query_batch1": us_per_query(det.predict, X1, repeats, min_time),
            "us_per_query_batch256": ours,
        },
        "sklearn_RadiusNeighborsClassifier": {
            "us_per_query_batch1": us_per_query(rnc_predict, X1, repeats, min_time),
            "us_per_query_batch256": ref256,
            "verdict_agreement_with_epsilon_ball": agree,
            "note": "majority vote, no neighbour -> OOD; ties may differ (ours: tie -> OOD)",
        },
        "python_loop_ball": {"us_per_query": 1e6 * loop_s / X16.shape[0], "n_queries": 16},
        "speedup_vs_sklearn_batch256": ref256 / ours if ours else None,
        "n_training_points": len(pts),
    }


def _kdtree_references(
    models: dict[str, Any], test: np.ndarray, repeats: int, min_time: float
) -> dict[str, Any]:
    """The cube's and rectangle's nearest-ID search: compiled scan vs the KD-tree."""
    from sidecar.scoring import SCANS, choose_scan

    out: dict[str, Any] = {}
    for kind in ("epsilon_cube", "epsilon_rect"):
        if kind not in models:
            continue
        model = models[kind]
        det = model.detector
        Q = det._scaled(model.features(test[:256]))
        bound = float(det.score_cap or np.inf) * det.epsilon_

        def tree(X: np.ndarray, det: Any = det, bound: float = bound) -> Any:
            return det._tree_id.query(X, k=1, p=np.inf, distance_upper_bound=bound)

        def scan(X: np.ndarray, det: Any = det, bound: float = bound, name: Any = None) -> Any:
            return det._brute_id.nearest(X, bound, scan=name)

        t_tree = us_per_query(tree, Q, repeats, min_time)
        t_scan = us_per_query(scan, Q, repeats, min_time)
        each = {
            name: us_per_query(functools.partial(scan, name=name), Q, repeats, min_time)
            for name in SCANS
        }
        out[f"{kind}_nearest_id"] = {
            "kdtree_us_per_query_batch256": t_tree,
            "scan_us_per_query_batch256": t_scan,
            "speedup": t_tree / t_scan if t_scan else None,
            "n_id_points": len(det.id_points_),
            # The scan auto chose on this CPU, and each scan forced, in the same run.
            "scan": choose_scan(Q.shape[1]),
            **{f"scan_{name}_us_per_query_batch256": t for name, t in each.items()},
        }
    return out


def _scale(
    m_values: list[int],
    n_values: list[int],
    repeats: int,
    min_time: float,
    seed: int,
    progress: Any,
) -> dict[str, Any]:
    """Cost of the geometric detectors vs number of training points and vs m."""
    from sidecar.scoring import EpsilonBall, EpsilonCube, EpsilonRect, LogRegDetector

    rng = np.random.default_rng(seed)
    classes = {
        "epsilon_ball": EpsilonBall,
        "epsilon_cube": EpsilonCube,
        "epsilon_rect": EpsilonRect,
    }

    def labelled(n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scales = np.geomspace(0.2, 0.02, m)
        n_id = n // 2
        X_id = rng.normal(size=(n_id, m)) * scales
        X_ood = rng.normal(size=(n - n_id, m)) * scales * 2.0 + scales * 1.5
        Q = np.vstack(
            [
                rng.normal(size=(128, m)) * scales,
                rng.normal(size=(128, m)) * scales * 2.0 + scales * 1.5,
            ]
        )
        y = np.r_[np.zeros(n_id, int), np.ones(n - n_id, int)]
        return np.vstack([X_id, X_ood]), y, Q

    by_n: dict[str, Any] = {}
    for n in n_values:
        X, y, Q = labelled(n, 13)
        for name, cls in classes.items():
            t0 = time.perf_counter()
            det = cls().fit(X, y)
            fit_s = time.perf_counter() - t0
            by_n.setdefault(name, {})[str(n)] = {
                "fit_s": fit_s,
                "us_per_query_batch1": us_per_query(det.score_samples, Q[:1], repeats, min_time),
                "us_per_query_batch256": us_per_query(det.score_samples, Q, repeats, min_time),
                "predict_us_per_query_batch256": us_per_query(det.predict, Q, repeats, min_time),
            }
            progress.update(1)
    by_m: dict[str, Any] = {}
    n_fixed = 10_000
    for m in m_values:
        X, y, Q = labelled(n_fixed, m)
        for name, cls in {**classes, "logreg": LogRegDetector}.items():
            det = cls().fit(X, y)
            by_m.setdefault(name, {})[str(m)] = {
                "us_per_query_batch256": us_per_query(det.score_samples, Q, repeats, min_time),
            }
            progress.update(1)
    return {"by_n_train": by_n, "by_m": {"n_train": n_fixed, **by_m}, "m_for_by_n_train": 13}


@dataclass(frozen=True)
class DetectorsBenchConfig:
    """What ``sidecar bench detectors`` measures, and where its report goes.

    ``kinds``: the detectors to fit and time (scoring registry names). ``n_train``: ID
    and OOD training queries each, also the KB size. ``scale_n`` / ``scale_m``: the
    scaling table's training-point counts and values of m (empty: skipped).
    ``blas_threads``: BLAS threads while timing (0: the library's default).
    """

    json_out: Path
    kinds: tuple[str, ...]
    m: int = 13
    n_train: int = 2000
    repeats: int = 7
    min_time: float = 0.02
    scale_n: tuple[int, ...] = (1000, 10_000, 100_000)
    scale_m: tuple[int, ...] = (8, 16, 32)
    blas_threads: int = 1
    seed: int = 0


def run_detectors_bench(config: DetectorsBenchConfig) -> dict[str, Any]:
    """Time every detector in ``config.kinds``, the references and the scaling table.

    Writes the report to ``config.json_out`` and returns it; ``report["detectors"]``
    maps each kind to its microseconds per query (batch 1 and 256, detector alone and
    through ``OODModel.score``), its dims, inputs and fit time.
    """
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    c = config
    ns, ms = list(c.scale_n), list(c.scale_m)
    machine = machine_facts()
    data = _synthetic(c.n_train, c.n_train, c.n_train, 512, c.seed)
    total = len(c.kinds) + 3 * len(ns) + 4 * len(ms)
    t0 = time.perf_counter()
    limits = threadpool_limits(c.blas_threads, user_api="blas") if c.blas_threads > 0 else None
    machine["blas_threads"] = c.blas_threads or "default"
    with tqdm(total=total, unit="step") as progress:
        results, models = _bench_models(data, c.m, c.repeats, c.min_time, list(c.kinds), progress)
        reference = (
            _references(models["epsilon_ball"], data["test"], c.repeats, c.min_time)
            if "epsilon_ball" in models
            else {}
        )
        reference.update(_kdtree_references(models, data["test"], c.repeats, c.min_time))
        progress.set_description("scaling")
        scale = _scale(ms, ns, c.repeats, c.min_time, c.seed, progress)
    if limits is not None:
        limits.restore_original_limits()
    report = {
        "detectors": results,
        "reference": reference,
        "scale": scale,
        "machine": machine,
        "setup": _setup(c, time.perf_counter() - t0),
    }
    write_report(c.json_out, report)
    return report


def _setup(c: DetectorsBenchConfig, wall_s: float) -> dict[str, Any]:
    """The report's ``setup`` section: what was measured, and how."""
    return {
        "m": c.m,
        "n_kb": c.n_train,
        "n_id_train": c.n_train,
        "n_ood_train": c.n_train,
        "dim": _DIM,
        "repeats": c.repeats,
        "min_time_s": c.min_time,
        "seed": c.seed,
        "timing": "median over repeats of an auto-sized loop; us per query = call time"
        " / batch size; 'us_per_query_*' = detector on its own input, "
        "'model_us_per_query_*' = OODModel.score from embeddings",
        "wall_s": wall_s,
    }
