"""The evaluation harness behind ``sidecar eval``.

For every KB of a benchmark and every detector: search hyperparameters on a validation
split carved from the training data (:mod:`._search`), calibrate on held-out ID training
queries, then score the evaluation queries once. Evaluation queries never reach the
search or the calibration. Benchmarks without training queries (``cross_fit`` > 1) are
cross-fitted: each fold is scored by a model that was trained on the other folds, and a
query's paraphrases and near-duplicates are always in its own fold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from sidecar.errors import ConfigError
from sidecar.evaluation._centering import centre_fold
from sidecar.evaluation._datasets import KBTask
from sidecar.evaluation._folds import (
    FOLD_GROUPINGS,
    Four,
    cross_fit_training,
    query_groups,
    random_folds,
)
from sidecar.evaluation._pool import Pool
from sidecar.evaluation._targets import PROTOCOL_M, protocol_table, targets
from sidecar.scoring import DEFAULT_TARGET_FRR, DenyTopics, OODModel, detector_table
from sidecar.training import (
    METRIC_KEYS,
    NEAR_DUPLICATE_COS,
    OOD_CAL_FRACTION,
    Candidate,
    TrainingSplits,
    carve_splits,
    fixed_fit,
    group_folds,
    resolve_calibration,
    search,
)

log = logging.getLogger(__name__)

Embed = Callable[[Sequence[str]], np.ndarray]

# Every detector, in the table order of the scoring registry (the report's JSON keys).
DETECTORS = detector_table()
# The paper's protocol, PROTOCOL_M PCs under both criteria: every detector of the
# paper, plus the product's combined detector, at fixed parameters (radius quantile 0.95,
# C = 1, four components), not searched, so that only the criterion differs.
PROTOCOL_CANDIDATES = (
    Candidate("epsilon_ball", PROTOCOL_M, {"quantile": 0.95}),
    Candidate("epsilon_cube", PROTOCOL_M, {"quantile": 0.95}),
    Candidate("epsilon_rect", PROTOCOL_M, {"quantile": 0.95}),
    Candidate("logreg", PROTOCOL_M, {"C": 1.0}),
    Candidate("svm", PROTOCOL_M, {"C": 1.0, "max_samples": 2000}),
    Candidate("gmm", PROTOCOL_M, {"n_components": 4}),
    Candidate("combined", PROTOCOL_M, {"C": 1.0, "features": ["pcs", "residual"]}, (64,)),
)


def evaluate_task(
    task: KBTask,
    embed: Embed,
    *,
    encoder: Mapping[str, Any],
    detectors: Sequence[str] = DETECTORS,
    criterion: str = "pvalue",
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    protocol: bool = True,
    grids: Mapping[str, Sequence[Candidate]] | None = None,
    threshold_rule: str = "frr",
    fold_grouping: str = "grouped",
    calibration: str | None = None,
    group_cache: dict[Any, Any] | None = None,
    deny_topics: DenyTopics | None = None,
    center_languages: bool = False,
) -> dict[str, Any]:
    """Metrics of every detector on one KB: ``{"detectors": {...}, "protocol": {...}}``.

    ``grids`` replaces the default search grid of the detectors it names.
    ``threshold_rule``: ``"frr"`` (conformal quantile) or ``"balanced"`` (best balanced
    accuracy on held-out ID and OOD training queries, for every detector; a KB without OOD
    training queries keeps the conformal threshold).
    ``fold_grouping``: ``"grouped"`` keeps paraphrases and near-duplicates in one part of the
    training split (and, on cross-fitted KBs, in one fold), so that the threshold is
    calibrated on queries as unseen as those it is judged on; ``"random"`` splits query by
    query, as the reference paper's protocol does (a query's paraphrase may then be
    trained on).
    ``group_cache``: a dict kept across calls on the same tasks and embeddings (other
    seeds), so that the seed-free near-duplicate grouping is computed once per task.
    ``deny_topics``: every model screens for these denied topics, as ``sidecar train
    --deny-topics`` builds it.
    ``center_languages``: every fold centres its embeddings by language, the means from
    its training texts alone (:mod:`._centering`), as ``sidecar train --center-languages``.
    """
    if fold_grouping not in FOLD_GROUPINGS:
        raise ConfigError(f"fold_grouping must be one of {FOLD_GROUPINGS}, not {fold_grouping!r}")
    # Resolved once: a KB that falls back from the balanced rule to frr (no OOD calibration
    # queries) keeps the split calibration the balanced rule implies.
    run = _TaskRun(
        encoder=encoder,
        criterion=criterion,
        seed=seed,
        target_frr=target_frr,
        threshold_rule=threshold_rule,
        calibration=resolve_calibration(threshold_rule, calibration),
        grids=grids or {},
        deny=deny_topics,
        center=center_languages,
    )
    E = _embed_task(task, embed)
    groups, folds = _task_folds(task, E, fold_grouping, seed, group_cache)
    pools = {d: Pool() for d in detectors}
    proto: dict[str, dict[str, Pool]] = {}
    for f, (fi, fo) in enumerate(folds):
        splits, judged = _fold_splits(task, E, groups, (fi, fo), seed + f, run)
        ide, oode = judged(E.ide[fi]), judged(E.oode[fo])
        for det in detectors:
            info, model = _searched(task.name, splits, det, run)
            pools[det].add(model, ide, oode, info)
            log.info("%s fold %s %s: val AUROC %s", task.name, f, det, info["val_auroc"])
        if protocol and splits.has_ood:
            _protocol_fits(task.name, splits, run, proto, (ide, oode))
    return {
        "detectors": {d: p.result(seed) for d, p in pools.items()},
        "protocol": {d: {c: p.result(seed) for c, p in byc.items()} for d, byc in proto.items()},
    }


@dataclass(frozen=True)
class _TaskRun:
    """The settings every fold of one KB's evaluation searches and fits with."""

    encoder: Mapping[str, Any]
    criterion: str
    seed: int
    target_frr: float
    threshold_rule: str
    calibration: str
    grids: Mapping[str, Sequence[Candidate]]
    deny: DenyTopics | None = None
    center: bool = False


