"""Cross-fitting folds: whole groups (paraphrases, near-duplicates) in one fold."""

from __future__ import annotations

import numpy as np

from sidecar.training._evaluate import _folds, near_duplicate_groups


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
    folds = _folds(groups, 5, np.random.default_rng(0))
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(groups)))
    for g in np.unique(groups):
        assert sum(bool(np.isin(np.flatnonzero(groups == g), f).any()) for f in folds) == 1
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 5  # at most one group apart
    again = _folds(groups, 5, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(folds, again, strict=True))  # seeded
