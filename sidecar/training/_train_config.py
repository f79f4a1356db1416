"""What the retraining job (:func:`~._job.train`) takes and gives: the inputs as
embeddings (:class:`TrainInputs`), the settings of a run (:class:`TrainConfig`) and its
outcome (:class:`TrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sidecar.scoring import DEFAULT_TARGET_FRR, OODModel
from sidecar.training._search import SearchResult
from sidecar.training._splits import TrainingSplits


@dataclass
class TrainInputs:
    """What the job trains on: embeddings (n, dim) float32, plus KB ids/texts for the report."""

    kb_name: str
    encoder: dict[str, Any]
    kb: np.ndarray
    id_queries: np.ndarray
    ood_queries: np.ndarray | None
    kb_ids: list[str] = field(default_factory=list)
    kb_texts: list[str] = field(default_factory=list)
    # Group number per query (paraphrases share one), from the JSONL "group" field.
    id_groups: list[int] | None = None
    ood_groups: list[int] | None = None
    # The probe sentences' embeddings by the encoder that embedded the texts (see
    # sidecar.scoring._probes); None when the inputs came as embeddings only.
    encoder_probes: np.ndarray | None = None
    # Topics the model refuses (DenyScreen) and their embeddings by the same encoder;
    # none when deny_embeddings is None.
    deny_topics: tuple[str, ...] = ()
    deny_embeddings: np.ndarray | None = None
    # Where that encoder ran, for the report: {"backend"} and, for an embedding server,
    # its masked "url", the "model" asked for and the "served_model" it named.
    encoder_source: dict[str, Any] | None = None
    # The language told for each ID training query (None or "und": not told), for
    # per-language thresholds (TrainConfig.per_language); None when not told.
    id_languages: list[str | None] | None = None
    # How many of id_languages the queries' rows gave (their "language"); the language
    # detector told the others.
    id_languages_given: int = 0
    # ... and for each KB document and OOD training query, for the centring means
    # (TrainConfig.center_languages); None when not told.
    kb_languages: list[str | None] | None = None
    ood_languages: list[str | None] | None = None


@dataclass
class TrainConfig:
    detector: str = "combined"
    criterion: str = "pvalue"
    m: int | None = None
    m_range: tuple[int, int] | None = None
    features: tuple[str, ...] | None = None
    target_frr: float = DEFAULT_TARGET_FRR
    seed: int = 0
    pca_method: str = "auto"
    threshold_rule: str = "frr"
    calibration: str | None = None  # cross for the frr rule
    # Join near-duplicate training queries (cosine >= NEAR_DUPLICATE_COS) into groups.
    group_near_duplicates: bool = True
    # At most this many rows per labelled-neighbour bank of the combined detector.
    neighbour_bank: int | None = None
    # Floor the combined detector's score with its OOD-free evidence (see COMBINED_FLOOR);
    # None: the detector's default (floored), False: `--no-floor`.
    floor: bool | None = None
    # Also a conformal threshold per language of the ID training queries
    # (TrainInputs.id_languages) with enough of them; see training._languages.
    per_language: bool = False
    # Centre every embedding by its text's language (sidecar.scoring._centering): the
    # means, from the training texts, ship with the model.
    center_languages: bool = False


@dataclass
class TrainResult:
    model: OODModel
    search: SearchResult
    stats: dict[str, Any]
    validation: dict[str, Any]
    # The splits it was trained on (the report reuses them; None: carve them again).
    splits: TrainingSplits | None = None
