"""Cross-fitting folds: whole groups (paraphrases, near-duplicates) in one fold."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import sidecar.training._splits as splits_mod
from sidecar.errors import DataError
from sidecar.training._splits import group_folds, near_duplicate_groups


def _planted(n_heads: int, copies: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` near copies (cosine > 0.99) of each of ``n_heads`` random directions."""
    rng = np.random.default_rng(seed)
    heads = rng.normal(size=(n_heads, 32))
    E = np.repeat(heads, copies, axis=0) + 0.02 * rng.normal(size=(n_heads * copies, 32))
    return E.astype(np.float32), np.repeat(np.arange(n_heads), copies)


def test_near_duplicates_and_given_groups_join_transitively() -> None:
    rng = np.random.default_rng(0)
    E = rng.normal(size=(6, 16))
    E[1] = E[0] + 0.01 * rng.normal(size=16)  # a near copy of row 0
    E[2] = E[1] + 0.01 * rng.normal(size=16)  # and of row 1, so of 0 too
    g = near_duplicate_groups(E, groups=[0, 1, 2, 3, 3, 5], max_share=1.0)  # rows 3, 4: given
    assert g[0] == g[1] == g[2] and g[3] == g[4]
    assert len({g[0], g[3], g[5]}) == 3


def test_near_duplicates_found_across_similarity_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    E, truth = _planted(30, 4)
    order = np.random.default_rng(1).permutation(len(E))  # copies land in different blocks
    E, truth = E[order], truth[order]
    whole = near_duplicate_groups(E)
    monkeypatch.setattr(splits_mod, "_BLOCK_ENTRIES", 7 * len(E))  # blocks of 7 rows
    told: list[tuple[int, int]] = []
    blocked = near_duplicate_groups(E, progress=lambda done, n: told.append((done, n)))
    assert np.array_equal(whole, blocked)
    assert told == [(min(d, len(E)), len(E)) for d in range(7, len(E) + 7, 7)]  # per block
    # exactly the planted groups: every copy with its head's other copies, nothing else
    for g in np.unique(truth):
        assert len(np.unique(blocked[truth == g])) == 1
    assert len(np.unique(blocked)) == 30


def test_a_row_with_many_near_duplicates_keeps_its_32_most_similar() -> None:
    from sidecar.training._splits import _near_pairs

    rng = np.random.default_rng(5)
    E = rng.normal(size=16) + 0.1 * rng.normal(size=(120, 16))  # every pair near (dense)
    E[:20] = rng.normal(size=(20, 16))  # ... but the first 20 rows: a few near pairs at most
    U = (E / np.linalg.norm(E, axis=1, keepdims=True)).astype(np.float32)
    sims = U @ U.T
    np.fill_diagonal(sims, -np.inf)
    r, c, s = _near_pairs(U, 0.9)
    assert np.all(s >= 0.9) and np.allclose(s, sims[r, c])
    for i in range(len(U)):
        mine = r == i
        want = np.sort(sims[i][sims[i] >= 0.9])[::-1][:32]
        assert np.allclose(s[mine], want)  # its most similar first, at most 32
        assert np.all(np.diff(s[mine]) <= 0)
    assert np.bincount(r, minlength=len(U))[20:].min() == 32


def test_a_dense_topic_of_near_duplicates_stops_at_the_group_cap(caplog) -> None:
    rng = np.random.default_rng(2)
    step = rng.normal(size=(100, 32)) * 0.05
    E = np.cumsum(step, axis=0) + rng.normal(size=32) * 3  # a drifting walk: all near copies
    assert len(np.unique(near_duplicate_groups(E, max_share=1.0))) == 1  # uncapped: one
    with caplog.at_level(logging.WARNING, logger="sidecar.training._splits"):
        g = near_duplicate_groups(E)  # default cap: 5% of the rows, at least 8
    _, sizes = np.unique(g, return_counts=True)
    assert sizes.max() <= 8 and np.sum(sizes == 1) <= 10  # capped, yet few rows left alone
    (warning,) = caplog.records  # the pairs the cap kept apart are told, not hidden
    assert "pairs of near-duplicate queries" in warning.getMessage()
    assert "more than 8 of the 100 queries" in warning.getMessage()
    # given groups are kept whole even beyond the cap
    given = near_duplicate_groups(E, groups=[0] * 50 + list(range(1, 51)))
    assert len(np.unique(given[:50])) == 1


