"""SVM in the PC space.

scikit-learn fits it; inference runs in numpy from the stored support vectors and dual
coefficients, so a loaded model never needs the scikit-learn object and nothing is
pickled. Scores: higher = more out-of-domain (class 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._base import OODDetector, as_2d, as_labels, register, require_array


def _subsample(
    X: np.ndarray, y: np.ndarray, max_samples: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if max_samples is None or X.shape[0] <= max_samples:
        return X, y
    rng = np.random.default_rng(seed)
    idx = rng.choice(X.shape[0], max_samples, replace=False)
    classes, counts = np.unique(y, return_counts=True)
    if np.unique(y[idx]).size < classes.size:
        # The draw missed a rare class (SVC would refuse a single class): draw each class
        # in proportion instead, at least one point of each, the largest making up the rest.
        take = np.maximum(1, np.floor(max_samples * counts / counts.sum()).astype(int))
        take[np.argmax(counts)] += max_samples - take.sum()
        parts = zip(classes, take, strict=True)
        idx = np.concatenate(
            [rng.choice(np.flatnonzero(y == c), k, replace=False) for c, k in parts]
        )
    idx = np.sort(idx)
    return X[idx], y[idx]


@register("svm", family="paper", rank=4)
class SVMDetector(OODDetector):
    """Support vector machine, linear or RBF.

    With OOD training queries: a two-class SVC (score = its decision function). With ID
    only: a one-class SVM (RBF; score = minus its decision function).

    Parameters
    ----------
    kernel : {"rbf", "linear"}
    C : float
        Two-class regularisation.
    gamma : "scale" or float
        RBF width (as scikit-learn).
    nu : float
        One-class: upper bound on the fraction of training ID points outside.
    class_weight : {"balanced"} or None
    max_samples : int or None
        Fit on a random subset of at most this many points (SVM fitting is quadratic).
    random_state : int
    """

    def __init__(
        self,
        kernel: str = "rbf",
        *,
        C: float = 1.0,
        gamma: str | float = "scale",
        nu: float = 0.05,
        class_weight: str | None = "balanced",
        max_samples: int | None = 5000,
        random_state: int = 0,
    ):
        self.kernel = kernel
        self.C = C
        self.gamma = gamma
        self.nu = nu
        self.class_weight = class_weight
        self.max_samples = max_samples
        self.random_state = random_state

    def fit(self, X: Any, y: Any = None) -> SVMDetector:
        """Fit on ``X`` (n_samples, n_features); ``y`` 1 = OOD, 0 = ID, or None (ID only)."""
        from sklearn.svm import SVC, OneClassSVM

        if self.kernel not in ("rbf", "linear"):
            raise DataError(f"svm kernel must be 'rbf' or 'linear', got {self.kernel!r}")
        if self.max_samples is not None and self.max_samples < 2:
            raise DataError(f"svm max_samples must be at least 2, got {self.max_samples}")
        X = as_2d(X)
        lab = as_labels(y, X.shape[0])
        y_all = np.zeros(X.shape[0], dtype=np.int8) if lab is None else lab
        Xs, ys = _subsample(X, y_all, self.max_samples, self.random_state)
        self.one_class_ = lab is None
        if self.one_class_:
            if self.kernel != "rbf":
                raise DataError("svm with ID-only training data needs kernel='rbf' (one-class)")
            svm: Any = OneClassSVM(kernel="rbf", gamma=self.gamma, nu=self.nu).fit(Xs)
            sign = -1.0  # OneClassSVM is positive inside
        else:
            svm = SVC(
                kernel=self.kernel,
                C=self.C,
                gamma=self.gamma,
                class_weight=self.class_weight,
                random_state=self.random_state,
            ).fit(Xs, ys)
            sign = 1.0  # positive towards classes_[1] = OOD
        self.gamma_ = float(svm._gamma)
        self.intercept_ = float(sign * svm.intercept_[0])
        if self.kernel == "linear":
            self.support_vectors_ = np.zeros((0, X.shape[1]))
            self.dual_coef_ = np.zeros(0)
            self.coef_ = np.asarray(sign * svm.coef_[0], dtype=np.float64)
        else:
            self.support_vectors_ = np.asarray(svm.support_vectors_, dtype=np.float64)
            self.dual_coef_ = np.asarray(sign * svm.dual_coef_[0], dtype=np.float64)
            self.coef_ = np.zeros(0)
        self._cache()
        self.n_features_in_ = X.shape[1]
        self.offset_ = 0.0
        return self

    def _cache(self) -> None:
        self._sv_sq = np.einsum("ij,ij->i", self.support_vectors_, self.support_vectors_)

    def score_samples(self, X: Any) -> np.ndarray:
        """Signed distance towards OOD, higher = more out-of-domain; shape (n,).

        Parameters
        ----------
        X : ndarray of shape (n_queries, n_features)
        """
        X = self._check_X(X)
        if self.kernel == "linear":
            return np.asarray(X @ self.coef_ + self.intercept_)
        sq = np.einsum("ij,ij->i", X, X)[:, None] + self._sv_sq[None, :]
        sq -= 2.0 * (X @ self.support_vectors_.T)
        np.maximum(sq, 0.0, out=sq)
        K = np.exp(-self.gamma_ * sq, out=sq)
        return np.asarray(K @ self.dual_coef_ + self.intercept_)

    def _learned(self) -> dict[str, Any]:
        return {
            "gamma_": self.gamma_,
            "intercept_": self.intercept_,
            "one_class_": bool(self.one_class_),
        }

    def _arrays(self) -> dict[str, np.ndarray]:
        return {
            "support_vectors": self.support_vectors_,
            "dual_coef": self.dual_coef_,
            "coef": self.coef_,
        }

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.gamma_ = float(learned["gamma_"])
        self.intercept_ = float(learned["intercept_"])
        self.one_class_ = bool(learned["one_class_"])
        self.support_vectors_ = require_array(arrays, "support_vectors", 2).astype(np.float64)
        self.dual_coef_ = require_array(arrays, "dual_coef", 1).astype(np.float64)
        self.coef_ = require_array(arrays, "coef", 1).astype(np.float64)
        if self.support_vectors_.shape[0] != self.dual_coef_.shape[0]:
            raise ValueError("support vectors and dual coefficients differ in number")
        self._cache()