class _Embedded(NamedTuple):
    """A task's embeddings: KB, ID / OOD training queries, ID / OOD evaluation queries,
    and the evaluation queries as a cross-fitted fold trains on them (the same arrays,
    or their translations into the KB's language)."""

    kb: np.ndarray
    idt: np.ndarray
    oodt: np.ndarray | None
    ide: np.ndarray
    oode: np.ndarray
    ide_train: np.ndarray
    oode_train: np.ndarray


def _embed_task(task: KBTask, embed: Embed) -> _Embedded:
    """Every text of ``task`` embedded (no ID training queries: an empty array)."""
    E_kb = embed(task.kb_texts)
    E_idt = embed(task.id_train) if task.id_train else np.zeros((0, E_kb.shape[1]), np.float32)
    E_oodt = embed(task.ood_train) if task.ood_train else None
    E_ide, E_oode = embed(task.id_eval), embed(task.ood_eval)
    ide_t = E_ide if task.id_eval_train is None else embed(task.id_eval_train)
    oode_t = E_oode if task.ood_eval_train is None else embed(task.ood_eval_train)
    if ide_t.shape != E_ide.shape or oode_t.shape != E_oode.shape:
        raise ConfigError(f"KB {task.name}: translated evaluation queries do not match")
    return _Embedded(E_kb, E_idt, E_oodt, E_ide, E_oode, ide_t, oode_t)


def _task_folds(
    task: KBTask,
    E: _Embedded,
    fold_grouping: str,
    seed: int,
    group_cache: dict[Any, Any] | None,
) -> tuple[Four, list[tuple[np.ndarray, np.ndarray]]]:
    """The query groups (from ``group_cache`` when computed before) and the evaluation
    folds: (ID rows, OOD rows) per fold, whole groups where groups are known."""
    rng = np.random.default_rng(seed)
    cache = {} if group_cache is None else group_cache
    key = (task, fold_grouping)
    if key not in cache:
        cache[key] = query_groups(task, fold_grouping, E.idt, E.ide, E.oodt, E.oode)
    groups: Four = cache[key]
    _, g_id, _, g_ood = groups
    if g_id is not None and g_ood is not None:
        id_folds = group_folds(g_id, task.cross_fit, rng)
        ood_folds = group_folds(g_ood, task.cross_fit, rng)
    elif task.cross_fit > 1:
        id_folds = random_folds(len(E.ide), task.cross_fit, rng)
        ood_folds = random_folds(len(E.oode), task.cross_fit, rng)
    else:
        return groups, [(np.arange(len(E.ide)), np.arange(len(E.oode)))]
    return groups, list(zip(id_folds, ood_folds, strict=True))


