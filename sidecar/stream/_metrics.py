"""Prometheus metrics of one worker, in a registry of its own (no process-global state).

Counters and histograms are updated per batch; the gauges that mirror other state (model
versions, load failures, consumer lag) are refreshed when ``/metrics`` is scraped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sidecar.stream._batch import (
    EMBEDDING_FALLBACK,
    EMBEDDING_SOURCE,
    EMBEDDING_SOURCES,
    STAGES,
    BatchOutcome,
)
from sidecar.stream._query_language import LANGUAGE_SOURCE, LANGUAGE_SOURCES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StreamMetrics:
    """The worker's metrics; :meth:`render` gives the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.records = Counter(
            "sidecar_records",
            "Query records answered (a verdict or a dead letter delivered)",
            registry=r,
        )
        self.verdicts = Counter(
            "sidecar_verdicts", "Verdicts produced", ["kb", "verdict"], registry=r
        )
        self.fail_mode = Counter(
            "sidecar_fail_mode_verdicts",
            "Verdicts decided by fail_mode because no model was loaded",
            ["kb"],
            registry=r,
        )
        self.dlq = Counter("sidecar_dlq", "Dead-lettered records", ["reason"], registry=r)
        self.embedding_source = Counter(
            "sidecar_scored_queries",
            "Queries scored by a model, by whose embedding was scored: client (the query "
            "record's own) or sidecar (its text embedded by the worker's encoder)",
            ["source"],
            registry=r,
        )
        for source in EMBEDDING_SOURCES:  # both series exist from the start, at 0
            self.embedding_source.labels(source)
        self.language_source = Counter(
            "sidecar_query_languages",
            "Queries scored with a language, by who told it: client (the record's language "
            "field or sidecar-language header) or detected (the worker's language detector)",
            ["source"],
            registry=r,
        )
        for source in LANGUAGE_SOURCES:
            self.language_source.labels(source)
        self.embedding_fallbacks = Counter(
            "sidecar_embedding_fallbacks",
            "Client embeddings refused and replaced by the worker's encoder "
            "(scoring.embedding_fallback=encode), by the reason code of the refusal",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "sidecar_latency_seconds",
            "Query record timestamp to verdict handed to the producer",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "sidecar_batch_size", "Records per micro-batch", buckets=_BATCH_BUCKETS, registry=r
        )
        self.stage = Histogram(
            "sidecar_stage_seconds",
            "Time per batch in each stage (decode, encode, detect, produce)",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.model_info = Gauge(
            "sidecar_model_info",
            "Active model per KB (value 1; version and detector as labels)",
            ["kb", "version", "detector"],
            registry=r,
        )
        self.store_active = Gauge(
            "sidecar_store_active_info",
            "Version the store's active pointer names per KB, as this replica last read it "
            "(value 1); a replica whose sidecar_model_info differs has not swapped to it",
            ["kb", "version"],
            registry=r,
        )
        self.load_failures = Gauge(
            "sidecar_model_load_failures",
            "Failed model loads per KB since start (from the model holder)",
            ["kb"],
            registry=r,
        )
        self.lag = Gauge(
            "sidecar_consumer_lag",
            "High-water mark minus next offset to process, per assigned partition",
            ["topic", "partition"],
            registry=r,
        )
        self.ready = Gauge(
            "sidecar_ready",
            "1 when every /readyz check passes, else 0 (refreshed when /metrics is scraped)",
            registry=r,
        )
        self.ready_check = Gauge(
            "sidecar_ready_check",
            "Each /readyz check: 1 passing, 0 failing (broker, partitions, rebalancing, models, "
            "store, stream, encoder)",
            ["check"],
            registry=r,
        )
        self.calibration_ood_share = Gauge(
            "sidecar_model_calibration_ood_share",
            "Share of a live traffic sample the active model's threshold refused when it was "
            "calibrated (sidecar calibrate --live-queries), per KB; absent when not recorded",
            ["kb", "version"],
            registry=r,
        )
        self.produce_errors = Counter(
            "sidecar_produce_errors", "Batches whose records were not all delivered", registry=r
        )

    def observe_batch(self, outcome: BatchOutcome, now_ms: float) -> None:
        """Count one published batch."""
        self.records.inc(outcome.size)
        self.batch_size.observe(outcome.size)
        for stage in STAGES:
            self.stage.labels(stage).observe(outcome.timings.get(stage, 0.0))
        for v in outcome.verdicts:
            self.verdicts.labels(v.query.kb, v.verdict).inc()
            if v.reason is not None:
                self.fail_mode.labels(v.query.kb).inc()
            source = v.extra.get(EMBEDDING_SOURCE)
            if source is not None:
                self.embedding_source.labels(source).inc()
                fallback = v.extra.get(EMBEDDING_FALLBACK)
                if fallback is not None:
                    self.embedding_fallbacks.labels(fallback).inc()
            told = v.extra.get(LANGUAGE_SOURCE)
            if told is not None:
                self.language_source.labels(told).inc()
            start = v.query.raw.timestamp_ms
            if start is not None:
                self.latency.observe(max(now_ms - start, 0.0) / 1000.0)
        for d in outcome.dead:
            self.dlq.labels(d.reason).inc()

    def refresh(
        self,
        models: Mapping[str, tuple[str, str]],
        holder_status: Mapping[str, Any],
        lag: Mapping[tuple[str, int], int],
        calibration_shares: Mapping[str, float | None] | None = None,
    ) -> None:
        """Mirror state: ``models`` kb -> (version, detector); ``lag`` (topic, partition) -> n;
        ``calibration_shares`` kb -> the active model's calibration OOD share (or None)."""
        self.model_info.clear()
        self.calibration_ood_share.clear()
        for kb, (version, detector) in models.items():
            self.model_info.labels(kb, version, detector).set(1)
            share = (calibration_shares or {}).get(kb)
            if isinstance(share, int | float):
                self.calibration_ood_share.labels(kb, version).set(share)
        self.load_failures.clear()
        self.store_active.clear()
        for kb, st in holder_status.items():
            if not isinstance(st, Mapping):
                continue
            failures = st.get("load_failures")
            if isinstance(failures, int | float):
                self.load_failures.labels(kb).set(failures)
            active = st.get("store_active")
            if isinstance(active, str):
                self.store_active.labels(kb, active).set(1)
        self.lag.clear()
        for (topic, partition), value in lag.items():
            self.lag.labels(topic, str(partition)).set(value)

    def refresh_readiness(self, readiness: Mapping[str, Any]) -> None:
        """Mirror a ``/readyz`` document: ``{"ready": bool, "checks": {name: {"ok": bool}}}``."""
        self.ready.set(1 if readiness.get("ready") else 0)
        self.ready_check.clear()
        for name, check in readiness.get("checks", {}).items():
            self.ready_check.labels(name).set(1 if check.get("ok") else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
