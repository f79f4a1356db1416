"""Scoring core, pure numerics: KB subspace, PC selection, OOD detectors, calibration, model.

No encoder, store, Kafka or Redis here: it imports numpy, scipy, scikit-learn, numba and
:mod:`sidecar.errors` only. Score convention everywhere: **higher = more out-of-domain**;
labels are 1 for OOD and 0 for ID.
"""

from sidecar.scoring._base import (
    FAMILIES,
    INPUT_BLOCKS,
    OODDetector,
    detector_class,
    detector_kinds,
    detector_table,
    make_detector,
    needs_ood_error,
)
from sidecar.scoring._baselines import (
    KNNDetector,
    MahalanobisDetector,
    MaxCosineDetector,
    ResidualDetector,
)
from sidecar.scoring._calibration import (
    DEFAULT_TARGET_FRR,
    conformal_threshold,
    min_calibration_size,
    quiet_calibration,
    recalibrate,
)
from sidecar.scoring._centering import MIN_LANGUAGE_TEXTS, LanguageCentering
from sidecar.scoring._deny import DenyScreen, DenyTopics, read_topic_lines
from sidecar.scoring._fit import FitConfig, fit_model, fit_ood_model
from sidecar.scoring._geometric import EpsilonBall, EpsilonCube, EpsilonRect
from sidecar.scoring._gmm import GMMDetector
from sidecar.scoring._languages import (
    UNDETERMINED_LANGUAGE,
    language_thresholds,
    recalibrate_by_language,
    with_language_thresholds,
)
from sidecar.scoring._linear import CombinedDetector, LogRegDetector
from sidecar.scoring._linf import SCANS, choose_scan
from sidecar.scoring._model import OODModel
from sidecar.scoring._probes import MIN_PROBE_COSINE, PROBE_TEXTS, probe_cosines, probe_mismatch
from sidecar.scoring._state import model_from_state, model_state
from sidecar.scoring._subspace import KBSubspace, select_evr, select_pvalue
from sidecar.scoring._svm import SVMDetector

__all__ = [
    "DEFAULT_TARGET_FRR",
    "FAMILIES",
    "INPUT_BLOCKS",
    "MIN_LANGUAGE_TEXTS",
    "MIN_PROBE_COSINE",
    "PROBE_TEXTS",
    "SCANS",
    "UNDETERMINED_LANGUAGE",
    "CombinedDetector",
    "DenyScreen",
    "DenyTopics",
    "EpsilonBall",
    "EpsilonCube",
    "EpsilonRect",
    "FitConfig",
    "GMMDetector",
    "KBSubspace",
    "KNNDetector",
    "LanguageCentering",
    "LogRegDetector",
    "MahalanobisDetector",
    "MaxCosineDetector",
    "OODDetector",
    "OODModel",
    "ResidualDetector",
    "SVMDetector",
    "choose_scan",
    "conformal_threshold",
    "detector_class",
    "detector_kinds",
    "detector_table",
    "fit_model",
    "fit_ood_model",
    "language_thresholds",
    "make_detector",
    "min_calibration_size",
    "model_from_state",
    "model_state",
    "needs_ood_error",
    "probe_cosines",
    "probe_mismatch",
    "quiet_calibration",
    "read_topic_lines",
    "recalibrate",
    "recalibrate_by_language",
    "select_evr",
    "select_pvalue",
    "with_language_thresholds",
]