def _fold_splits(
    task: KBTask,
    E: _Embedded,
    groups: Four,
    fold: tuple[np.ndarray, np.ndarray],
    seed: int,
    run: _TaskRun,
) -> tuple[TrainingSplits, Callable[[np.ndarray], np.ndarray]]:
    """The training splits of one fold (the task's training queries, or on a cross-fitted
    task the other folds' evaluation queries) and what the fold's judged queries go
    through first: centring by the fold's training means (``run.center``), or nothing."""
    g_idt, _, g_oodt, _ = groups
    id_train, ood_train = E.idt, E.oodt
    id_groups, ood_groups = g_idt, g_oodt
    if task.cross_fit > 1:  # train on the other folds' evaluation queries
        id_train, ood_train, id_groups, ood_groups = cross_fit_training(
            (E.idt, E.ide_train, E.oodt, E.oode_train),
            groups,
            *fold,
            ood_eval_trains=task.ood_eval_trains,
        )
    kb, deny = E.kb, run.deny
    judged: Callable[[np.ndarray], np.ndarray] = _as_given
    if run.center:
        fold_c = centre_fold(task, kb, id_train, ood_train, deny)
        kb, id_train, ood_train, deny = fold_c.kb, fold_c.id_train, fold_c.ood_train, fold_c.deny
        judged = fold_c.judged
    splits = carve_splits(
        kb,
        id_train,
        ood_train,
        id_groups=id_groups,
        ood_groups=ood_groups,
        seed=seed,
        target_frr=run.target_frr,
        ood_cal_fraction=OOD_CAL_FRACTION if run.threshold_rule == "balanced" else 0.0,
        deny=deny,
    )
    return splits, judged


def _as_given(X: np.ndarray) -> np.ndarray:
    return X


def _searched(
    kb_name: str, splits: TrainingSplits, det: str, run: _TaskRun
) -> tuple[dict[str, Any], OODModel]:
    """``det`` searched and calibrated on ``splits``, and what the report records of it."""
    t0 = time.perf_counter()
    res = search(
        splits,
        det,
        kb_name=kb_name,
        encoder=run.encoder,
        criterion=run.criterion,
        grid=run.grids.get(det),
        seed=run.seed,
        target_frr=run.target_frr,
        threshold_rule=run.threshold_rule if splits.ood_cal is not None else "frr",
        calibration=run.calibration,
    )
    info = {
        "m": res.model.m,
        "criterion": res.model.criterion,
        "params": res.best.describe()["params"],
        "residual_ks": list(res.model.residual_ks),
        "val_auroc": res.val_auroc,
        "calibration": res.model.metrics.get("calibration", "split"),
        "n_calibration": res.model.metrics.get("n_calibration"),
        # what `sidecar train` predicts of the realised false-reject rate
        "expected_frr": res.model.metrics.get("expected_frr"),
        "search_s": round(time.perf_counter() - t0, 2),
        "candidates": len(res.table),
    }
    return info, res.model


def _protocol_fits(
    kb_name: str,
    splits: TrainingSplits,
    run: _TaskRun,
    proto: dict[str, dict[str, Pool]],
    evaluation: tuple[np.ndarray, np.ndarray],
) -> None:
    """The paper's protocol on one fold: each of PROTOCOL_CANDIDATES fitted under both
    criteria, scored on the fold's (ID, OOD) ``evaluation`` queries into ``proto``."""
    for cand in PROTOCOL_CANDIDATES:
        for crit in ("evr", "pvalue"):
            model = fixed_fit(
                splits,
                cand,
                kb_name=kb_name,
                encoder=run.encoder,
                criterion=crit,
                seed=run.seed,
                target_frr=run.target_frr,
            )
            proto.setdefault(cand.detector, {}).setdefault(crit, Pool()).add(
                model, *evaluation, {"m": model.m}
            )