def test_identical_rows_are_one_group_and_their_neighbours_still_join() -> None:
    E, truth = _planted(10, 20, seed=8)
    E[truth == 0] = E[truth == 0][0]  # 20 exact copies: ties for every neighbour slot
    told: list[tuple[int, int]] = []
    g = near_duplicate_groups(E, progress=lambda *a: told.append(a))  # cap 10 rows: the
    assert len(np.unique(g[truth == 0])) == 1  # copies are joined anyway
    assert told[-1] == (200, 200)  # every row, copies included (181 distinct compared)
    _, sizes = np.unique(g[truth != 0], return_counts=True)
    assert sizes.min() >= 5  # near copies join up to the cap, none left alone
    assert g.dtype == np.int64 and near_duplicate_groups(np.zeros((0, 4))).dtype == np.int64
    assert near_duplicate_groups(np.ones((1, 4))).tolist() == [0]


def test_group_labels_must_match_the_rows() -> None:
    with pytest.raises(DataError, match="3 group labels for 4 queries"):
        near_duplicate_groups(np.eye(4), groups=[0, 1, 2])


def test_folds_keep_groups_whole_and_balanced() -> None:
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(40), rng.integers(1, 6, size=40))
    folds = group_folds(groups, 5, np.random.default_rng(0))
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(groups)))
    for g in np.unique(groups):
        assert sum(bool(np.isin(np.flatnonzero(groups == g), f).any()) for f in folds) == 1
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 5  # at most one group apart
    again = group_folds(groups, 5, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(folds, again, strict=True))  # seeded


def test_fewer_groups_than_folds_is_a_clear_error() -> None:
    import pytest

    from sidecar.errors import DataError

    with pytest.raises(DataError, match="cannot fill 5 folds"):
        group_folds(np.array([0, 0, 1, 1, 2]), 5, np.random.default_rng(0))


def test_grouped_training_splits_never_split_a_group() -> None:
    from sidecar.training import carve_splits

    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(60), 3)  # a question and two paraphrases, 60 times
    E = rng.normal(size=(len(groups), 8)).astype(np.float32)
    E[:, 0] = groups  # the first coordinate says which group a row is
    ood = rng.normal(size=(50, 8)).astype(np.float32)
    s = carve_splits(E[:5], E, ood, seed=0, id_groups=groups)
    parts = [set(np.round(p[:, 0]).astype(int)) for p in (s.id_fit, s.id_val, s.id_cal)]
    assert sum(len(p) for p in parts) == 60  # each group in exactly one part
    assert parts[0].isdisjoint(parts[1]) and parts[0].isdisjoint(parts[2])
    assert parts[1].isdisjoint(parts[2])
    assert len(s.id_cal) % 3 == 0 and len(s.id_cal) >= 180 // 3  # whole groups, enough


