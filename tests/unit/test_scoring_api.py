"""The public surface of ``sidecar.scoring`` is pinned."""

from __future__ import annotations

import sidecar.scoring as scoring


def test_all_is_pinned() -> None:
    assert sorted(scoring.__all__) == sorted(
        [
            "CombinedDetector",
            "DEFAULT_TARGET_FRR",
            "DenyScreen",
            "DenyTopics",
            "EpsilonBall",
            "EpsilonCube",
            "EpsilonRect",
            "FAMILIES",
            "FitConfig",
            "GMMDetector",
            "INPUT_BLOCKS",
            "KBSubspace",
            "KNNDetector",
            "LanguageCentering",
            "LogRegDetector",
            "MIN_LANGUAGE_TEXTS",
            "MIN_PROBE_COSINE",
            "MahalanobisDetector",
            "MaxCosineDetector",
            "OODDetector",
            "OODModel",
            "PROBE_TEXTS",
            "ResidualDetector",
            "SCANS",
            "SVMDetector",
            "UNDETERMINED_LANGUAGE",
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


def test_the_registry_lists_the_kinds_in_table_order_by_family() -> None:
    paper = ("epsilon_ball", "epsilon_cube", "epsilon_rect", "logreg", "svm", "gmm")
    product = ("residual", "combined")
    baselines = ("max_cosine", "mahalanobis", "knn")
    assert scoring.detector_table() == (*paper, *product, *baselines)
    assert scoring.detector_table("paper") == paper
    assert scoring.detector_table("product") == product
    assert scoring.detector_table("baseline") == baselines
    assert scoring.detector_table("paper", "baseline") == (*paper, *baselines)
    full = {k for k in scoring.detector_kinds() if scoring.detector_class(k).full_space}
    assert full == {"max_cosine", "knn", "mahalanobis"}
    geometric = {k for k in scoring.detector_kinds() if scoring.detector_class(k).geometric}
    assert geometric == {"epsilon_ball", "epsilon_cube", "epsilon_rect"}