def _mean(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {
        k: float(np.mean([r[k] for r in rows])) for k in METRIC_KEYS if all(k in r for r in rows)
    }


def evaluate_benchmark(
    benchmark: str,
    split: str,
    tasks: Sequence[KBTask],
    embed: Embed,
    *,
    encoder: Mapping[str, Any],
    detectors: Sequence[str] = DETECTORS,
    criterion: str = "pvalue",
    seed: int = 0,
    target_frr: float = DEFAULT_TARGET_FRR,
    progress: bool = True,
    threshold_rule: str = "frr",
    fold_grouping: str = "grouped",
    protocol: bool = True,
    calibration: str | None = None,
    group_cache: dict[Any, Any] | None = None,
    grids: Mapping[str, Sequence[Candidate]] | None = None,
    deny_topics: DenyTopics | None = None,
    center_languages: bool = False,
) -> dict[str, Any]:
    """Run :func:`evaluate_task` on every KB and assemble the report JSON.

    ``protocol=False`` skips the p-value-vs-EVR refits (an empty ``pvalue_vs_evr`` table);
    ``group_cache``, ``grids``, ``deny_topics`` and ``center_languages`` are passed on to
    every :func:`evaluate_task`.
    """
    from tqdm.auto import tqdm

    unknown = sorted(set(detectors) - set(DETECTORS))
    if unknown:
        raise ConfigError(f"unknown detectors {unknown}; choose from {list(DETECTORS)}")
    calibration = resolve_calibration(threshold_rule, calibration)  # refuse a bad pair first
    per_kb: dict[str, Any] = {}
    by_kb: dict[str, Any] = {}
    t0 = time.perf_counter()
    for task in tqdm(tasks, desc=f"eval {benchmark}", unit="kb", disable=not progress):
        res = evaluate_task(
            task,
            embed,
            encoder=encoder,
            detectors=detectors,
            criterion=criterion,
            seed=seed,
            target_frr=target_frr,
            threshold_rule=threshold_rule,
            fold_grouping=fold_grouping,
            protocol=protocol,
            calibration=calibration,
            group_cache=group_cache,
            grids=grids,
            deny_topics=deny_topics,
            center_languages=center_languages,
        )
        per_kb[task.name] = res["detectors"]
        by_kb[task.name] = res["protocol"]
    mean = {d: _mean([per_kb[kb][d] for kb in per_kb]) for d in detectors}
    out: dict[str, Any] = {
        "benchmark": benchmark,
        "split": split,
        "encoder": encoder["name"],
        "criterion": criterion,
        "seed": seed,
        "target_frr": target_frr,
        "threshold_rule": threshold_rule,
        "fold_grouping": fold_grouping,
        "calibration": calibration,
        "center_languages": center_languages,
        "kbs": per_kb,
        "mean": mean,
        "pvalue_vs_evr": protocol_table(by_kb),
        "leakage_guards": _leakage_guards(fold_grouping),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    out["best_by_mean_auroc"] = (
        max(mean, key=lambda d: mean[d].get("auroc", -1.0)) if mean else None
    )
    out["targets"] = targets(out)
    return out


def _leakage_guards(fold_grouping: str) -> dict[str, str]:
    """How evaluation queries are kept from training (see _datasets and group_folds)."""
    return {
        "training_texts_equal_to_evaluation_texts": "removed (lower-cased, "
        "punctuation and spacing ignored)",
        "id_training_queries_equal_to_kb_documents": "removed where both come from one "
        "pool of utterances (clinc150, stackexchange), compared the same way",
        "cross_fit_folds": (
            f"whole groups: paraphrase pairs, and near-duplicates at cosine >= "
            f"{NEAR_DUPLICATE_COS}, in the folds and in the training splits; a "
            "training query that nearly copies a fold's query is not fitted for that fold"
            if fold_grouping == "grouped"
            else "query by query (a paraphrase of an evaluation query may be trained on)"
        ),
        "training_splits": (
            f"near-duplicate training queries (cosine >= {NEAR_DUPLICATE_COS}) kept in "
            "one of fit / validation / calibration, and in one fold of cross-calibration"
            if fold_grouping == "grouped"
            else "query by query"
        ),
    }