def test_splits_without_groups_are_the_seeded_permutation_as_before() -> None:
    from sidecar.training import carve_splits

    E = np.arange(200 * 4, dtype=np.float32).reshape(200, 4)
    s = carve_splits(E[:3], E, None, seed=7)
    perm = np.random.default_rng(7).permutation(200)
    n_cal = 200 // 3  # at most 99 for a 1% target, at most a third of the queries
    assert np.array_equal(np.sort(s.id_cal[:, 0] // 4), np.sort(perm[:n_cal]))
    assert np.array_equal(np.sort(s.id_val[:, 0] // 4), np.sort(perm[n_cal : n_cal + 40]))


def test_harness_groups_training_queries_and_cross_fitted_evaluation_queries() -> None:
    from sidecar.evaluation import KBTask
    from sidecar.evaluation._folds import query_groups

    E_idt, truth = _planted(20, 3, seed=4)  # 60 ID training queries, 20 groups
    E_oodt, _ = _planted(15, 2, seed=5)
    E_ide, E_oode = _planted(10, 1, seed=6)[0], _planted(12, 1, seed=7)[0]
    t = ("kb",)
    plain = KBTask("t", t, t, t, t, t)
    g_idt, g_id, g_oodt, g_ood = query_groups(plain, "grouped", E_idt, E_ide, E_oodt, E_oode)
    assert g_idt is not None and g_oodt is not None and g_id is None and g_ood is None
    assert len(np.unique(g_idt)) == 20 and len(np.unique(g_oodt)) == 15
    assert all(len(np.unique(g_idt[truth == g])) == 1 for g in range(20))
    assert query_groups(plain, "random", E_idt, E_ide, E_oodt, E_oode) == (None,) * 4
    # Cross-fitted: an evaluation query that nearly copies a training query joins its group.
    E_ide = np.vstack([E_ide, E_idt[:1] + 0.001])
    crossed = KBTask("t", t, t, t, t, t, cross_fit=5)
    g_idt, g_id, _, g_ood = query_groups(crossed, "grouped", E_idt, E_ide, E_oodt, E_oode)
    assert g_id is not None and g_ood is not None and g_idt is not None
    assert g_id[-1] == g_idt[0] and len(np.unique(g_id[:-1])) == 10


def test_a_cross_fitted_fold_does_not_fit_the_near_copy_of_a_query_it_judges() -> None:
    from sidecar.evaluation import KBTask
    from sidecar.evaluation._folds import cross_fit_training, query_groups

    E_idt = _planted(6, 1, seed=1)[0]
    E_oodt = _planted(8, 1, seed=2)[0]
    E_ide, E_oode = _planted(10, 1, seed=3)[0], _planted(12, 1, seed=4)[0]
    E_ide[4] = E_idt[2] + 0.001  # an evaluation query nearly copies a training query
    E_oode[3] = E_oodt[0] + 0.001
    t = ("kb",)
    task = KBTask("t", t, t, t, t, t, cross_fit=5)
    E = (E_idt, E_ide, E_oodt, E_oode)
    groups = query_groups(task, "grouped", *E[:2], *E[2:])

    def rows(A: np.ndarray, of: np.ndarray) -> set[bytes]:
        return {r.tobytes() for r in A} & {r.tobytes() for r in of}

    judging = cross_fit_training(E, groups, np.array([4, 5]), np.array([3, 7]))
    assert not rows(judging[0], E_idt[2:3]) and not rows(judging[1], E_oodt[0:1])
    assert len(rows(judging[0], E_idt)) == 5 and len(rows(judging[1], E_oodt)) == 7
    assert judging[2] is not None and judging[3] is not None
    assert len(judging[2]) == len(judging[0]) and len(judging[3]) == len(judging[1])
    other = cross_fit_training(E, groups, np.array([0, 1]), np.array([0, 1]))
    assert len(rows(other[0], E_idt)) == 6 and len(rows(other[1], E_oodt)) == 8
    # the held-out fold's own rows are never training rows
    assert not rows(judging[0], E_ide[[4, 5]]) and not rows(judging[1], E_oode[[3, 7]])
    # row by row (the paper's folds): every training query, no labels
    plain = cross_fit_training(E, (None,) * 4, np.array([4, 5]), np.array([3, 7]))
    assert len(rows(plain[0], E_idt)) == 6 and plain[2] is None and plain[3] is None


def test_a_question_and_its_paraphrases_stay_together_in_a_small_set() -> None:
    # 10 questions with 2 paraphrases each: 5% of 30 rows would cap groups at 2 and split
    # every triple; calibration would then see near copies of fitted queries.
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(10, 32))
    E = np.repeat(centres, 3, axis=0) + rng.normal(size=(30, 32)) * 0.02
    g = near_duplicate_groups(E)
    assert [len(np.unique(g[i : i + 3])) for i in range(0, 30, 3)] == [1] * 10
    assert len(np.unique(g)) == 10
