"""Gaussian mixtures in the PC space.

scikit-learn fits them; inference runs in numpy from the stored mixture weights, means
and precision Cholesky factors, so a loaded model never needs the scikit-learn object and
nothing is pickled. Scores: higher = more out-of-domain (class 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._base import OODDetector, as_2d, as_labels, register, require_array


@register("gmm", family="paper", rank=5)
class GMMDetector(OODDetector):
    """Gaussian mixture (full covariances).

    With OOD training queries (``mode="auto"`` or ``"class_conditional"``): one mixture
    per class, score = log p(x | OOD) - log p(x | ID). With ID only (``"auto"`` or
    ``"id_only"``): score = -log p(x | ID). ``predict`` flags OOD when the ratio is
    positive (class-conditional) or when the score exceeds the ``quantile`` of the
    training ID scores (ID only).

    Parameters
    ----------
    n_components : int
        Components per class (capped by the class's number of points).
    mode : {"auto", "class_conditional", "id_only"}
    reg_covar : float
    quantile : float
    random_state : int
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        mode: str = "auto",
        reg_covar: float = 1e-6,
        quantile: float = 0.95,
        random_state: int = 0,
    ):
        self.n_components = n_components
        self.mode = mode
        self.reg_covar = reg_covar
        self.quantile = quantile
        self.random_state = random_state

    def _fit_one(self, X: np.ndarray) -> dict[str, np.ndarray]:
        from sklearn.mixture import GaussianMixture

        k = max(1, min(int(self.n_components), X.shape[0] // 2))
        g = GaussianMixture(
            n_components=k,
            covariance_type="full",
            reg_covar=self.reg_covar,
            random_state=self.random_state,
        ).fit(X)
        return {
            "weights": np.asarray(g.weights_, dtype=np.float64),
            "means": np.asarray(g.means_, dtype=np.float64),
            "prec_chol": np.asarray(g.precisions_cholesky_, dtype=np.float64),
        }

    def fit(self, X: Any, y: Any = None) -> GMMDetector:
        """Fit on ``X`` (n_samples, n_features); ``y`` 1 = OOD, 0 = ID, or None (ID only)."""
        if self.mode not in ("auto", "class_conditional", "id_only"):
            raise DataError(f"unknown gmm mode {self.mode!r}")
        X = as_2d(X)
        lab = as_labels(y, X.shape[0])
        if self.mode == "class_conditional" and lab is None:
            raise DataError("gmm mode 'class_conditional' needs OOD training queries")
        X_id = X if lab is None else X[lab == 0]
        self.n_features_in_ = X.shape[1]
        self.id_ = self._fit_one(X_id)
        use_ood = lab is not None and self.mode != "id_only"
        self.ood_ = self._fit_one(X[lab == 1]) if use_ood and lab is not None else None
        self._cache()
        self.offset_ = 0.0
        if self.ood_ is None:
            self.offset_ = self._offset_from(self.score_samples(X_id), self.quantile)
        return self

    def _cache(self) -> None:
        # Every component of both classes in one matrix, so a batch costs one product:
        # x @ W holds (x) L_k for each component k side by side.
        parts = [self._prep(self.id_)] + ([self._prep(self.ood_)] if self.ood_ else [])
        L = np.concatenate([p[0] for p in parts])  # (K, d, d)
        k, d = L.shape[0], L.shape[1]
        self._W = np.ascontiguousarray(L.transpose(1, 0, 2).reshape(d, k * d))
        self._muL = np.concatenate([p[1] for p in parts]).reshape(k * d)
        self._const = np.concatenate([p[2] for p in parts])
        self._n_id_components = parts[0][0].shape[0]

    @staticmethod
    def _prep(g: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # log N(x; mu, Sigma) = -0.5 (d log 2pi + |(x - mu) L|^2) + sum log diag L, per
        # component, with L the Cholesky factor of the precision; folded with log weights.
        L = g["prec_chol"]
        d = L.shape[1]
        mu_L = np.einsum("kj,kjl->kl", g["means"], L)
        const = (
            np.log(g["weights"])
            + np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
            - 0.5 * d * np.log(2.0 * np.pi)
        )
        return L, mu_L, const

    def score_samples(self, X: Any) -> np.ndarray:
        """OOD score, higher = more out-of-domain; shape (n,).

        Parameters
        ----------
        X : ndarray of shape (n_queries, n_features)
        """
        X = self._check_X(X)
        n, k = X.shape[0], self._const.shape[0]
        Y = X @ self._W
        Y -= self._muL
        Y *= Y
        lp = self._const - 0.5 * Y.reshape(n, k, X.shape[1]).sum(axis=2)  # (n, K) log p(x, k)
        ll_id = _logsumexp_rows(lp[:, : self._n_id_components])
        if self._n_id_components == k:
            return -ll_id
        return _logsumexp_rows(lp[:, self._n_id_components :]) - ll_id

    def _learned(self) -> dict[str, Any]:
        return {"class_conditional_": self.ood_ is not None}

    def _arrays(self) -> dict[str, np.ndarray]:
        out = {f"id_{k}": v for k, v in self.id_.items()}
        if self.ood_:
            out.update({f"ood_{k}": v for k, v in self.ood_.items()})
        return out

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        def part(prefix: str) -> dict[str, np.ndarray]:
            g = {
                "weights": require_array(arrays, f"{prefix}_weights", 1),
                "means": require_array(arrays, f"{prefix}_means", 2),
                "prec_chol": require_array(arrays, f"{prefix}_prec_chol", 3),
            }
            k, m = g["means"].shape
            if (
                g["weights"].shape != (k,)
                or g["prec_chol"].shape != (k, m, m)
                or (m != self.n_features_in_)
            ):
                raise ValueError(f"gmm {prefix} arrays have inconsistent shapes")
            return {n: a.astype(np.float64) for n, a in g.items()}

        self.id_ = part("id")
        self.ood_ = part("ood") if learned["class_conditional_"] else None
        self._cache()


def _logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """log(sum(exp(a), axis=1)) without overflow; shape (n,)."""
    top = a.max(axis=1)
    return np.asarray(top + np.log(np.exp(a - top[:, None]).sum(axis=1)))
