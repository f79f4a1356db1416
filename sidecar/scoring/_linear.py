"""Logistic regression in the PC space, and the combined detector built on it.

scikit-learn fits them; inference is one dot product in numpy with the stored
coefficients (over the feature columns the model builds, for the combined detector), so a
loaded model never needs the scikit-learn object and nothing is pickled. Scores: higher =
more out-of-domain (class 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._base import OODDetector, as_2d, as_labels, register, require_array


@register("logreg", family="paper", rank=3)
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


@register("combined", family="product", rank=1)
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
    bank_max : int or None
        At most this many rows per bank, a subsample seeded by ``random_state``; None keeps
        every labelled training query. Scoring costs one dot product per bank row: on
        CLINC150 dev, 2,000 rows per bank scored 2.1x faster than all of them (up to 6,000
        ID and 4,000 OOD) for -0.0002 mean AUROC (``benchmarks/results/neighbour_bank.json``).
    floor : sequence of str or None
        Evidence learned from no OOD query, which the supervised part cannot override:
        blocks among ``("residual", "max_cosine", "knn", "neighbours")``, each one of
        ``features`` (of ``"neighbours"``, the distances to the labelled ID queries only).
        The score is then the larger of the regression's log-odds and the mean of those
        columns, each put on one scale by the ID training rows (see :meth:`score_samples`),
        so a query far from the KB and from every ID query is refused whatever the OOD
        families the weights learned from. The model tells the detector its block widths
        (:meth:`set_blocks`).
    floor_select : {"mean", "best"}
        ``"mean"``: the floor is the mean of every floor column. ``"best"``: of the floor's
        blocks, the one whose mean column best separates the ID from the OOD training rows
        (AUROC), alone: the labels choose which distance to trust (a narrow FAQ's subspace
        residual, a broad site's k-th nearest document), not a direction to look in.
    class_weight, standardize, max_iter, random_state
        As :class:`LogRegDetector`.
    """

    # the blocks it can take, in the order it stacks them
    FEATURE_BLOCKS = ("pcs", "residual", "max_cosine", "knn", "neighbours")
    # the blocks a floor may read: distances to the KB (and to the labelled ID queries)
    FLOOR_BLOCKS = ("residual", "max_cosine", "knn", "neighbours")
    # The ID quantiles the scales are pinned to: 1 is the 99th percentile of a floor
    # column over the ID training rows, and of the regression's log-odds of those rows
    # from fits that did not see them (cross-fitted: its in-sample log-odds are
    # optimistic, which made the regression too loud in the ID tail). Pinned so, the two
    # share the ID tail evenly and the threshold costs the learned families almost
    # nothing: against the earlier pins (floor at its 95th percentile, the regression at
    # the 99th of its in-sample log-odds) standard-protocol balanced accuracy went from
    # 0.974 to 0.986 (covid) and from 0.931 to 0.957 (StackExchange), for 0.001 to 0.003
    # AUROC under unseen OOD (benchmarks/results/unseen_ood_ablation_*.json).
    FLOOR_QUANTILE = 0.99
    SUPERVISED_QUANTILE = 0.99
    # "cross_fit" or "in_sample": which log-odds of the ID rows pin the regression.
    SUPERVISED_PIN = "cross_fit"

    def __init__(
        self,
        C: float = 1.0,
        *,
        features: tuple[str, ...] | list[str] = ("pcs", "residual", "max_cosine"),
        knn_ks: tuple[int, ...] | list[int] = (5, 10),
        neighbour_ks: tuple[int, ...] | list[int] = (1, 3, 10),
        bank_max: int | None = None,
        floor: tuple[str, ...] | list[str] | None = None,
        floor_select: str = "mean",
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
        self.bank_max = bank_max
        self.floor = floor
        self.floor_select = floor_select

    def set_banks(self, id_bank: Any, ood_bank: Any) -> None:
        """Labelled training embeddings for the ``"neighbours"`` block; (n, dim) each, cut
        to ``bank_max`` rows each (a seeded subsample, rows kept in order)."""
        cap = self.bank_max
        if cap is not None and (int(cap) != cap or cap < 1):
            raise DataError(f"bank_max must be a positive integer or None, got {cap!r}")
        rng = np.random.default_rng(self.random_state)

        def cut(bank: Any) -> np.ndarray:
            B = np.asarray(bank, dtype=np.float32)
            if cap is None or len(B) <= cap:
                return B
            return B[np.sort(rng.choice(len(B), int(cap), replace=False))]

        self.id_bank_ = cut(id_bank)
        self.ood_bank_ = cut(ood_bank)

    def set_blocks(self, widths: Mapping[str, int]) -> None:
        """The number of columns of each input block (the model that builds the input
        knows them), so that the floor finds its columns."""
        self.block_widths_ = {b: int(widths[b]) for b in self.inputs}

    def _floor_columns(self, only: str | None = None) -> np.ndarray:
        """The columns of the floor's blocks (of block ``only`` when given)."""
        blocks = tuple(self.floor or ())
        bad = [b for b in blocks if b not in self.FLOOR_BLOCKS or b not in self.inputs]
        if bad:
            raise DataError(
                f"floor blocks {bad} must be KB-only blocks {self.FLOOR_BLOCKS} among the "
                f"features {self.inputs}"
            )
        widths = getattr(self, "block_widths_", None)
        if widths is None:
            raise DataError("a floor needs the block widths (set_blocks) before fitting")
        cols: list[int] = []
        start = 0
        for b in self.inputs:
            if b in blocks and only in (None, b):
                # of the neighbours block, the ID half: its OOD half is learned from OOD
                n = widths[b] // 2 if b == "neighbours" else widths[b]
                cols += range(start, start + n)
            start += widths[b]
        return np.asarray(cols, dtype=np.int64)

    def fit(self, X: Any, y: Any = None) -> CombinedDetector:
        """Fit the regression on ``X`` (n_samples, n_features) with ``y`` (1 = OOD,
        0 = ID); with a floor, put the regression and the floor columns on one scale by
        the ID rows: 0 at their median, 1 at ``SUPERVISED_QUANTILE`` / ``FLOOR_QUANTILE``
        (the regression's by its log-odds of those rows from fits that did not see them,
        :attr:`SUPERVISED_PIN`)."""
        super().fit(X, y)
        if not self.floor:
            return self
        X = as_2d(X)
        lab = as_labels(y, X.shape[0])
        ID = X if lab is None else X[lab == 0]
        self.floor_block_ = None
        if self.floor_select == "best" and lab is not None:
            self.floor_block_ = self._best_floor_block(X, lab)
        elif self.floor_select not in ("mean", "best"):
            raise DataError(f"floor_select must be 'mean' or 'best', not {self.floor_select!r}")
        cols = self._floor_columns(self.floor_block_)
        self.floor_cols_ = cols
        sup_id = (
            self._cross_fit_id_log_odds(X, lab)
            if self.SUPERVISED_PIN == "cross_fit" and lab is not None
            else ID @ self.coef_ + self.intercept_
        )
        self.sup_center_, self.sup_spread_ = _pin(sup_id, self.SUPERVISED_QUANTILE)
        pinned = [_pin(ID[:, c], self.FLOOR_QUANTILE) for c in cols]
        self.floor_center_ = np.array([p[0] for p in pinned], dtype=np.float64)
        self.floor_spread_ = np.array([p[1] for p in pinned], dtype=np.float64)
        return self

    def _cross_fit_id_log_odds(self, X: np.ndarray, lab: np.ndarray) -> np.ndarray:
        """The regression's log-odds of each ID row of ``X`` from a fit that did not see
        it (5 stratified folds, fewer where a class has fewer rows; this detector's
        settings); shape (n_id,). With a single row of a class, the in-sample log-odds."""
        from sklearn.model_selection import StratifiedKFold

        n_folds = min(5, int(np.bincount(lab.astype(np.int64), minlength=2).min()))
        if n_folds < 2:  # one OOD row (or one ID row): nothing to hold out
            return X[lab == 0] @ self.coef_ + self.intercept_
        folds = StratifiedKFold(n_folds, shuffle=True, random_state=self.random_state)
        out = np.empty(X.shape[0], dtype=np.float64)
        for train, held in folds.split(X, lab):
            part = LogRegDetector(
                self.C,
                class_weight=self.class_weight,
                standardize=self.standardize,
                max_iter=self.max_iter,
                random_state=self.random_state,
            ).fit(X[train], lab[train])
            out[held] = part.score_samples(X[held])
        return out[lab == 0]

    def _best_floor_block(self, X: np.ndarray, lab: np.ndarray) -> str:
        """The floor block whose pinned mean column best separates the ID rows of ``X``
        from its OOD rows (AUROC; the first of the floor's blocks on a tie)."""
        from sklearn.metrics import roc_auc_score

        ID = X[lab == 0]
        best, best_auc = "", -1.0
        for block in self.FLOOR_BLOCKS:
            if block not in (self.floor or ()):
                continue
            cols = self._floor_columns(block)
            pins = [_pin(ID[:, c], self.FLOOR_QUANTILE) for c in cols]
            z = np.mean([(X[:, c] - p[0]) / p[1] for c, p in zip(cols, pins, strict=True)], axis=0)
            auc = float(roc_auc_score(lab, z))
            if auc > best_auc:
                best, best_auc = block, auc
        return best

    def score_samples(self, X: Any) -> np.ndarray:
        """OOD score, higher = more out-of-domain; shape (n,).

        Without a floor, the log-odds of OOD. With one, the larger of the log-odds and
        the mean floor column, each pinned by the ID training rows (0 at their median,
        1 at their ``SUPERVISED_QUANTILE`` / ``FLOOR_QUANTILE``).

        Parameters
        ----------
        X : ndarray of shape (n_queries, n_features)
        """
        X = self._check_X(X)
        s = np.asarray(X @ self.coef_ + self.intercept_)
        if not self.floor:
            return s
        sup = (s - self.sup_center_) / self.sup_spread_
        kb = ((X[:, self.floor_cols_] - self.floor_center_) / self.floor_spread_).mean(axis=1)
        return np.maximum(sup, kb)

    def _learned(self) -> dict[str, Any]:
        out = super()._learned()
        if self.floor:
            out.update(
                {
                    "block_widths_": dict(self.block_widths_),
                    "floor_block_": self.floor_block_,
                    "sup_center_": self.sup_center_,
                    "sup_spread_": self.sup_spread_,
                }
            )
        return out

    def _arrays(self) -> dict[str, np.ndarray]:
        out = super()._arrays()
        if "neighbours" in self.inputs:
            out.update({"id_bank": self.id_bank_, "ood_bank": self.ood_bank_})
        if self.floor:
            out.update({"floor_center": self.floor_center_, "floor_spread": self.floor_spread_})
        return out

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        super()._restore(learned, arrays)
        if "neighbours" in self.inputs:
            self.set_banks(
                require_array(arrays, "id_bank", 2), require_array(arrays, "ood_bank", 2)
            )
        if self.floor:
            self.set_blocks(learned["block_widths_"])
            self.floor_block_ = learned.get("floor_block_")
            self.floor_cols_ = self._floor_columns(self.floor_block_)
            self.sup_center_ = float(learned["sup_center_"])
            self.sup_spread_ = float(learned["sup_spread_"])
            self.floor_center_ = require_array(arrays, "floor_center", 1).astype(np.float64)
            self.floor_spread_ = require_array(arrays, "floor_spread", 1).astype(np.float64)
            n = len(self.floor_cols_)
            if self.floor_center_.shape != (n,) or self.floor_spread_.shape != (n,):
                raise ValueError("floor arrays do not match the floor columns")
            if sum(self.block_widths_.values()) != self.n_features_in_:
                raise ValueError("block widths do not add up to n_features_in_")

    @property
    def inputs(self) -> tuple[str, ...]:
        feats = tuple(self.features)
        bad = [f for f in feats if f not in self.FEATURE_BLOCKS]
        if bad or not feats:
            raise DataError(
                f"combined features must be a non-empty subset of {self.FEATURE_BLOCKS}"
            )
        return tuple(f for f in self.FEATURE_BLOCKS if f in feats)


def _pin(v: np.ndarray, q: float) -> tuple[float, float]:
    """(median, spread) of ID scores ``v``: the spread is the distance from the median to
    the ``q`` quantile (the standard deviation where that is 0, else 1)."""
    center = float(np.median(v))
    spread = float(np.quantile(v, q)) - center
    if not spread > 0:
        spread = float(np.std(v)) or 1.0
    return center, spread
