"""KB subspace (PCA solvers, residual) and the two PC-selection criteria."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.errors import ConfigError, NotFittedError
from sidecar.scoring import KBSubspace, select_evr, select_pvalue


def _anisotropic(n: int = 600, d: int = 24, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # A spectrum with clear gaps between the leading PCs, so each PC is well defined.
    scales = np.r_[[12.0, 8.0, 5.0, 3.0, 2.0, 1.2], np.linspace(0.3, 0.05, d - 6)]
    return (rng.normal(size=(n, d)) * scales + 5.0).astype(np.float32)


@pytest.mark.parametrize("method", ["randomized", "incremental"])
def test_approximate_pca_is_close_to_full(method: str) -> None:
    X = _anisotropic()
    full = KBSubspace(6, method="full").fit(X)
    approx = KBSubspace(6, method=method, batch_size=128).fit(X)
    assert approx.method_ == method
    np.testing.assert_allclose(approx.mean_, full.mean_, atol=1e-4)
    # Same subspace (all principal angles ~0) and the same PCs one by one (up to sign).
    overlap = approx.components_ @ full.components_.T
    np.testing.assert_allclose(np.linalg.svd(overlap, compute_uv=False), 1.0, atol=1e-4)
    np.testing.assert_allclose(np.abs(np.diag(overlap)), 1.0, atol=1e-2)
    np.testing.assert_allclose(
        approx.explained_variance_ratio_, full.explained_variance_ratio_, rtol=0.02
    )


def test_incremental_handles_a_short_last_batch() -> None:
    X = _anisotropic(n=1000 + 3)  # last batch of 3 rows < k
    sub = KBSubspace(8, method="incremental", batch_size=100).fit(X)
    assert sub.components_.shape == (8, 24)


def test_components_are_orthonormal_and_residual_is_what_they_miss() -> None:
    X = _anisotropic()
    sub = KBSubspace(5).fit(X)
    np.testing.assert_allclose(sub.components_ @ sub.components_.T, np.eye(5), atol=1e-6)
    Q = _anisotropic(n=7, seed=1)
    Z = sub.project(Q)
    Xc = Q.astype(np.float64) - sub.mean_
    expected = np.linalg.norm(Xc - Z @ sub.components_, axis=1)
    np.testing.assert_allclose(sub.residual_norm(Q), expected, rtol=1e-6)
    np.testing.assert_allclose(sub.project(Q, [4, 1]), Z[:, [4, 1]])


def test_k_is_capped_by_the_number_of_documents() -> None:
    sub = KBSubspace(64).fit(_anisotropic(n=10))
    assert sub.n_components_ == 9


def test_not_fitted() -> None:
    with pytest.raises(NotFittedError):
        KBSubspace(3).project(np.zeros((1, 3)))


def test_evr_picks_top_variance() -> None:
    sub = KBSubspace(8).fit(_anisotropic())
    sel = select_evr(sub, 3)
    assert sel.tolist() == [0, 1, 2]
    assert (np.diff(sub.explained_variance_ratio_) <= 0).all()
    with pytest.raises(ConfigError):
        select_evr(sub, 9)


def test_pvalue_picks_a_planted_separating_axis() -> None:
    rng = np.random.default_rng(3)
    k = 10
    Z_id = rng.normal(size=(200, k)) * np.linspace(5, 1, k)
    Z_ood = rng.normal(size=(200, k)) * np.linspace(5, 1, k)
    Z_ood[:, 7] += 2.0  # only PC 7 separates ID from OOD
    Z_ood[:, 3] += 0.6  # PC 3 a little
    sel = select_pvalue(Z_id, Z_ood, 2)
    assert sel.tolist() == [7, 3]


def test_pvalue_tie_break_is_deterministic() -> None:
    Z = np.tile(np.arange(4.0)[:, None], (1, 5))
    # Identical columns: every p-value ties, so the lower index wins.
    assert select_pvalue(Z, Z + 1.0, 3).tolist() == [0, 1, 2]
