"""One call from embeddings to a calibrated :class:`OODModel`.

:func:`fit_model` fits what a :class:`FitConfig` describes on the KB, ID and OOD
embeddings, in named steps: check the inputs, build the detector, hold out the
calibration queries, fit the KB subspace, select the PCs, build the detector's inputs,
fit the detector, calibrate its threshold and assemble the model. :func:`fit_ood_model`
is the same call with the settings as keyword arguments.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.scoring._base import OODDetector, make_detector, needs_ood_error
from sidecar.scoring._calibration import DEFAULT_TARGET_FRR, conformal_threshold
from sidecar.scoring._deny import DenyScreen, DenyTopics
from sidecar.scoring._model import OODModel
from sidecar.scoring._subspace import KBSubspace, select_evr, select_pvalue

log = logging.getLogger(__name__)

DEFAULT_K = 128
CALIBRATION_FRACTION = 0.3

# Fitted subspaces of one KB's embeddings, keyed by (k, pca_method, seed).
Subspaces = dict[tuple[int, str, int], KBSubspace]


class _NamedEncoder(Protocol):
    """What fitting needs of an encoder: its name and width (no text is embedded here)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...


@dataclass(frozen=True)
class FitConfig:
    """How :func:`fit_model` fits: the detector, the PC selection and the calibration.

    Attributes
    ----------
    detector : str
        A registered detector kind.
    detector_params : dict
        Hyperparameters of the detector.
    criterion : {"pvalue", "evr"}
        PC selection.
    m : int
        Number of PCs the detector sees.
    k : int, optional
        Top PCs spanning the KB subspace (residual and p-value pool); default
        ``min(128, n_docs - 1, dim)`` and at least ``m``.
    residual_ks : tuple of int, optional
        The k of each residual feature (default ``(k,)``); each must be <= k.
    target_frr : float
        Target false-reject rate (ID flagged OOD) of the calibrated threshold.
    seed : int
        Seeds the calibration split, the PCA and the detector (when it takes a seed).
    pca_method : str
        :class:`KBSubspace` solver.
    calibration_fraction : float
        Share of the ID queries held out for calibration when no calibration queries
        are given.
    """

    detector: str = "combined"
    detector_params: Mapping[str, Any] = field(default_factory=dict)
    criterion: str = "pvalue"
    m: int = 13
    k: int | None = None
    residual_ks: tuple[int, ...] | None = None
    target_frr: float = DEFAULT_TARGET_FRR
    seed: int = 0
    pca_method: str = "auto"
    calibration_fraction: float = CALIBRATION_FRACTION


@dataclass(frozen=True)
class _Data:
    """The checked embeddings: KB, ID to fit on, OOD (None when absent), calibration."""

    KB: np.ndarray
    ID_fit: np.ndarray
    OOD: np.ndarray | None
    CAL: np.ndarray


@dataclass(frozen=True)
class _Subspace:
    """The fitted KB subspace and the m, k, criterion and residual ks it allows."""

    sub: KBSubspace
    m: int
    k: int
    criterion: str
    residual_ks: tuple[int, ...]


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
    subspaces: Subspaces | None = None,
    deny_topics: DenyTopics | None = None,
) -> OODModel:
    """Fit the KB subspace, select PCs, fit the detector and calibrate its threshold.

    :func:`fit_model` with the :class:`FitConfig` fields as keyword arguments
    (``detector_params=None`` is no parameters); see both for every argument.

    Returns
    -------
    OODModel
    """
    config = FitConfig(
        detector=detector,
        detector_params=dict(detector_params or {}),
        criterion=criterion,
        m=m,
        k=k,
        residual_ks=residual_ks,
        target_frr=target_frr,
        seed=seed,
        pca_method=pca_method,
    )
    return fit_model(
        kb_embeddings,
        id_embeddings,
        ood_embeddings,
        calibration_embeddings,
        kb=kb,
        encoder=encoder,
        config=config,
        subspaces=subspaces,
        deny_topics=deny_topics,
    )


