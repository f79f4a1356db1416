"""The public surface of ``sidecar.scoring`` is pinned."""

from __future__ import annotations

import sidecar.scoring as scoring


def test_all_is_pinned() -> None:
    assert sorted(scoring.__all__) == sorted(
        [
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
            "conformal_threshold",
            "detector_class",
            "available_cpus",
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
    )
    for name in scoring.__all__:
        assert hasattr(scoring, name), name


def test_every_paper_detector_and_baseline_is_registered() -> None:
    assert set(scoring.detector_kinds()) == {
        "epsilon_ball",
        "epsilon_cube",
        "epsilon_rect",
        "logreg",
        "svm",
        "gmm",
        "residual",
        "combined",
        "max_cosine",
        "mahalanobis",
        "knn",
    }
