"""An :class:`OODModel` as plain state (a JSON-able section and named arrays) and back.

This is the whole of what a stored model is; :mod:`sidecar.persistence` wraps it in the
store's artifact format. Nothing here is pickled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sidecar.errors import DataError, InvalidModelState
from sidecar.scoring._base import OODDetector, detector_class
from sidecar.scoring._centering import LanguageCentering
from sidecar.scoring._deny import DenyScreen
from sidecar.scoring._model import (
    _DET_PREFIX,
    MODEL_FORMAT,
    MODEL_FORMAT_CENTERED,
    MODEL_FORMAT_DENY,
    SCORE_CONVENTION,
    OODModel,
)

_CENTER_PREFIX = "centering."


def model_state(model: OODModel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``model`` as plain state: a JSON-able model section and named arrays.

    Returns
    -------
    section : dict
        Format, detector kind and parameters, selected PCs, k, threshold, how the
        model was fitted, and the probe sentences its encoder fingerprint covers.
    arrays : dict of str to ndarray
        Subspace mean and components, selected PCs, explained variance, KB
        embeddings, encoder probes, the detector's arrays (prefixed ``detector.``) and,
        for a centred model, its language means (``centering.``).

    Raises
    ------
    DataError
        The threshold is not finite (calibrate the model before saving it).
    """
    if not math.isfinite(model.threshold):
        raise DataError("the model has no finite threshold; calibrate it before saving")
    det_params, det_arrays = model.detector.to_state()
    arrays: dict[str, np.ndarray] = {
        "subspace.mean": np.asarray(model.mean),
        "subspace.components": np.asarray(model.components),
        "subspace.selected_pcs": model.selected_pcs,
    }
    if model.explained_variance_ratio is not None:
        arrays["subspace.explained_variance_ratio"] = np.asarray(model.explained_variance_ratio)
    if model.kb_embeddings is not None:
        arrays["kb_embeddings"] = np.asarray(model.kb_embeddings)
    if model.encoder_probes is not None:
        arrays["encoder.probes"] = np.asarray(model.encoder_probes, dtype=np.float32)
    arrays.update({_DET_PREFIX + k: v for k, v in det_arrays.items()})
    section: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "kind": model.detector_name,
        "params": det_params,
        "inputs": list(model.detector.inputs),
        "criterion": model.criterion,
        "selected_pcs": [int(i) for i in model.selected_pcs],
        "m": model.m,
        "k": int(model.k),
        "residual_ks": list(model.residual_ks),
        "dims": model.dims,
        "threshold": model.threshold,
        "score": SCORE_CONVENTION,
        "fit": model.params,
    }
    if model.encoder_probe_texts:
        section["encoder_probe_texts"] = list(model.encoder_probe_texts)
    if model.language_thresholds:
        section["language_thresholds"] = dict(sorted(model.language_thresholds.items()))
    if model.deny is not None:
        section["format"] = MODEL_FORMAT_DENY
        section["deny"], arrays["deny.anchors"] = model.deny.state()
    if model.centering is not None:
        # format 3 whatever else the model has: a reader of 1 or 2 must refuse it
        section["format"] = MODEL_FORMAT_CENTERED
        section["centering"], means = model.centering.state()
        arrays.update({_CENTER_PREFIX + k: v for k, v in means.items()})
    return section, arrays


