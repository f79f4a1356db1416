"""The public surface of ``sidecar.scoring`` is pinned."""

from __future__ import annotations

import sidecar.scoring as scoring


def test_all_is_pinned() -> None:
    assert sorted(scoring.__all__) == sorted(
        [
            "CombinedDetector",
            "DEFAULT_TARGET_FRR",
            "EpsilonBall",
            "EpsilonCube",
            "EpsilonRect",
            "FitConfig",
            "GMMDetector",
            "INPUT_BLOCKS",
            "KBSubspace",
            "KNNDetector",
            "LogRegDetector",
            "MIN_PROBE_COSINE",
            "MahalanobisDetector",
            "MaxCosineDetector",
            "OODDetector",
            "OODModel",
            "PROBE_TEXTS",
            "ResidualDetector",
            "SCANS",
            "SVMDetector",
            "choose_scan",
            "conformal_threshold",
            "detector_class",
            "detector_kinds",
            "fit_model",
            "fit_ood_model",
            "make_detector",
            "min_calibration_size",
            "model_from_state",
            "model_state",
            "needs_ood_error",
            "probe_cosines",
            "probe_mismatch",
            "quiet_calibration",
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
