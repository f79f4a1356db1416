"""Cross-fitting folds: whole groups (paraphrases, near-duplicates) in one fold."""

from __future__ import annotations

import numpy as np

from sidecar.training._evaluate import near_duplicate_groups
from sidecar.training._splits import group_folds


def test_near_duplicates_and_given_groups_join_transitively() -> None:
    rng = np.random.default_rng(0)
    E = rng.normal(size=(6, 16))
    E[1] = E[0] + 0.01 * rng.normal(size=16)  # a near copy of row 0
    E[2] = E[1] + 0.01 * rng.normal(size=16)  # and of row 1, so of 0 too
    g = near_duplicate_groups(E, groups=[0, 1, 2, 3, 3, 5])  # rows 3 and 4: one group given
    assert g[0] == g[1] == g[2] and g[3] == g[4]
    assert len({g[0], g[3], g[5]}) == 3


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
