"""Pins the public surface of ``sidecar.training``."""

import sidecar.training as training


def test_all_is_pinned() -> None:
    assert sorted(training.__all__) == sorted(
        [
            "Candidate",
            "EmbeddingCache",
            "FitProgress",
            "Gate",
            "InputSources",
            "KBDocument",
            "METRIC_KEYS",
            "NEAR_DUPLICATE_COS",
            "OOD_CAL_FRACTION",
            "QueryEmbeddings",
            "Recalibration",
            "Release",
            "ReleaseConfig",
            "SearchConfig",
            "SearchResult",
            "TrainConfig",
            "TrainInputs",
            "TrainResult",
            "TrainingSplits",
            "auroc",
            "balanced_accuracy",
            "build_report",
            "carve_splits",
            "check_config",
            "check_release",
            "combined_grid",
            "default_grid",
            "expected_frr",
            "fixed_fit",
            "fpr_at_tpr",
            "group_folds",
            "holdout_figures",
            "load_inputs",
            "load_npy",
            "near_duplicate_groups",
            "paper_accuracy",
            "parse_m_range",
            "read_kb",
            "read_queries",
            "recalibrate_release",
            "release_model",
            "resolve_calibration",
            "roc_points",
            "run_search",
            "search",
            "servable_model",
            "train",
            "write_check_report",
        ]
    )
    for name in training.__all__:
        assert hasattr(training, name)
