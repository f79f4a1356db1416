"""Light classifiers in the PC space: logistic regression, SVM, Gaussian mixture, combined.

scikit-learn fits them; inference runs in numpy from the learned arrays (coefficients,
support vectors, mixture means and precision Cholesky factors), so a loaded model never
needs the scikit-learn object, and nothing is pickled.

Scores follow the product convention: higher = more out-of-domain (class 1).
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
    idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], max_samples, replace=False))
    return X[idx], y[idx]


@register("logreg")
class LogRegDetector(OODDetector):
    """Logistic regression, ID (0) vs OOD (1); needs OOD training queries.

    Parameters
    ----------
    C : float
        Inverse regularisation strength.
    class_weight : {"balanced"} or None
    standardize : bool
        Scale each feature to unit variance before fitting (folded into the coefficients).
    max_iter : int
    random_state : int

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        Weights on the raw (unstandardised) features.
    intercept_ : float
    """

    needs_ood = True

    def __init__(
        self,
        C: float = 1.0,
        *,
        class_weight: str | None = "balanced",
        standardize: bool = True,
        max_iter: int = 2000,
        random_state: int = 0,
    ):
        self.C = C
        self.class_weight = class_weight
        self.standardize = standardize
        self.max_iter = max_iter
        self.random_state = random_state

    def fit(self, X: Any, y: Any = None) -> LogRegDetector:
        """Fit on ``X`` (n_samples, n_features) with ``y`` (1 = OOD, 0 = ID)."""
        from sklearn.linear_model import LogisticRegression

        X = as_2d(X)
        lab = as_labels(y, X.shape[0])
        if lab is None:
            raise DataError(f"{self.kind} needs OOD training queries (label 1)")
        mu = X.mean(axis=0) if self.standardize else np.zeros(X.shape[1])
        sd = X.std(axis=0) if self.standardize else np.ones(X.shape[1])
        sd[sd <= 0] = 1.0
        clf = LogisticRegression(
            C=self.C,
            class_weight=self.class_weight,
            max_iter=self.max_iter,
            random_state=self.random_state,
        ).fit((X - mu) / sd, lab)
        w = clf.coef_[0] / sd
        self.coef_ = np.asarray(w, dtype=np.float64)
        self.intercept_ = float(clf.intercept_[0] - w @ mu)
        self.n_features_in_ = X.shape[1]
        self.offset_ = 0.0
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        """Log-odds of OOD, higher = more out-of-domain; shape (n,).

        Parameters
        ----------
        X : ndarray of shape (n_queries, n_features)
        """
        return np.asarray(self._check_X(X) @ self.coef_ + self.intercept_)

    def _learned(self) -> dict[str, Any]:
        return {"intercept_": self.intercept_}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"coef": self.coef_}

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.intercept_ = float(learned["intercept_"])
        self.coef_ = require_array(arrays, "coef", 1).astype(np.float64)
        if self.coef_.shape != (self.n_features_in_,):
            raise ValueError("coef does not match n_features_in_")


@register("combined")
class CombinedDetector(LogRegDetector):
    """Logistic regression over [selected PCs, residual norm(s), optional max-cosine / kNN].

    The product default. The model builds its input from ``features`` (blocks
    ``"pcs"``, ``"residual"``, ``"max_cosine"``, ``"knn"``, in that order), so adding a
    feature is a parameter, not new code.

    Parameters
    ----------
    C : float
        Inverse regularisation strength.
    features : sequence of str
        Input blocks, a subset of ``("pcs", "residual", "max_cosine", "knn")``. On CLINC150
        dev (MiniLM, m=30, k=128) the max-cosine feature adds ~0.002 mean AUROC.
    knn_ks : tuple of int
        For the ``"knn"`` block: one column per k, 1 - cosine of the k-th nearest KB
        document (full embedding space).
    neighbour_ks : tuple of int
        For the ``"neighbours"`` block: 1 - cosine of the k-th nearest labelled ID training
        query and of the k-th nearest OOD training query, per k (exact duplicates,
        cosine >= 0.9999, are skipped, at fit and at inference alike, so a training query
        is not its own neighbour). The banks are set by :meth:`set_banks` before fitting.
    class_weight, standardize, max_iter, random_state
        As :class:`LogRegDetector`.
    """

    _ALLOWED = ("pcs", "residual", "max_cosine", "knn", "neighbours")

    def __init__(
        self,
        C: float = 1.0,
        *,
        features: tuple[str, ...] | list[str] = ("pcs", "residual", "max_cosine"),
        knn_ks: tuple[int, ...] | list[int] = (5, 10),
        neighbour_ks: tuple[int, ...] | list[int] = (1, 5),
        class_weight: str | None = "balanced",
        standardize: bool = True,
        max_iter: int = 2000,
        random_state: int = 0,
    ):
        super().__init__(
            C,
            class_weight=class_weight,
            standardize=standardize,
            max_iter=max_iter,
            random_state=random_state,
        )
        self.features = features
        self.knn_ks = knn_ks
        self.neighbour_ks = neighbour_ks

    def set_banks(self, id_bank: Any, ood_bank: Any) -> None:
        """Labelled training embeddings for the ``"neighbours"`` block; (n, dim) each."""
        self.id_bank_ = np.asarray(id_bank, dtype=np.float32)
        self.ood_bank_ = np.asarray(ood_bank, dtype=np.float32)

    def _arrays(self) -> dict[str, np.ndarray]:
        out = super()._arrays()
        if "neighbours" in self.inputs:
            out.update({"id_bank": self.id_bank_, "ood_bank": self.ood_bank_})
        return out

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        super()._restore(learned, arrays)
        if "neighbours" in self.inputs:
            self.set_banks(
                require_array(arrays, "id_bank", 2), require_array(arrays, "ood_bank", 2)
            )

    @property
    def inputs(self) -> tuple[str, ...]:
        feats = tuple(self.features)
        bad = [f for f in feats if f not in self._ALLOWED]
        if bad or not feats:
            raise DataError(f"combined features must be a non-empty subset of {self._ALLOWED}")
        return tuple(f for f in self._ALLOWED if f in feats)


@register("svm")
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


@register("gmm")
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
        lp = self._const - 0.5 * Y.reshape(n, k, -1).sum(axis=2)  # (n, K) log p(x, k)
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