def fit_model(
    kb_embeddings: Any,
    id_embeddings: Any,
    ood_embeddings: Any = None,
    calibration_embeddings: Any = None,
    *,
    kb: str,
    encoder: _NamedEncoder | Mapping[str, Any],
    config: FitConfig | None = None,
    subspaces: Subspaces | None = None,
    deny_topics: DenyTopics | None = None,
) -> OODModel:
    """Fit the KB subspace, select PCs, fit the detector and calibrate its threshold.

    Parameters
    ----------
    kb_embeddings : ndarray of shape (n_docs, dim)
        KB documents; the PCA is fitted on them.
    id_embeddings : ndarray of shape (n_id, dim)
        ID training queries (also the calibration pool when ``calibration_embeddings``
        is None: a ``config.seed``-ed ``config.calibration_fraction`` of them is held out).
    ood_embeddings : ndarray of shape (n_ood, dim), optional
        OOD training queries; required by ``criterion="pvalue"`` and by supervised
        detectors (``logreg``, ``combined``).
    calibration_embeddings : ndarray of shape (n_cal, dim), optional
        Held-out ID queries for the conformal threshold.
    kb : str
        KB name recorded in the model.
    encoder : Encoder or {"name", "dim"}
        The encoder that produced every embedding above.
    config : FitConfig, optional
        The detector, the PC selection and the calibration (default ``FitConfig()``).
    subspaces : dict, optional
        Fitted subspaces of these same ``kb_embeddings``, keyed by (k, pca_method, seed):
        one found there is reused, a new one is added. The PCA depends on the KB alone,
        so a search that fits many candidates on one KB fits it once. The caller keeps
        one dict per KB.
    deny_topics : DenyTopics, optional
        Topics to refuse: the model's score becomes the larger of the detector's and the
        query's closeness to its nearest topic, each scaled by the ID fit queries, before
        the threshold is calibrated (:class:`~sidecar.scoring.DenyScreen`).

    Returns
    -------
    OODModel
    """
    config = config or FitConfig()
    enc = _encoder_info(encoder)
    KB, ID, OOD = _checked_inputs(enc["dim"], kb_embeddings, id_embeddings, ood_embeddings, config)
    det = _new_detector(config, has_ood=OOD is not None)
    data = _calibration_split(KB, ID, OOD, calibration_embeddings, enc["dim"], config)
    space = _fit_subspace(data, det, config, subspaces)
    selected = _select_pcs(space, data)
    shell = _detector_inputs(kb, enc, config.detector, det, space, selected, data)
    _fit_detector(det, shell, data)
    if deny_topics is not None:
        shell = _with_deny(shell, deny_topics, data)
    threshold, cal_scores = _calibrate(shell, data, config.target_frr)
    return _assemble(shell, space, data, config, threshold, cal_scores)


