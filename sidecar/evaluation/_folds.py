"""How ``sidecar eval`` keeps related queries apart: group labels of the training and
evaluation queries, and the training set of each cross-fitted fold.

A query's paraphrases and near-duplicates share a label; the training split keeps each
label in one part, and a cross-fitted fold (covid) keeps each label's evaluation queries
whole and leaves out the training queries that nearly copy a query it judges.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sidecar.errors import DataError
from sidecar.evaluation._datasets import KBTask
from sidecar.training import near_duplicate_groups

FOLD_GROUPINGS = ("grouped", "random")


def random_folds(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` folds of a seeded permutation of ``n`` rows, query by query."""
    return [np.sort(f) for f in np.array_split(rng.permutation(n), k)]


def _labels(given: Sequence[int] | None, n: int) -> np.ndarray:
    """``given`` as labels 0..g-1 (one label per row when None)."""
    return np.arange(n) if given is None else np.unique(np.asarray(given), return_inverse=True)[1]


Four = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]


def cross_fit_training(
    E: tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray],
    groups: Four,
    fi: np.ndarray,
    fo: np.ndarray,
    *,
    ood_eval_trains: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """ID and OOD training queries (and their group labels) of the cross-fitted fold that
    judges evaluation rows ``fi`` / ``fo``: the task's training queries and the other
    folds' evaluation queries.

    ``E``: the ID training, ID evaluation, OOD training and OOD evaluation rows;
    ``groups``: their labels from :func:`query_groups`. With labels, a training query in
    the group of a query this fold judges sits the fold out, so that no query is judged
    by a model fitted on its near copy. ``ood_eval_trains=False`` (the OOD evaluation
    queries are a family held out of training): no OOD evaluation query trains, in any fold.
    """
    E_idt, E_ide, E_oodt, E_oode = E
    g_idt, g_id, g_oodt, g_ood = groups
    rest_i = np.setdiff1d(np.arange(len(E_ide)), fi)
    rest_o = np.setdiff1d(np.arange(len(E_oode)), fo)
    if not ood_eval_trains:
        if E_oodt is None:
            raise DataError("a held-out OOD family leaves no OOD training queries")
        rest_o = rest_o[:0]
    if g_idt is None or g_id is None or g_ood is None or g_oodt is None:
        parts = [E_oode[rest_o]] + ([E_oodt] if E_oodt is not None else [])
        return np.vstack([E_idt, E_ide[rest_i]]), np.vstack(parts), None, None
    # a held-out family's near copies sit out of every fold, not only of the one judging them
    keep_i = ~np.isin(g_idt, g_id[fi])
    keep_o = ~np.isin(g_oodt, g_ood[fo] if ood_eval_trains else g_ood)
    parts = [E_oode[rest_o]] + ([E_oodt[keep_o]] if E_oodt is not None else [])
    return (
        np.vstack([E_idt[keep_i], E_ide[rest_i]]),
        np.vstack(parts),
        np.r_[g_idt[keep_i], g_id[rest_i]],
        np.r_[g_ood[rest_o], g_oodt[keep_o]],
    )


def query_groups(
    task: KBTask,
    fold_grouping: str,
    E_idt: np.ndarray,
    E_ide: np.ndarray,
    E_oodt: np.ndarray | None,
    E_oode: np.ndarray,
) -> Four:
    """Group labels of the ID training, ID evaluation, OOD training and OOD evaluation rows.

    ``"grouped"``: the task's groups (paraphrases) joined with near-duplicates, so that the
    training split keeps each group in one of fit / validation / calibration and, on
    cross-fitted tasks, the folds keep each group of evaluation queries whole (a training
    query links evaluation queries it nearly duplicates). The evaluation labels are None
    unless the task is cross-fitted; ``"random"`` gives None throughout (row by row).
    """
    if fold_grouping != "grouped":
        return None, None, None, None
    if task.cross_fit <= 1:
        g_idt = near_duplicate_groups(E_idt, task.id_train_groups) if len(E_idt) else None
        return g_idt, None, None if E_oodt is None else near_duplicate_groups(E_oodt), None
    a = _labels(task.id_train_groups, len(E_idt))
    b = _labels(task.id_eval_groups, len(E_ide)) + (int(a.max()) + 1 if len(a) else 0)
    ids = near_duplicate_groups(np.vstack([E_idt, E_ide]), np.r_[a, b])
    oods = near_duplicate_groups(np.vstack([E_oode] + ([E_oodt] if E_oodt is not None else [])))
    return ids[: len(E_idt)], ids[len(E_idt) :], oods[len(E_oode) :], oods[: len(E_oode)]
