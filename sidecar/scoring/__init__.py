"""Scoring core: encoder, KB subspace, PC selection, OOD detectors, calibration, model.

No Kafka or Redis here. Score convention everywhere: **higher = more out-of-domain**;
labels are 1 for OOD and 0 for ID.
"""

from sidecar.scoring._base import (
    INPUT_BLOCKS,
    OODDetector,
    detector_class,
    detector_kinds,
    make_detector,
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
    recalibrate,
)
from sidecar.scoring._encoder import (
    DEFAULT_ENCODER,
    Encoder,
    SentenceTransformerEncoder,
    available_cpus,
    encoder_threads,
    load_encoder,
)
from sidecar.scoring._fit import fit_ood_model
from sidecar.scoring._geometric import EpsilonBall, EpsilonCube, EpsilonRect
from sidecar.scoring._gmm import GMMDetector
from sidecar.scoring._linear import CombinedDetector, LogRegDetector
from sidecar.scoring._model import OODModel
from sidecar.scoring._probes import MIN_PROBE_COSINE, PROBE_TEXTS, embed_probes
from sidecar.scoring._subspace import KBSubspace, select_evr, select_pvalue
from sidecar.scoring._svm import SVMDetector

__all__ = [
    "DEFAULT_ENCODER",
    "DEFAULT_TARGET_FRR",
    "INPUT_BLOCKS",
    "MIN_PROBE_COSINE",
    "PROBE_TEXTS",
    "CombinedDetector",
    "Encoder",
    "EpsilonBall",
    "EpsilonCube",
    "EpsilonRect",
    "GMMDetector",
    "KBSubspace",
    "KNNDetector",
    "LogRegDetector",
    "MahalanobisDetector",
    "MaxCosineDetector",
    "OODDetector",
    "OODModel",
    "ResidualDetector",
    "SVMDetector",
    "SentenceTransformerEncoder",
    "available_cpus",
    "conformal_threshold",
    "detector_class",
    "detector_kinds",
    "embed_probes",
    "encoder_threads",
    "fit_ood_model",
    "load_encoder",
    "make_detector",
    "min_calibration_size",
    "recalibrate",
    "select_evr",
    "select_pvalue",
]