def _checked_inputs(
    dim: int, kb_embeddings: Any, id_embeddings: Any, ood_embeddings: Any, config: FitConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """KB, ID and OOD embeddings as float32 rows of width ``dim`` (an empty OOD set is
    None); :class:`DataError` or :class:`ConfigError` naming what is wrong."""
    KB = _rows("kb_embeddings", kb_embeddings, dim, minimum=2)
    ID = _rows("id_embeddings", id_embeddings, dim)
    OOD = None if ood_embeddings is None else _rows("ood_embeddings", ood_embeddings, dim)
    if OOD is not None and OOD.shape[0] == 0:
        OOD = None
    if config.criterion not in ("pvalue", "evr"):
        raise ConfigError(f"criterion must be 'pvalue' or 'evr', got {config.criterion!r}")
    return KB, ID, OOD


def _new_detector(config: FitConfig, *, has_ood: bool) -> OODDetector:
    """The unfitted detector, seeded by ``config.seed`` unless its params give a seed."""
    params = dict(config.detector_params)
    det = make_detector(config.detector, **params)
    if "random_state" in det.get_params() and "random_state" not in params:
        det.set_params(random_state=config.seed)
    if det.needs_ood and not has_ood:
        raise ConfigError(needs_ood_error(config.detector))
    return det


def _calibration_split(
    KB: np.ndarray,
    ID: np.ndarray,
    OOD: np.ndarray | None,
    calibration_embeddings: Any,
    dim: int,
    config: FitConfig,
) -> _Data:
    """The ID queries to fit on and those to calibrate on, never the same ones."""
    if calibration_embeddings is not None:
        return _Data(KB, ID, OOD, _rows("calibration_embeddings", calibration_embeddings, dim))
    if ID.shape[0] < 4:
        raise DataError("need at least 4 ID queries to hold some out for calibration")
    perm = np.random.default_rng(config.seed).permutation(ID.shape[0])
    n_cal = max(1, round(config.calibration_fraction * ID.shape[0]))
    return _Data(KB, ID[np.sort(perm[n_cal:])], OOD, ID[np.sort(perm[:n_cal])])


def _fit_subspace(
    data: _Data, det: OODDetector, config: FitConfig, subspaces: Subspaces | None
) -> _Subspace:
    """The KB's top-k PCA (reused from ``subspaces`` when fitted before) and the m, k,
    criterion and residual ks it allows."""
    dim = data.KB.shape[1]
    m, criterion = config.m, config.criterion
    k_eff = min(
        int(config.k) if config.k is not None else max(DEFAULT_K, m), data.KB.shape[0] - 1, dim
    )
    if "pcs" not in det.inputs:
        # The PCs only serve reports here: do not fail on a small KB or a missing OOD set.
        m = min(m, k_eff)
        if data.OOD is None:
            criterion = "evr"
    if m > k_eff:
        raise ConfigError(f"m={m} exceeds the k={k_eff} PCs the KB supports")
    ks = tuple(int(x) for x in (config.residual_ks or (k_eff,)))
    if any(not 1 <= x <= k_eff for x in ks):
        raise ConfigError(f"residual_ks {ks} must lie in 1..{k_eff}")
    key = (k_eff, config.pca_method, config.seed)
    sub = None if subspaces is None else subspaces.get(key)
    if sub is None or sub.mean_.shape != (dim,):
        method: Any = config.pca_method  # checked by KBSubspace.fit
        sub = KBSubspace(k_eff, method=method, random_state=config.seed).fit(data.KB)
        if subspaces is not None:
            subspaces[key] = sub
    return _Subspace(sub, m, sub.n_components_, criterion, ks)


def _select_pcs(space: _Subspace, data: _Data) -> np.ndarray:
    """The m PCs the detector sees, by explained variance or by ID-vs-OOD p-value."""
    if space.criterion == "evr":
        return select_evr(space.sub, space.m)
    if data.OOD is None:
        raise ConfigError("criterion 'pvalue' needs OOD training queries; use 'evr'")
    return select_pvalue(space.sub.project(data.ID_fit), space.sub.project(data.OOD), space.m)


def _detector_inputs(
    kb: str,
    enc: dict[str, Any],
    name: str,
    det: OODDetector,
    space: _Subspace,
    selected: np.ndarray,
    data: _Data,
) -> OODModel:
    """An uncalibrated model around ``det`` that computes its input blocks; the detector's
    labelled-neighbour banks set."""
    uses_maxcos = "max_cosine" in det.inputs or "knn" in det.inputs
    if "neighbours" in det.inputs:
        if data.OOD is None:
            raise ConfigError("the neighbours block needs OOD training queries")
        det.set_banks(data.ID_fit, data.OOD)
    sub = space.sub
    return OODModel(
        kb=kb,
        encoder=enc,
        detector_name=name,
        detector=det,
        mean=sub.mean_.astype(np.float32),
        components=sub.components_.astype(np.float32),
        selected_pcs=selected,
        k=space.k,
        criterion=space.criterion,
        threshold=float("nan"),
        residual_ks=space.residual_ks,
        kb_embeddings=data.KB if uses_maxcos else None,
        explained_variance_ratio=sub.explained_variance_ratio_,
    )


def _fit_detector(det: OODDetector, shell: OODModel, data: _Data) -> None:
    """Fit ``det`` on the KB, the ID queries, or the ID and OOD queries labelled (told
    the width of each input block first, where it asks)."""
    set_blocks = getattr(det, "set_blocks", None)
    if set_blocks is not None:
        set_blocks(shell.block_widths())
    if det.fit_on == "kb":
        det.fit(shell.features(data.KB))
    elif data.OOD is None:
        det.fit(shell.features(data.ID_fit))
    else:
        X = shell.features(np.vstack([data.ID_fit, data.OOD]))
        y = np.r_[np.zeros(data.ID_fit.shape[0], np.int8), np.ones(data.OOD.shape[0], np.int8)]
        det.fit(X, y)


def _with_deny(shell: OODModel, topics: DenyTopics, data: _Data) -> OODModel:
    """``shell`` with the denied-topic screen of ``topics``, scaled by the ID fit rows."""
    if np.shape(topics.embeddings)[1] != shell.encoder["dim"]:
        raise DataError(
            f"denied-topic embeddings have {np.shape(topics.embeddings)[1]} dimensions, "
            f"the encoder {shell.encoder['dim']}"
        )
    scores = shell.score(data.ID_fit)
    return dataclasses.replace(shell, deny=DenyScreen.fit(topics, scores, data.ID_fit))


def _calibrate(shell: OODModel, data: _Data, target_frr: float) -> tuple[float, np.ndarray]:
    """The conformal threshold for ``target_frr`` and the calibration queries' scores."""
    cal_scores = shell.score(data.CAL)
    return conformal_threshold(cal_scores, target_frr), cal_scores


def _assemble(
    shell: OODModel,
    space: _Subspace,
    data: _Data,
    config: FitConfig,
    threshold: float,
    cal_scores: np.ndarray,
) -> OODModel:
    """The calibrated model, with its fit figures (``metrics``) and settings (``params``)."""
    sub, det = space.sub, shell.detector
    metrics = {
        "n_kb": int(data.KB.shape[0]),
        "n_id_fit": int(data.ID_fit.shape[0]),
        "n_ood_fit": 0 if data.OOD is None else int(data.OOD.shape[0]),
        "n_calibration": int(data.CAL.shape[0]),
        "calibration_frr": float(np.mean(cal_scores > threshold)),
        "evr_selected": float(sub.explained_variance_ratio_[shell.selected_pcs].sum()),
    }
    fit_params = {
        "m": int(space.m),
        "k": int(space.k),
        "criterion": space.criterion,
        "seed": int(config.seed),
        "target_frr": float(config.target_frr),
        "detector_params": det.to_state()[0]["hyper"],
        "pca_method": sub.method_,
        "residual_ks": list(space.residual_ks),
    }
    if shell.deny is not None:
        fit_params["deny_topics"] = len(shell.deny.topics)
    log.info(
        "fitted %s for KB %s: m=%s k=%s threshold=%.4g",
        config.detector,
        shell.kb,
        space.m,
        space.k,
        threshold,
    )
    # The shell's arrays and fitted detector, now with the threshold and the records.
    return dataclasses.replace(shell, threshold=threshold, metrics=metrics, params=fit_params)
