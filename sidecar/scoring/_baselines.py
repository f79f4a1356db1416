"""KB-only detectors: the subspace residual and the full-space baselines.

None of them needs OOD training queries.

* ``residual``: the norm of the query's residual outside the top-k KB PCs (input block
  ``"residual"``, computed by the model from the KB subspace).
* ``max_cosine``: 1 - the maximum cosine similarity to any KB embedding (what production
  routers use).
* ``mahalanobis``: Mahalanobis distance to the KB mean under a Ledoit-Wolf shrunk
  covariance.
* ``knn``: 1 - the cosine similarity of the k-th nearest KB embedding.

``predict`` flags a query as OOD when its score exceeds the ``quantile`` of the scores of
the training points (leave-one-out for the KB baselines, on at most 2,000 of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._base import OODDetector, as_2d, as_labels, register, require_array

# Rows of the query-by-KB similarity matrix computed at once: bounds the temporary memory.
_SIM_CELLS = 1 << 22
_OFFSET_SAMPLE = 2000


def _unit_rows(X: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(X, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return np.ascontiguousarray(X / n, dtype=np.float32)


def top_cosines(Q: np.ndarray, K: np.ndarray, k: int) -> np.ndarray:
    """The ``k``-th largest cosine of each row of ``Q`` against unit rows ``K``.

    Parameters
    ----------
    Q : ndarray of shape (n, d), unit rows
    K : ndarray of shape (n_kb, d), unit rows
    k : int, 1 <= k <= n_kb

    Returns
    -------
    ndarray of shape (n,), float64
    """
    n = Q.shape[0]
    out = np.empty(n, dtype=np.float64)
    step = max(1, _SIM_CELLS // max(K.shape[0], 1))
    for start in range(0, n, step):
        S = Q[start : start + step] @ K.T
        if k == 1:
            out[start : start + step] = S.max(axis=1)
        else:
            kth = S.shape[1] - k
            out[start : start + step] = np.partition(S, kth, axis=1)[:, kth]
    return out


def top_k_cosines(
    Q: np.ndarray, K: np.ndarray, ks: tuple[int, ...], *, skip_above: float | None = None
) -> np.ndarray:
    """The ``k``-th largest cosine of each row of ``Q`` against unit rows ``K``, per ``k``.

    Parameters
    ----------
    Q : ndarray of shape (n, d), unit rows
    K : ndarray of shape (n_kb, d), unit rows
    ks : tuple of int, each 1 <= k <= n_kb
    skip_above : float, optional
        Cosines at or above this (exact duplicates) count as -1.

    Returns
    -------
    ndarray of shape (n, len(ks)), float64
    """
    n, k_max = Q.shape[0], max(ks)
    out = np.empty((n, len(ks)), dtype=np.float64)
    step = max(1, _SIM_CELLS // max(K.shape[0], 1))
    cols = [k - 1 for k in ks]
    for start in range(0, n, step):
        S = Q[start : start + step] @ K.T
        if skip_above is not None:
            S[np.greater_equal(S, skip_above)] = -1.0
        top = -np.partition(-S, k_max - 1, axis=1)[:, :k_max] if k_max < S.shape[1] else S
        top = -np.sort(-top, axis=1)
        out[start : start + step] = top[:, cols]
    return out


def _train_sample(n: int, seed: int) -> np.ndarray:
    if n <= _OFFSET_SAMPLE:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, _OFFSET_SAMPLE, replace=False))


def _id_rows(X: Any, y: Any) -> np.ndarray:
    X = as_2d(X)
    lab = as_labels(y, X.shape[0])
    return X if lab is None else X[lab == 0]


@register("residual", family="product", rank=0)
class ResidualDetector(OODDetector):
    """Subspace residual: how much of the query the KB's top-k PCs leave unexplained.

    Input: the ``"residual"`` block, ndarray of shape (n, r) of residual norms (one column
    per k; the score uses column ``column``). KB-only: no OOD labels needed.

    Parameters
    ----------
    column : int
        Which residual column scores (0: the model's k).
    quantile : float
        ``predict`` threshold: this quantile of the training residuals.
    """

    fit_on = "labelled"

    def __init__(self, column: int = 0, *, quantile: float = 0.95):
        self.column = column
        self.quantile = quantile

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("residual",)

    def fit(self, X: Any, y: Any = None) -> ResidualDetector:
        """Learn the ``predict`` threshold from ID rows of ``X`` (n, r)."""
        X_id = _id_rows(X, y)
        if not 0 <= self.column < X_id.shape[1]:
            raise DataError(f"residual column {self.column} out of {X_id.shape[1]}")
        self.n_features_in_ = X_id.shape[1]
        self.offset_ = self._offset_from(X_id[:, self.column], self.quantile)
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        """Residual norm, higher = more out-of-domain; shape (n,)."""
        return np.array(self._check_X(X)[:, self.column])


@register("max_cosine", family="baseline", rank=0)
class MaxCosineDetector(OODDetector):
    """Baseline: 1 - max cosine similarity to any KB embedding (full space).

    Parameters
    ----------
    quantile : float
        ``predict`` threshold: this quantile of leave-one-out KB scores.
    random_state : int
        Seed of the KB sample used for that threshold.

    Attributes
    ----------
    kb_ : ndarray of shape (n_kb, d), float32 unit rows
    """

    fit_on = "kb"
    full_space = True

    def __init__(self, *, quantile: float = 0.95, random_state: int = 0):
        self.quantile = quantile
        self.random_state = random_state

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("full",)

    def _k(self, n_kb: int | None = None) -> int:
        """The neighbour rank scored, for a KB of ``n_kb`` rows (default: the fitted one)."""
        return 1

    def fit(self, X: Any, y: Any = None) -> MaxCosineDetector:
        """Keep the KB embeddings ``X`` (n_kb, d) (ID rows only when ``y`` is given)."""
        kb = _unit_rows(_id_rows(X, y))
        k = self._k(kb.shape[0])
        if kb.shape[0] < k + 1:
            raise DataError(f"{self.kind} needs more than {k} KB embeddings")
        self.kb_ = kb
        self.n_features_in_ = kb.shape[1]
        idx = _train_sample(kb.shape[0], self.random_state)
        # Leave one out: the k+1-th neighbour of a KB row is its k-th other than itself.
        loo = 1.0 - top_cosines(kb[idx], kb, k + 1)
        self.offset_ = self._offset_from(loo, self.quantile)
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        """OOD score in [0, 2], higher = more out-of-domain; shape (n,).

        Parameters
        ----------
        X : ndarray of shape (n_queries, d)
        """
        Q = _unit_rows(self._check_X(X))
        return 1.0 - top_cosines(Q, self.kb_, self._k())

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"kb": self.kb_}

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.kb_ = np.ascontiguousarray(require_array(arrays, "kb", 2), dtype=np.float32)
        if self.kb_.shape[1] != self.n_features_in_ or self.kb_.shape[0] < self._k():
            raise ValueError("kb array does not match the detector")


@register("knn", family="baseline", rank=2)
class KNNDetector(MaxCosineDetector):
    """Baseline: 1 - cosine similarity of the ``n_neighbors``-th nearest KB embedding.

    Parameters
    ----------
    n_neighbors : int
        k (capped by the KB size at fit).
    quantile, random_state
        As :class:`MaxCosineDetector`.
    """

    def __init__(self, n_neighbors: int = 10, *, quantile: float = 0.95, random_state: int = 0):
        super().__init__(quantile=quantile, random_state=random_state)
        self.n_neighbors = n_neighbors

    def _k(self, n_kb: int | None = None) -> int:
        k = int(self.n_neighbors)
        if n_kb is None and hasattr(self, "kb_"):
            n_kb = self.kb_.shape[0]
        if n_kb is not None:
            k = min(k, n_kb - 1)
        return max(k, 1)

    def fit(self, X: Any, y: Any = None) -> KNNDetector:
        kb = _id_rows(X, y)
        if self.n_neighbors >= kb.shape[0]:
            raise DataError(f"knn needs more than n_neighbors={self.n_neighbors} KB rows")
        super().fit(kb)
        return self


@register("mahalanobis", family="baseline", rank=1)
class MahalanobisDetector(OODDetector):
    """Baseline: Mahalanobis distance to the KB mean, Ledoit-Wolf shrunk covariance.

    Parameters
    ----------
    quantile : float
        ``predict`` threshold: this quantile of the training distances.

    Attributes
    ----------
    location_ : ndarray of shape (d,)
    prec_chol_ : ndarray of shape (d, d)
        L with L L^T = precision, so the distance is ||(x - location) L||.
    """

    fit_on = "kb"
    full_space = True

    def __init__(self, *, quantile: float = 0.95):
        self.quantile = quantile

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("full",)

    def fit(self, X: Any, y: Any = None) -> MahalanobisDetector:
        """Fit on the KB (or ID) embeddings ``X`` of shape (n, d)."""
        from sklearn.covariance import LedoitWolf

        X_id = _id_rows(X, y)
        if X_id.shape[0] < 2:
            raise DataError("mahalanobis needs at least 2 embeddings")
        lw = LedoitWolf().fit(X_id)
        self.location_ = np.asarray(lw.location_, dtype=np.float64)
        self.prec_chol_ = np.linalg.cholesky(np.asarray(lw.precision_, dtype=np.float64))
        self.n_features_in_ = X_id.shape[1]
        self.offset_ = self._offset_from(self.score_samples(X_id), self.quantile)
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        """Mahalanobis distance, higher = more out-of-domain; shape (n,).

        Parameters
        ----------
        X : ndarray of shape (n_queries, d)
        """
        Y = (self._check_X(X) - self.location_) @ self.prec_chol_
        return np.sqrt(np.einsum("ij,ij->i", Y, Y))

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"location": self.location_, "prec_chol": self.prec_chol_}

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.location_ = require_array(arrays, "location", 1).astype(np.float64)
        self.prec_chol_ = require_array(arrays, "prec_chol", 2).astype(np.float64)
        d = self.n_features_in_
        if self.location_.shape != (d,) or self.prec_chol_.shape != (d, d):
            raise ValueError("mahalanobis arrays do not match n_features_in_")
