"""The retraining job and the evaluation harness: datasets, embedding cache, search,
metrics and the training report."""

from sidecar.training._cache import EmbeddingCache
from sidecar.training._datasets import (
    BENCHMARKS,
    KBTask,
    load_benchmark,
    load_clinc150,
    load_covid,
    load_stackexchange,
)
from sidecar.training._evaluate import DETECTORS, evaluate_benchmark, evaluate_task
from sidecar.training._fitting import FitProgress
from sidecar.training._grid import Candidate, default_grid
from sidecar.training._jsonl import KBDocument, read_kb, read_queries
from sidecar.training._metrics import auroc, balanced_accuracy, fpr_at_tpr, paper_accuracy
from sidecar.training._search import SearchResult, search
from sidecar.training._splits import TrainingSplits, carve_splits

__all__ = [
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
