"""Pins the public surface of ``sidecar.training``."""

import sidecar.training as training


def test_all_is_pinned() -> None:
    assert sorted(training.__all__) == sorted(
        [
            "BENCHMARKS",
            "DETECTORS",
            "Candidate",
            "EmbeddingCache",
            "FitProgress",
            "KBDocument",
            "KBTask",
            "SearchResult",
            "TrainingSplits",
            "auroc",
            "balanced_accuracy",
            "carve_splits",
            "default_grid",
            "evaluate_benchmark",
            "evaluate_task",
            "fpr_at_tpr",
            "load_benchmark",
            "load_clinc150",
            "load_covid",
            "load_stackexchange",
            "paper_accuracy",
            "read_kb",
            "read_queries",
            "search",
        ]
    )
    for name in training.__all__:
        assert hasattr(training, name)
