"""The KB subspace (PCA of KB document embeddings) and the choice of principal components.

The reference method projects a query on m principal components (PCs) of the KB
embeddings, chosen either by explained variance (EVR, the top m) or by how well each PC
separates labelled ID from OOD training queries (a Welch t-test per PC, the m lowest
p-values). The norm of what the top-k PCs leave unexplained, the *residual*, is a strong
KB-only OOD score by itself.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np

from sidecar.errors import ConfigError, DataError, NotFittedError
from sidecar.scoring._base import as_2d

log = logging.getLogger(__name__)

Method = Literal["auto", "full", "randomized", "incremental"]
# Above this many rows, "auto" avoids a full SVD of the data matrix.
_AUTO_FULL_MAX_ROWS = 20_000


class KBSubspace:
    """PCA of KB document embeddings.

    Parameters
    ----------
    n_components : int
        k, the number of PCs kept (capped at ``min(n_docs - 1, dim)`` by ``fit``).
    method : {"auto", "full", "randomized", "incremental"}
        "full" is an exact SVD; "randomized" a randomized SVD; "incremental" processes
        ``batch_size`` rows at a time, so memory stays O(batch_size * dim). "auto" picks
        "full" up to 20,000 documents and "randomized" beyond.
    random_state : int
        Seed of the randomized solver.
    batch_size : int
        Rows per step of the incremental solver.

    Attributes
    ----------
    mean_ : ndarray of shape (dim,)
    components_ : ndarray of shape (k, dim)
        Orthonormal rows, by decreasing explained variance.
    explained_variance_ : ndarray of shape (k,)
    explained_variance_ratio_ : ndarray of shape (k,)
    n_components_ : int
    method_ : str
        The solver actually used.
    """

    def __init__(
        self,
        n_components: int = 64,
        *,
        method: Method = "auto",
        random_state: int = 0,
        batch_size: int = 4096,
    ):
        self.n_components = n_components
        self.method = method
        self.random_state = random_state
        self.batch_size = batch_size

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {
            "n_components": self.n_components,
            "method": self.method,
            "random_state": self.random_state,
            "batch_size": self.batch_size,
        }

    def fit(self, X: Any, y: Any = None) -> KBSubspace:
        """Fit on KB embeddings ``X`` of shape (n_docs, dim)."""
        from sklearn.decomposition import PCA, IncrementalPCA

        X = np.asarray(X)
        if X.ndim != 2 or X.shape[0] < 2:
            raise DataError(f"need at least 2 KB embeddings as (n_docs, dim), got {X.shape}")
        n, d = X.shape
        k = min(int(self.n_components), n - 1, d)
        if k < 1:
            raise ConfigError(f"n_components must be >= 1, got {self.n_components}")
        if k < self.n_components:
            log.info(
                "KB subspace: k capped from %s to %s (n_docs=%s, dim=%s)",
                self.n_components,
                k,
                n,
                d,
            )
        method = self.method
        if method == "auto":
            method = "full" if n <= _AUTO_FULL_MAX_ROWS else "randomized"
        if method == "full":
            pca = PCA(n_components=k, svd_solver="full").fit(X)
        elif method == "randomized":
            pca = PCA(n_components=k, svd_solver="randomized", random_state=self.random_state).fit(
                X
            )
        elif method == "incremental":
            batch = max(int(self.batch_size), k)
            pca = IncrementalPCA(n_components=k, batch_size=batch)
            starts = list(range(0, n, batch))
            if len(starts) > 1 and n - starts[-1] < k:
                starts.pop()  # fold a last batch shorter than k into the previous one
            for i, start in enumerate(starts):
                stop = starts[i + 1] if i + 1 < len(starts) else n
                pca.partial_fit(X[start:stop])
        else:
            raise ConfigError(f"unknown PCA method {self.method!r}")
        comps = np.asarray(pca.components_, dtype=np.float64)
        # Deterministic signs: the largest-magnitude loading of each PC is positive.
        signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
        signs[signs == 0] = 1.0
        self.mean_ = np.asarray(pca.mean_, dtype=np.float64)
        self.components_ = comps * signs[:, None]
        self.explained_variance_ = np.asarray(pca.explained_variance_, dtype=np.float64)
        self.explained_variance_ratio_ = np.asarray(pca.explained_variance_ratio_, dtype=np.float64)
        self.n_components_ = k
        self.method_ = method
        return self

    def _check(self) -> None:
        if not hasattr(self, "components_"):
            raise NotFittedError("KBSubspace is not fitted yet; call fit(kb_embeddings)")

    def project(self, X: Any, pcs: Any = None) -> np.ndarray:
        """Coordinates of ``X`` (n, dim) on the PCs ``pcs`` (default: all k); shape (n, m)."""
        self._check()
        Xc = as_2d(X) - self.mean_
        comps = self.components_ if pcs is None else self.components_[np.asarray(pcs, dtype=int)]
        return np.asarray(Xc @ comps.T)

    def residual_norm(self, X: Any) -> np.ndarray:
        """Norm of ``x - mean`` minus its projection on the k PCs; shape (n,)."""
        self._check()
        Xc = as_2d(X) - self.mean_
        R = Xc - (Xc @ self.components_.T) @ self.components_
        return np.asarray(np.linalg.norm(R, axis=1))


def select_evr(subspace: KBSubspace, m: int) -> np.ndarray:
    """The top-``m`` PCs by explained variance: ``arange(m)``; ndarray of int."""
    subspace._check()
    k = subspace.n_components_
    if not 1 <= m <= k:
        raise ConfigError(f"m={m} PCs requested but the subspace has k={k}")
    order = np.argsort(-subspace.explained_variance_ratio_, kind="stable")
    return np.asarray(order[:m], dtype=np.int64)


def select_pvalue(Z_id: Any, Z_ood: Any, m: int) -> np.ndarray:
    """The ``m`` PCs whose ID and OOD projections differ most (Welch t-test per PC).

    Parameters
    ----------
    Z_id : ndarray of shape (n_id, k)
        ID training queries projected on the top-k PCs.
    Z_ood : ndarray of shape (n_ood, k)
        OOD training queries projected on the same PCs.
    m : int

    Returns
    -------
    ndarray of int, shape (m,)
        PC indices, lowest p-value first; ties broken by larger |t|, then lower index.
    """
    from scipy.stats import ttest_ind

    A, B = as_2d(Z_id), as_2d(Z_ood)
    if A.shape[1] != B.shape[1]:
        raise DataError(f"ID has {A.shape[1]} PCs and OOD {B.shape[1]}")
    k = A.shape[1]
    if not 1 <= m <= k:
        raise ConfigError(f"m={m} PCs requested out of k={k}")
    if A.shape[0] < 2 or B.shape[0] < 2:
        raise DataError("p-value selection needs at least 2 ID and 2 OOD training queries")
    with np.errstate(divide="ignore", invalid="ignore"):
        t, p = ttest_ind(A, B, axis=0, equal_var=False)
    t = np.nan_to_num(np.abs(np.asarray(t, dtype=np.float64)), nan=0.0)
    p = np.nan_to_num(np.asarray(p, dtype=np.float64), nan=1.0)
    order = np.lexsort((np.arange(k), -t, p))
    return np.asarray(order[:m], dtype=np.int64)
