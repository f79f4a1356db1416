"""The retraining job: from KB documents and labelled queries to a calibrated, reported model.

:func:`train` runs the job a :class:`TrainConfig` describes on :class:`TrainInputs` (read by
:func:`load_inputs`): carve splits, search the detector grid, calibrate, and describe the
winner; :func:`build_report` writes its report, and :func:`release_model` does all of it
and writes the artifact. Around it: the embedding cache, the search and its grid, the
splits, the metrics, the release check (:func:`holdout_figures`, :func:`check_release`)
and the recalibration of a trained model on new ID queries (:func:`recalibrate_release`).
Inputs come from JSONL (:func:`read_query_rows`), ``.npy``, Parquet (:func:`read_parquet`,
:func:`parquet_batches`) or PostgreSQL (:class:`PostgresSource`), the last two as
:class:`RowBatch` batches gathered into :class:`SourceRows`. For per-language thresholds a
query's language is the one its JSONL row gives, else the language detector's
(:func:`query_languages`).
"""

from sidecar.training._cache import EmbeddingCache
from sidecar.training._deny_topics import BUILTIN_DENY_TOPICS, read_deny_topics
from sidecar.training._drift import expected_frr
from sidecar.training._fitting import FitProgress, fixed_fit
from sidecar.training._grid import Candidate, combined_grid, default_grid
from sidecar.training._holdout import Gate, holdout_figures, write_check_report
from sidecar.training._job import (
    check_config,
    deny_topics_of,
    parse_m_range,
    train,
)
from sidecar.training._jsonl import KBDocument, QueryRows, read_kb, read_queries, read_query_rows
from sidecar.training._languages import query_languages
from sidecar.training._metrics import (
    METRIC_KEYS,
    auroc,
    balanced_accuracy,
    fpr_at_tpr,
    paper_accuracy,
    roc_points,
)
from sidecar.training._query_embeddings import QueryEmbeddings
from sidecar.training._recalibrate import Recalibration, recalibrate_release
from sidecar.training._release import Release, ReleaseConfig, release_model
from sidecar.training._release_check import check_release
from sidecar.training._search import (
    SearchConfig,
    SearchResult,
    resolve_calibration,
    run_search,
    search,
)
from sidecar.training._servable import servable_model
from sidecar.training._source_rows import RowBatch, SourceRows
from sidecar.training._sources_parquet import parquet_batches, read_parquet
from sidecar.training._sources_sql import PostgresSource
from sidecar.training._splits import (
    NEAR_DUPLICATE_COS,
    OOD_CAL_FRACTION,
    TrainingSplits,
    carve_splits,
    group_folds,
    near_duplicate_groups,
)
from sidecar.training._train_config import TrainConfig, TrainInputs, TrainResult
from sidecar.training._train_inputs import InputSources, load_inputs, load_npy
from sidecar.training._train_report import build_report

__all__ = [
    "BUILTIN_DENY_TOPICS",
    "METRIC_KEYS",
    "NEAR_DUPLICATE_COS",
    "OOD_CAL_FRACTION",
    "Candidate",
    "EmbeddingCache",
    "FitProgress",
    "Gate",
    "InputSources",
    "KBDocument",
    "PostgresSource",
    "QueryEmbeddings",
    "QueryRows",
    "Recalibration",
    "Release",
    "ReleaseConfig",
    "RowBatch",
    "SearchConfig",
    "SearchResult",
    "SourceRows",
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
    "deny_topics_of",
    "expected_frr",
    "fixed_fit",
    "fpr_at_tpr",
    "group_folds",
    "holdout_figures",
    "load_inputs",
    "load_npy",
    "near_duplicate_groups",
    "paper_accuracy",
    "parquet_batches",
    "parse_m_range",
    "query_languages",
    "read_deny_topics",
    "read_kb",
    "read_parquet",
    "read_queries",
    "read_query_rows",
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