def model_from_state(
    section: Any,
    arrays: Mapping[str, np.ndarray],
    *,
    kb: Any,
    encoder: Any,
    metrics: Any = None,
    version: str | None = None,
) -> OODModel:
    """Rebuild a model from the state :func:`model_state` gave.

    Parameters
    ----------
    section : mapping
        The model section (format, kind, parameters, ...).
    arrays : mapping of str to ndarray
    kb, encoder, metrics :
        The KB name, ``{"name", "dim"}`` of the encoder, and the recorded metrics.
    version : str or None
        The stored version the state was read from.

    Raises
    ------
    InvalidModelState
        Unknown detector kind, or a malformed section or arrays.
    """
    formats = (MODEL_FORMAT, MODEL_FORMAT_DENY, MODEL_FORMAT_CENTERED)
    if not isinstance(section, Mapping) or section.get("format") not in formats:
        raise InvalidModelState(f"artifact has no {' or '.join(formats)} model section")
    centered = section.get("format") == MODEL_FORMAT_CENTERED
    has_deny = section.get("format") == MODEL_FORMAT_DENY or (centered and "deny" in section)
    kind = section.get("kind")
    try:
        det_cls = detector_class(str(kind))
    except KeyError:
        raise InvalidModelState(f"unknown detector kind {kind!r}") from None
    try:
        det = _detector(det_cls, section, arrays)
        selected = np.asarray(arrays["subspace.selected_pcs"], dtype=np.int64)
        if [int(i) for i in selected] != [int(i) for i in section["selected_pcs"]]:
            raise ValueError("selected PCs differ between manifest and arrays")
        evr = arrays.get("subspace.explained_variance_ratio")
        probe_texts = section.get("encoder_probe_texts", [])
        if not (isinstance(probe_texts, list) and all(isinstance(t, str) for t in probe_texts)):
            raise ValueError("encoder_probe_texts is not a list of strings")
        # absent from models saved before per-language thresholds: none then
        langs = section.get("language_thresholds", {})
        if not isinstance(langs, Mapping) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in langs.values()
        ):
            raise ValueError("language_thresholds is not an object of language -> number")
        out = OODModel(
            kb=str(kb),
            encoder={"name": str(encoder["name"]), "dim": int(encoder["dim"])},
            detector_name=str(kind),
            detector=det,
            mean=np.asarray(arrays["subspace.mean"]),
            components=np.asarray(arrays["subspace.components"]),
            selected_pcs=selected,
            k=int(section["k"]),
            criterion=str(section["criterion"]),
            threshold=float(section["threshold"]),
            metrics=dict(metrics or {}),
            params=dict(section.get("fit") or {}),
            residual_ks=tuple(int(k) for k in section["residual_ks"]),
            kb_embeddings=arrays.get("kb_embeddings"),
            explained_variance_ratio=evr,
            encoder_probes=arrays.get("encoder.probes"),
            encoder_probe_texts=tuple(probe_texts),
            language_thresholds=dict(langs),
            deny=DenyScreen.from_state(section["deny"], arrays["deny.anchors"])
            if has_deny
            else None,
            centering=_centering(section, arrays) if centered else None,
            version=version,
        )
        _check_built(out, section)
    except InvalidModelState:
        raise
    except (KeyError, TypeError, ValueError, IndexError, ArithmeticError, DataError) as exc:
        raise InvalidModelState(
            f"model section or arrays are malformed ({type(exc).__name__}: {exc})"
        ) from exc
    return out


def _centering(section: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> LanguageCentering:
    """The language means of a format-3 model (KeyError / ValueError when missing)."""
    means = {k[len(_CENTER_PREFIX) :]: v for k, v in arrays.items() if k.startswith(_CENTER_PREFIX)}
    return LanguageCentering.from_state(section["centering"], means)


def _detector(
    det_cls: type[OODDetector], section: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> OODDetector:
    """The fitted detector of a model section, from its ``detector.``-prefixed arrays."""
    kind = section.get("kind")
    det_arrays = {k[len(_DET_PREFIX) :]: v for k, v in arrays.items() if k.startswith(_DET_PREFIX)}
    det = det_cls.from_state(dict(section["params"]), det_arrays)
    if det.kind != kind:
        raise ValueError(f"detector state is of kind {det.kind!r}, not {kind!r}")
    return det


def _check_built(model: OODModel, section: Mapping[str, Any]) -> None:
    """ValueError unless the rebuilt model is what its section says and can decide."""
    det = model.detector
    if model.dims != det.n_features_in_:
        raise ValueError(
            f"detector expects {det.n_features_in_} features, the model builds {model.dims}"
        )
    if not math.isfinite(model.threshold):  # NaN would pass every query as in-domain
        raise ValueError(f"decision threshold must be finite, got {model.threshold}")
    for key in ("m", "dims"):  # what `models show` reports must be what runs
        if key in section and int(section[key]) != getattr(model, key):
            raise ValueError(
                f"manifest says {key}={section[key]}, the arrays give {getattr(model, key)}"
            )
