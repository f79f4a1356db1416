"""Cutting labelled training embeddings into fit, validation and calibration parts.

:func:`carve_splits` never sees evaluation queries. Where the training queries come in
groups (a question and its paraphrases), each group goes whole into one part: the
conformal threshold is only valid when calibration queries are exchangeable with the
queries it is applied to, and a calibration query whose paraphrase was fitted on scores
lower than an unseen query does (the cross-fitted covid benchmark evaluates exactly such
unseen queries).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring import DEFAULT_TARGET_FRR, DenyTopics, KBSubspace

log = logging.getLogger(__name__)

# Share of OOD training queries held out to calibrate a "balanced" threshold.
OOD_CAL_FRACTION = 0.2


@dataclass(frozen=True)
class TrainingSplits:
    """Training embeddings cut for search and calibration; shapes (n, dim), float32."""

    kb: np.ndarray
    id_fit: np.ndarray
    id_val: np.ndarray
    id_cal: np.ndarray
    ood_fit: np.ndarray | None = None
    ood_val: np.ndarray | None = None
    ood_cal: np.ndarray | None = None
    # Group label of each ID row of id_fit, id_val and id_cal (in that order), when the
    # training queries came in groups: cross-calibration keeps each group in one fold.
    id_groups: np.ndarray | None = None
    # Group label of each OOD row of ood_fit and ood_val (in that order), likewise: the
    # out-of-fold comparison of search finalists keeps each OOD group in one fold.
    ood_groups: np.ndarray | None = None
    # KB subspaces fitted on ``kb`` so far, shared by every fit on these splits (the PCA
    # depends on the KB alone); see fit_ood_model(subspaces=...).
    subspaces: dict[tuple[int, str, int], KBSubspace] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Topics every model fitted on these splits refuses (fit_ood_model(deny_topics=...)).
    deny: DenyTopics | None = field(default=None, compare=False, repr=False)
    # Row of the ID training queries (as given to carve_splits) of each row of id_fit,
    # id_val and id_cal (the order of id_all): per-query facts such as the language follow
    # a query into its part. None for splits built otherwise.
    id_rows: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def has_ood(self) -> bool:
        return self.ood_fit is not None and len(self.ood_fit) >= 2

    @property
    def id_all(self) -> np.ndarray:
        """Every ID training row: fit, validation, calibration (the order of id_groups)."""
        return np.vstack([self.id_fit, self.id_val, self.id_cal])

    @property
    def ood_fit_val(self) -> np.ndarray | None:
        """The OOD fit + validation rows (the order of ood_groups); None without OOD."""
        if not self.has_ood:
            return None
        return np.vstack([p for p in (self.ood_fit, self.ood_val) if p is not None])


# Queries at least this cosine-similar are near-duplicates (CLINC150's crowd-written
# utterances and AdvBench's templated prompts have many; the COVID FAQ's paraphrases reach
# it too). Folds and split parts keep them together, so that no query is scored or
# calibrated by a model trained on its near copy.
NEAR_DUPLICATE_COS = 0.9
# Joining near-duplicates is transitive, so a dense topic could chain into one group that
# no split can place; a join stops short of groups larger than this share of the rows
# (the largest groups of the benchmarks: 2.7% of covid's ID queries, 3.9% of a CLINC150
# KB's ID training queries).
MAX_GROUP_SHARE = 0.05
# ... but never below this many rows: with few training queries, 5% would split even a
# question and its two paraphrases, and calibration would then see near copies of fitted
# queries (measured by a review: 29% refused against a 10% target, 48 queries in triples).
MIN_GROUP_CAP = 8
# Near-duplicates kept per row (the most similar first), and the similarity entries
# computed at a time (a block of rows against all rows: 64 MiB of float32).
_NEIGHBOURS = 32
_BLOCK_ENTRIES = 1 << 24


def near_duplicate_groups(
    E: np.ndarray,
    groups: Sequence[int] | np.ndarray | None = None,
    cos: float = NEAR_DUPLICATE_COS,
    max_share: float = MAX_GROUP_SHARE,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Group labels, shape (n,), int64: ``groups`` (default: one per row) joined with
    near-duplicates, rows of ``E`` (n, dim) at cosine similarity >= ``cos``.

    Given groups and identical rows are joined first, whatever their size. Each distinct
    row then joins its (up to) 32 most similar rows at >= ``cos``, the most similar pairs
    first, skipping a join whose group would exceed ``max_share`` of the rows: a dense
    topic does not chain into one group that no split could place. A label is the
    smallest row index of its group. Memory stays bounded (64 MiB of similarities at a
    time, a few hundred MiB in all even where every row has hundreds of near-duplicates);
    time is quadratic in n (a few seconds for 10,000 rows of 384 dims, minutes for
    100,000), so ``progress(rows done, rows)`` is told as the comparison goes.
    """
    n = len(E)
    parent, size = np.arange(n), np.ones(n, dtype=np.int64)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    def join(i: int, j: int, cap: float) -> None:
        a, b = root(i), root(j)
        if a != b and size[a] + size[b] <= cap:
            lo, hi = min(a, b), max(a, b)
            parent[hi], size[lo] = lo, size[a] + size[b]

    if groups is not None:
        if len(groups) != n:
            raise DataError(f"{len(groups)} group labels for {n} queries")
        first: dict[object, int] = {}
        for i, g in enumerate(np.asarray(groups).tolist()):
            join(i, first.setdefault(g, i), math.inf)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    U = np.asarray(E, dtype=np.float32)
    U = U / np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
    # Identical rows: one group each, searched once (copies would tie for every slot).
    U, first_row, copy_of = np.unique(U, axis=0, return_index=True, return_inverse=True)
    for i, u in enumerate(copy_of.ravel().tolist()):
        join(i, int(first_row[u]), math.inf)

    def told(done: int, total: int) -> None:  # distinct rows compared, as a share of all n
        if progress is not None:
            progress(n if done == total else done * n // total, n)

    pairs = _near_pairs(U, cos, told)
    if len(pairs[0]):
        cap = max(float(MIN_GROUP_CAP), max_share * n)
        for t in np.argsort(-pairs[2], kind="stable").tolist():
            join(int(first_row[pairs[0][t]]), int(first_row[pairs[1][t]]), cap)
        roots = np.fromiter((root(int(r)) for r in first_row), dtype=np.int64)
        split = roots[pairs[0]] != roots[pairs[1]]
        ends = np.sort(np.stack([pairs[0][split], pairs[1][split]], axis=1), axis=1)
        apart = len(np.unique(ends, axis=0))  # each pair once, whichever row listed it
        if apart:
            log.warning(
                "%d pairs of near-duplicate queries (cosine >= %.2f) stay in different "
                "groups: joining them would make a group of more than %d of the %d queries. "
                "Folds may then fit one of a pair and calibrate or judge on the other; name "
                'paraphrases with a JSONL "group" to keep them together whatever their size',
                apart,
                cos,
                int(cap),
                n,
            )
    return np.fromiter((root(i) for i in range(n)), dtype=np.int64, count=n)


def _near_pairs(
    U: np.ndarray, cos: float, progress: Callable[[int, int], None] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, other row, similarity) for each row's up to 32 most similar rows at >= cos,
    by row, the most similar first.

    A row with more than 32 such rows (a dense topic) takes its 32 most similar by partial
    sort, so the pairs of a block never outnumber 32 per row, however dense the data.
    ``progress(rows done, rows)`` is called after each block of rows.
    """
    n = len(U)
    block = max(1, min(n, _BLOCK_ENTRIES // n))
    out_i, out_j, out_s = [], [], []
    for lo in range(0, n, block):
        sims = U[lo : lo + block] @ U.T
        sims[np.arange(len(sims)), np.arange(lo, lo + len(sims))] = -np.inf  # not itself
        near = sims >= cos
        dense = np.flatnonzero(near.sum(axis=1) > _NEIGHBOURS)
        near[dense] = False
        r, c = np.nonzero(near)
        if len(dense):
            top = np.argpartition(sims[dense], -_NEIGHBOURS, axis=1)[:, -_NEIGHBOURS:]
            r = np.concatenate([r, np.repeat(dense, _NEIGHBOURS)])
            c = np.concatenate([c, top.ravel()])
        sim = sims[r, c]
        order = np.lexsort((c, -sim, r))  # by row, the most similar first
        out_i.append(r[order] + lo)
        out_j.append(c[order])
        out_s.append(sim[order])
        if progress is not None:
            progress(min(lo + block, n), n)
    return np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_s)


def group_folds(groups: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` folds of row indices; each group whole in one fold, folds of similar size."""
    _, labels, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    if len(sizes) < k:
        raise DataError(f"{len(sizes)} groups of queries cannot fill {k} folds")
    order = rng.permutation(len(sizes))
    order = order[np.argsort(-sizes[order], kind="stable")]  # largest groups first
    fold_of, load = np.empty(len(sizes), dtype=int), np.zeros(k, dtype=int)
    for g in order:
        f = int(np.argmin(load))
        fold_of[g], load[f] = f, load[f] + sizes[g]
    return [np.flatnonzero(fold_of[labels] == f) for f in range(k)]


def _take(E: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(E[np.sort(idx)], dtype=np.float32)


def _grouped_order(
    n: int, groups: Sequence[int] | np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    """Row indices in a seeded random order that keeps each group's rows together.

    Without groups (one row each) this is ``rng.permutation(n)``, as it always was.
    """
    if groups is None:
        return rng.permutation(n)
    labels = np.unique(np.asarray(groups), return_inverse=True)[1]
    if labels.shape != (n,):
        raise DataError(f"{len(groups)} group labels for {n} training queries")
    rank = np.empty(labels.max() + 1, dtype=np.int64)
    rank[rng.permutation(labels.max() + 1)] = np.arange(labels.max() + 1)
    return np.lexsort((np.arange(n), rank[labels]))


def _cut(order: np.ndarray, groups: Sequence[int] | np.ndarray | None, at: int) -> int:
    """The first position >= ``at`` in ``order`` that does not split a group."""
    if groups is None or at >= len(order):
        return min(at, len(order))
    g = np.asarray(groups)[order]
    while at < len(order) and at > 0 and g[at] == g[at - 1]:
        at += 1
    return at


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
    target_frr: float = DEFAULT_TARGET_FRR,
    ood_cal_fraction: float = 0.0,
    id_groups: Sequence[int] | np.ndarray | None = None,
    ood_groups: Sequence[int] | np.ndarray | None = None,
    deny: DenyTopics | None = None,
) -> TrainingSplits:
    """Cut training embeddings into fit / validation / calibration parts (seeded).

    ID training queries: ``cal_fraction`` to calibration, ``val_fraction`` to validation,
    the rest (at most ``max_id_fit``) to fitting. Calibration gets at least
    ``ceil(1 / target_frr) - 1`` queries when there are enough, the fewest for which the
    conformal quantile can reach ``target_frr``. OOD training queries: a random subset of
    at most ``max_ood_val`` for validation and ``max_ood_fit`` for fitting; with
    ``ood_cal_fraction`` > 0, that fraction (at most ``max_ood_val``) is first held out for
    calibrating a balanced-accuracy threshold (never fitted on). ``id_groups`` /
    ``ood_groups`` (one label per row) keep each group in one part; a part then ends at
    the first group boundary at or after its size. ``deny``: the denied topics every
    model fitted on the splits screens for.
    """
    rng = np.random.default_rng(seed)
    n = len(id_train)
    if n < 5:
        raise DataError(
            f"need at least 5 ID training queries to fit, validate and calibrate; got {n}"
        )
    order = _grouped_order(n, id_groups, rng)
    n_cal = max(2, round(cal_fraction * n), min(math.ceil(1 / target_frr) - 1, n // 3))
    n_val = max(2, round(val_fraction * n))
    a = _cut(order, id_groups, n_cal)
    b = _cut(order, id_groups, a + n_val)
    cal, val, fit = order[:a], order[a:b], order[b:][:max_id_fit]
    if len(val) < 2 or len(fit) < 1:
        raise DataError(f"{n} ID training queries in groups too large to fit, validate, calibrate")
    ood_fit = ood_val = ood_cal = ood_labels = None
    if ood_train is not None and len(ood_train) >= 4:
        operm = _grouped_order(len(ood_train), ood_groups, rng)
        if ood_cal_fraction > 0 and len(ood_train) >= 8:
            n_ocal = min(max_ood_val, max(2, round(ood_cal_fraction * len(ood_train))))
            k = _cut(operm, ood_groups, n_ocal)
            ood_cal, operm = _take(ood_train, operm[:k]), operm[k:]
        n_oval = min(max_ood_val, max(2, round(val_fraction * len(operm))))
        k = _cut(operm, None if ood_groups is None else ood_groups, n_oval)
        ood_val = _take(ood_train, operm[:k])
        ood_fit = _take(ood_train, operm[k : k + max_ood_fit])
        if ood_groups is not None:
            og = np.asarray(ood_groups)
            ood_labels = np.concatenate(
                [og[np.sort(part)] for part in (operm[k : k + max_ood_fit], operm[:k])]
            )
        if ood_groups is not None and (len(ood_fit) < 2 or len(ood_val) < 2):
            raise DataError(
                f"{len(ood_train)} OOD training queries in groups too large to fit and validate"
            )
    labels = None
    if id_groups is not None:
        g = np.asarray(id_groups)
        labels = np.concatenate([g[np.sort(part)] for part in (fit, val, cal)])
    return TrainingSplits(
        np.asarray(kb, dtype=np.float32),
        _take(id_train, fit),
        _take(id_train, val),
        _take(id_train, cal),
        ood_fit,
        ood_val,
        ood_cal,
        labels,
        ood_labels,
        deny=deny,
        id_rows=np.concatenate([np.sort(part) for part in (fit, val, cal)]),
    )
