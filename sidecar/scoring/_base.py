"""The detector contract, the registry of detector kinds and the state codec.

Every detector follows scikit-learn's estimator contract: ``__init__`` stores
hyperparameters only, ``fit(X, y=None)`` returns ``self``, learned state ends in ``_``,
and the scoring methods raise :class:`~sidecar.errors.NotFittedError` before ``fit``.

The product has one score convention: ``score_samples(X)`` returns an **OOD score,
higher = more out-of-domain**. Labels follow it too: ``y`` is 1 for OOD, 0 for ID.

A fitted detector serialises to ``(params, arrays)``: a JSON dict (hyperparameters and
learned scalars) and named numpy arrays. :meth:`OODDetector.from_state` rebuilds it, and
inference then runs with numpy/scipy alone; nothing is ever pickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
from sklearn.base import BaseEstimator

from sidecar.errors import DataError, InvalidModelState, NotFittedError

# Input blocks a detector can ask the model for (see ``OODModel.features``):
#   "pcs"        (n, m)  query projected on the selected KB principal components
#   "residual"   (n, r)  norm of the query residual outside the top-k PCs, one column per k
#   "max_cosine" (n, 1)  1 - max cosine similarity to any KB embedding (full space)
#   "full"       (n, d)  the embedding itself
INPUT_BLOCKS = ("pcs", "residual", "max_cosine", "knn", "neighbours", "full")

# Detector families, in the order tables list them (reports and JSON keys follow it): the
# reference paper's detectors, the product's own, then the baselines it is compared with.
FAMILIES = ("paper", "product", "baseline")

_REGISTRY: dict[str, type[OODDetector]] = {}
_D = TypeVar("_D", bound="type[OODDetector]")


def register(kind: str, *, family: str, rank: int) -> Callable[[_D], _D]:
    """Class decorator: make a detector constructible and loadable by ``kind``.

    ``family`` is one of :data:`FAMILIES`; ``rank`` is the detector's place among its
    family in tables (:func:`detector_table`).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")

    def deco(cls: _D) -> _D:
        if kind in _REGISTRY:
            raise RuntimeError(f"detector kind {kind!r} registered twice")
        cls.kind, cls.family, cls.table_rank = kind, family, rank
        _REGISTRY[kind] = cls
        return cls

    return deco


def detector_kinds() -> tuple[str, ...]:
    """Names of every registered detector kind, sorted."""
    return tuple(sorted(_REGISTRY))


def detector_table(*families: str) -> tuple[str, ...]:
    """Registered kinds in table order, the order reports and JSON keys follow: family by
    family as :data:`FAMILIES` lists them, each by its rank; only ``families`` when given."""
    kinds = [k for k, cls in _REGISTRY.items() if not families or cls.family in families]
    return tuple(
        sorted(kinds, key=lambda k: (FAMILIES.index(_REGISTRY[k].family), _REGISTRY[k].table_rank))
    )


def detector_class(kind: str) -> type[OODDetector]:
    """The class registered for ``kind``; ``KeyError`` for an unknown kind."""
    return _REGISTRY[kind]


def needs_ood_error(kind: str) -> str:
    """Why ``kind`` cannot be fitted without OOD training queries, and what can be."""
    return (
        f"detector {kind!r} needs OOD training queries (--ood-queries: questions the KB must "
        "refuse); without them use a KB-only detector, e.g. --detector residual or max_cosine"
    )


def make_detector(kind: str, **params: Any) -> OODDetector:
    """Construct an unfitted detector of ``kind`` with hyperparameters ``params``."""
    from sidecar.errors import ConfigError

    try:
        cls = _REGISTRY[kind]
    except KeyError:
        raise ConfigError(
            f"unknown detector {kind!r}; choose one of {', '.join(detector_kinds())}"
        ) from None
    try:
        return cls(**params)
    except TypeError as exc:
        raise ConfigError(f"bad parameters for detector {kind!r}: {exc}") from exc


