"""One call from embeddings to a calibrated :class:`OODModel`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring._base import make_detector, needs_ood_error
from sidecar.scoring._calibration import DEFAULT_TARGET_FRR, conformal_threshold
from sidecar.scoring._model import OODModel
from sidecar.scoring._subspace import KBSubspace, select_evr, select_pvalue

log = logging.getLogger(__name__)

DEFAULT_K = 128
CALIBRATION_FRACTION = 0.3


class _NamedEncoder(Protocol):
    """What fitting needs of an encoder: its name and width (no text is embedded here)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...


def _encoder_info(encoder: _NamedEncoder | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(encoder, Mapping):
        return {"name": str(encoder["name"]), "dim": int(encoder["dim"])}
    return {"name": str(encoder.name), "dim": int(encoder.dim)}


def _rows(name: str, E: Any, dim: int, *, minimum: int = 1) -> np.ndarray:
    arr = np.asarray(E, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise DataError(f"{name} must have shape (n, {dim}), got {arr.shape}")
    if arr.shape[0] < minimum:
        raise DataError(f"{name} needs at least {minimum} rows, got {arr.shape[0]}")
    return arr


def fit_ood_model(
    *,
    kb: str,
    encoder: _NamedEncoder | Mapping[str, Any],
    kb_embeddings: Any,
    id_embeddings: Any,
    ood_embeddings: Any = None,
    calibration_embeddings: Any = None,
    detector: str = "combined",
    criterion: str = "pvalue",
    m: int = 13,
    k: int | None = None,
    target_frr: float = DEFAULT_TARGET_FRR,
    seed: int = 0,
    detector_params: Mapping[str, Any] | None = None,
    residual_ks: tuple[int, ...] | None = None,
    pca_method: str = "auto",
    subspaces: dict[tuple[int, str, int], KBSubspace] | None = None,
) -> OODModel:
    """Fit the KB subspace, select PCs, fit the detector and calibrate its threshold.

    Parameters
    ----------
    kb : str
        KB name recorded in the model.
    encoder : Encoder or {"name", "dim"}
        The encoder that produced every embedding below.
    kb_embeddings : ndarray of shape (n_docs, dim)
        KB documents; the PCA is fitted on them.
    id_embeddings : ndarray of shape (n_id, dim)
        ID training queries (also the calibration pool when ``calibration_embeddings``
        is None: a ``seed``-ed 30 % of them is held out).
    ood_embeddings : ndarray of shape (n_ood, dim), optional
        OOD training queries; required by ``criterion="pvalue"`` and by supervised
        detectors (``logreg``, ``combined``).
    calibration_embeddings : ndarray of shape (n_cal, dim), optional
        Held-out ID queries for the conformal threshold.
    detector : str
        A registered detector kind.
    criterion : {"pvalue", "evr"}
    m : int
        Number of PCs the detector sees.
    k : int, optional
        Top PCs spanning the KB subspace (residual and p-value pool); default
        ``min(128, n_docs - 1, dim)`` and at least ``m``.
    target_frr : float
        Target false-reject rate (ID flagged OOD) of the calibrated threshold.
    seed : int
        Seeds the calibration split, the PCA and the detector (when it takes a seed).
    detector_params : dict, optional
        Hyperparameters of the detector.
    residual_ks : tuple of int, optional
        The k of each residual feature (default ``(k,)``); each must be <= k.
    pca_method : str
        :class:`KBSubspace` solver.
    subspaces : dict, optional
        Fitted subspaces of these same ``kb_embeddings``, keyed by (k, pca_method, seed):
        one found there is reused, a new one is added. The PCA depends on the KB alone,
        so a search that fits many candidates on one KB fits it once. The caller keeps
        one dict per KB.

    Returns
    -------
    OODModel
    """
    enc = _encoder_info(encoder)
    dim = enc["dim"]
    KB = _rows("kb_embeddings", kb_embeddings, dim, minimum=2)
    ID = _rows("id_embeddings", id_embeddings, dim)
    OOD = None if ood_embeddings is None else _rows("ood_embeddings", ood_embeddings, dim)
    if OOD is not None and OOD.shape[0] == 0:
        OOD = None
    if criterion not in ("pvalue", "evr"):
        raise ConfigError(f"criterion must be 'pvalue' or 'evr', got {criterion!r}")

    params = dict(detector_params or {})
    det = make_detector(detector, **params)
    if "random_state" in det.get_params() and "random_state" not in params:
        det.set_params(random_state=seed)
    if det.needs_ood and OOD is None:
        raise ConfigError(needs_ood_error(detector))

    # Calibration split: never calibrate on queries the detector was fitted on.
    if calibration_embeddings is None:
        if ID.shape[0] < 4:
            raise DataError("need at least 4 ID queries to hold some out for calibration")
        perm = np.random.default_rng(seed).permutation(ID.shape[0])
        n_cal = max(1, round(CALIBRATION_FRACTION * ID.shape[0]))
        CAL, ID_fit = ID[np.sort(perm[:n_cal])], ID[np.sort(perm[n_cal:])]
    else:
        CAL, ID_fit = _rows("calibration_embeddings", calibration_embeddings, dim), ID

    uses_pcs = "pcs" in det.inputs
    k_eff = min(int(k) if k is not None else max(DEFAULT_K, m), KB.shape[0] - 1, dim)
    if not uses_pcs:
        # The PCs only serve reports here: do not fail on a small KB or a missing OOD set.
        m = min(m, k_eff)
        if OOD is None:
            criterion = "evr"
    if m > k_eff:
        raise ConfigError(f"m={m} exceeds the k={k_eff} PCs the KB supports")
    ks = tuple(int(x) for x in (residual_ks or (k_eff,)))
    if any(not 1 <= x <= k_eff for x in ks):
        raise ConfigError(f"residual_ks {ks} must lie in 1..{k_eff}")
    key = (k_eff, pca_method, seed)
    sub = None if subspaces is None else subspaces.get(key)
    if sub is None or sub.mean_.shape != (dim,):
        sub = KBSubspace(k_eff, method=pca_method, random_state=seed).fit(KB)  # type: ignore[arg-type]
        if subspaces is not None:
            subspaces[key] = sub
    k_eff = sub.n_components_

    if criterion == "evr":
        selected = select_evr(sub, m)
    else:
        if OOD is None:
            raise ConfigError("criterion 'pvalue' needs OOD training queries; use 'evr'")
        selected = select_pvalue(sub.project(ID_fit), sub.project(OOD), m)

    uses_maxcos = "max_cosine" in det.inputs or "knn" in det.inputs
    if "neighbours" in det.inputs:
        if OOD is None:
            raise ConfigError("the neighbours block needs OOD training queries")
        det.set_banks(ID_fit, OOD)
    shell = OODModel(
        kb=kb,
        encoder=enc,
        detector_name=detector,
        detector=det,
        mean=sub.mean_.astype(np.float32),
        components=sub.components_.astype(np.float32),
        selected_pcs=selected,
        k=k_eff,
        criterion=criterion,
        threshold=float("nan"),
        residual_ks=ks,
        kb_embeddings=KB if uses_maxcos else None,
        explained_variance_ratio=sub.explained_variance_ratio_,
    )
    if det.fit_on == "kb":
        det.fit(shell.features(KB))
    elif OOD is None:
        det.fit(shell.features(ID_fit))
    else:
        X = shell.features(np.vstack([ID_fit, OOD]))
        y = np.r_[np.zeros(ID_fit.shape[0], np.int8), np.ones(OOD.shape[0], np.int8)]
        det.fit(X, y)

    cal_scores = shell.score(CAL)
    threshold = conformal_threshold(cal_scores, target_frr)
    metrics = {
        "n_kb": int(KB.shape[0]),
        "n_id_fit": int(ID_fit.shape[0]),
        "n_ood_fit": 0 if OOD is None else int(OOD.shape[0]),
        "n_calibration": int(CAL.shape[0]),
        "calibration_frr": float(np.mean(cal_scores > threshold)),
        "evr_selected": float(sub.explained_variance_ratio_[selected].sum()),
    }
    fit_params = {
        "m": int(m),
        "k": int(k_eff),
        "criterion": criterion,
        "seed": int(seed),
        "target_frr": float(target_frr),
        "detector_params": det.to_state()[0]["hyper"],
        "pca_method": sub.method_,
        "residual_ks": list(ks),
    }
    log.info("fitted %s for KB %s: m=%s k=%s threshold=%.4g", detector, kb, m, k_eff, threshold)
    return OODModel(
        kb=kb,
        encoder=enc,
        detector_name=detector,
        detector=det,
        mean=shell.mean,
        components=shell.components,
        selected_pcs=selected,
        k=k_eff,
        criterion=criterion,
        threshold=threshold,
        metrics=metrics,
        params=fit_params,
        residual_ks=ks,
        kb_embeddings=shell.kb_embeddings,
        explained_variance_ratio=sub.explained_variance_ratio_,
    )