def as_2d(X: Any, *, dtype: type = np.float64) -> np.ndarray:
    """``X`` as a C-contiguous 2-D array of ``dtype`` (no copy when it already is one)."""
    arr: np.ndarray = np.asarray(X, dtype=dtype)
    if arr.ndim != 2:
        raise DataError(f"expected a 2-D array (n_samples, n_features), got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def as_labels(y: Any, n: int) -> np.ndarray | None:
    """Labels as int8 (1 = OOD, 0 = ID), or None when absent or all ID."""
    if y is None:
        return None
    raw = np.asarray(y).ravel()
    if raw.shape[0] != n:
        raise DataError(f"{raw.shape[0]} labels for {n} samples")
    # checked before the cast: int8 would wrap 256 to 0 and truncate 0.7 to 0
    if not np.isin(raw, (0, 1)).all():
        raise DataError("labels must be 0 (ID) or 1 (OOD)")
    lab = raw.astype(np.int8)
    if not (lab == 0).any():
        raise DataError("training data has no ID sample (label 0)")
    return lab if (lab == 1).any() else None


class OODDetector(BaseEstimator):
    """Base class of every detector.

    Subclasses set ``inputs`` (the blocks they score, see ``INPUT_BLOCKS``), ``fit_on``
    (``"labelled"``: ID and OOD training queries; ``"kb"``: the KB embeddings only) and
    ``needs_ood`` (whether OOD training queries are required), and implement ``fit``,
    ``score_samples``, ``_learned`` / ``_arrays`` / ``_restore`` for the state codec.
    What other packages ask of a kind is declared here too: ``full_space`` (it scores
    the embedding itself, not the selected PCs, so the PC-dimension budget does not
    apply), ``geometric`` (one of the paper's epsilon neighbourhoods); ``family`` and
    ``table_rank`` are set by :func:`register`.
    """

    kind: ClassVar[str] = ""
    family: ClassVar[str] = ""
    table_rank: ClassVar[int] = 0
    full_space: ClassVar[bool] = False
    geometric: ClassVar[bool] = False
    fit_on: ClassVar[str] = "labelled"
    needs_ood: ClassVar[bool] = False
    _fitted_attr: ClassVar[str] = "n_features_in_"

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input blocks this detector scores, in column order."""
        return ("pcs",)

    # -- the contract --------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> OODDetector:  # pragma: no cover - abstract
        raise NotImplementedError

    def score_samples(self, X: Any) -> np.ndarray:  # pragma: no cover - abstract
        """OOD score of each row, higher = more out-of-domain; ndarray of shape (n,)."""
        raise NotImplementedError

    def decision_function(self, X: Any) -> np.ndarray:
        """``score_samples(X) - offset_``: positive means OOD at the detector's own
        threshold. (The epsilon detectors' ``predict`` is the paper's neighbour vote,
        which can disagree with this continuous score near a tie.)"""
        return self.score_samples(X) - float(self.offset_)

    def predict(self, X: Any) -> np.ndarray:
        """1 for OOD, 0 for ID, at the detector's own natural rule; shape (n,)."""
        return (self.decision_function(X) > 0).astype(np.int8)

    def check_fitted(self) -> None:
        if not hasattr(self, self._fitted_attr):
            raise NotFittedError(
                f"{type(self).__name__} is not fitted yet; call fit(X, y) before scoring"
            )

    def _check_X(self, X: Any) -> np.ndarray:
        self.check_fitted()
        arr = as_2d(X)
        if arr.shape[1] != self.n_features_in_:
            raise DataError(
                f"{type(self).__name__} was fitted on {self.n_features_in_} features, "
                f"got {arr.shape[1]}"
            )
        return arr

    def _offset_from(self, train_scores: np.ndarray, quantile: float) -> float:
        return float(np.quantile(train_scores, quantile)) if train_scores.size else 0.0

    # -- state codec -----------------------------------------------------------------
    def _learned(self) -> dict[str, Any]:
        """Learned scalars (JSON) besides ``n_features_in_`` and ``offset_``."""
        return {}

    def _arrays(self) -> dict[str, np.ndarray]:
        """Learned arrays, by name."""
        return {}

    def _restore(self, learned: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Set learned state from ``_learned()`` / ``_arrays()`` output; rebuild caches."""

    def to_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(params, arrays)``: JSON hyperparameters and learned scalars, and named arrays."""
        self.check_fitted()
        learned = {
            "n_features_in_": int(self.n_features_in_),
            "offset_": float(self.offset_),
            **self._learned(),
        }
        params = {"kind": self.kind, "hyper": _jsonable(self.get_params()), "learned": learned}
        json.dumps(params, allow_nan=False)  # fail here, not in the store
        return params, {k: np.ascontiguousarray(v) for k, v in self._arrays().items()}

    @classmethod
    def from_state(cls, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> OODDetector:
        """Rebuild a fitted detector; :class:`~sidecar.errors.InvalidModelState` if malformed."""
        try:
            kind = params.get("kind", cls.kind)
            target = cls if cls.kind == kind else _REGISTRY[kind]
            det = target(**dict(params["hyper"]))
            learned = dict(params["learned"])
            det.n_features_in_ = int(learned["n_features_in_"])
            det.offset_ = float(learned["offset_"])
            det._restore(learned, arrays)
        except InvalidModelState:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise InvalidModelState(
                f"detector state is malformed ({type(exc).__name__}: {exc})"
            ) from exc
        return det


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def require_array(arrays: Mapping[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    """Fetch a state array and check its rank; InvalidModelState otherwise."""
    if name not in arrays:
        raise InvalidModelState(f"detector state lacks array {name!r}")
    arr = np.asarray(arrays[name])
    if arr.ndim != ndim:
        raise InvalidModelState(f"detector array {name!r} has rank {arr.ndim}, want {ndim}")
    return arr
