"""``sidecar bench e2e --with-embeddings``: the text path and the embeddings path (query
records that carry their embedding) timed on the same worker in one run, side by side,
with the speedup, where the CPU went and the embedding decoder's own cost.

The embeddings are computed here, with the encoder the model was trained with, before
any clock starts, and sent as base64 little-endian float32 with the encoder's name: the
figures are of the sidecar and the broker, not of a client embedding its queries.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._e2e import (
    ceiling_report,
    encoder_ceiling,
    path_report,
    placement_report,
)
from sidecar.bench._e2e_config import E2EBenchConfig, bench_texts
from sidecar.bench._e2e_machine import (
    PROCESSES,
    cpu_info,
    cpu_plan,
    limiting_side,
    load_average,
)
from sidecar.bench._e2e_report import median_report, targets
from sidecar.bench._e2e_worker import LoadPath, PathMaker, measure_worker
from sidecar.bench._report_file import write_report
from sidecar.bench._timing import timeit

SPEEDUP_TARGET = 10.0
EMBEDDING_ENCODING = "base64 of little-endian float32"


def embedding_b64(vector: np.ndarray) -> str:
    """One embedding as the record's ``"embedding"``: base64 of little-endian float32."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def both_paths(c: E2EBenchConfig, pool: list[str], facts: dict[str, Any]) -> PathMaker:
    """The text path, then the embeddings path: the same texts, each record of the second
    also carrying the text's embedding by ``encoder`` and the model's encoder name.
    ``facts`` receives the encoder's name and dimension."""

    def make(encoder: Any, model: Any) -> list[LoadPath]:
        name, dim = str(model.encoder["name"]), int(model.encoder["dim"])
        E = np.asarray(encoder.encode(pool), dtype=np.float32)
        if E.shape != (len(pool), dim):
            raise RuntimeError(f"the encoder gave {E.shape}, the model wants {dim} dims")
        facts.update({"encoder": name, "embedding_dim": dim})
        embedded = [
            {"text": t, "embedding": embedding_b64(e), "encoder": name}
            for t, e in zip(pool, E, strict=True)
        ]
        return [
            LoadPath("text", [{"text": t} for t in pool], c.queries),
            LoadPath("embeddings", embedded, c.embedding_queries),
        ]

    return make


def run_e2e_embeddings_bench(
    config: E2EBenchConfig, *, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Both paths on one worker, ``config.repeat`` times; writes the report and returns it.

    The report: ``{"text": {...}, "embeddings": {...}, "speedup": ..., ...}``, each path
    with the fields of :func:`~sidecar.bench.run_e2e_bench`'s report (the text path also
    its encoder-only ceiling), ``speedup`` the embeddings path's saturation throughput
    over the text path's, ``where_the_time_goes`` each process's CPU per query and which
    side of the machine ran out first, ``decode_cost_us`` the decoder alone.
    """
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-emb-"))
    runs = []
    for i in range(config.repeat):
        run_dir = work / f"run-{i}" if config.repeat > 1 else work
        run_dir.mkdir(parents=True, exist_ok=True)
        runs.append(_run_once(config, run_dir, echo))
    report = runs[0] if config.repeat == 1 else fold_runs(runs)
    write_report(config.json_out, report)
    return report


def _run_once(c: E2EBenchConfig, workdir: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    pool = bench_texts(c.source)
    plan = cpu_plan(c.pin)
    load_start = load_average()
    facts: dict[str, Any] = {}
    run = measure_worker(c, workdir, both_paths(c, pool, facts), echo, plan)
    echo("measuring the encoder alone in a fresh process ...")
    texts = [pool[i % len(pool)] for i in range(c.queries)]
    ceiling = encoder_ceiling(c, texts, run.encoder, run.backend, plan)
    common = {
        "source": c.source,
        "batch_max": c.batch_max,
        "batch_timeout_ms": c.batch_timeout_ms,
        "cpu_count": os.cpu_count(),
    }
    text = {**common, **path_report(run.paths["text"]), **ceiling_report(c, run, ceiling)}
    text["targets"] = targets(
        text["ratio_to_encoder"], text["half_rate"]["latency_ms_p99"], text["worker_peak_rss_mb"]
    )
    emb = {**common, "encoder": facts["encoder"], **path_report(run.paths["embeddings"])}
    speedup = _ratio(emb["throughput_qps"], text["throughput_qps"])
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return {
        "bench": "e2e --with-embeddings",
        "encoder": facts["encoder"],
        "embedding_dim": facts["embedding_dim"],
        "embedding_encoding": EMBEDDING_ENCODING,
        "machine": cpu_info(),
        "placement": placement_report(run, plan),
        "load_average_1_5_15_start": load_start,
        "text": text,
        "embeddings": emb,
        "speedup": speedup,
        "speedup_target": {
            "target": f">= {SPEEDUP_TARGET:.0f}",
            "measured": speedup,
            "met": speedup is not None and speedup >= SPEEDUP_TARGET,
        },
        "where_the_time_goes": {
            name: {
                "cpu_ms_per_query": {
                    proc: _per_query(rep["cpu_saturation"], proc) for proc in PROCESSES
                },
                "run_queue_wait_ms_per_query": {
                    proc: _per_query(rep["cpu_saturation"], proc, "run_queue_wait_ms_per_query")
                    for proc in PROCESSES
                },
                "other_processes_cores_busy": _per_query(
                    rep["cpu_saturation"], "other_processes", "cores_busy"
                ),
                "worker_stage_ms_per_query": rep["time_split_ms_per_query"],
                "limit": limiting_side(rep["cpu_saturation"] or {}, plan, ncpu),
            }
            for name, rep in (("text", text), ("embeddings", emb))
        },
        "language_detection_us": language_detection_cost(pool, facts["encoder"]),
        "decode_cost_us": decode_cost(
            pool,
            facts["encoder"],
            facts["embedding_dim"],
            {
                n: r["time_split_ms_per_query"]["decode"]
                for n, r in (("text", text), ("embeddings", emb))
            },
        ),
        "load_average_1_5_15_end": load_average(),
    }


def _per_query(
    usage: dict[str, Any] | None, proc: str, key: str = "cpu_ms_per_query"
) -> float | None:
    u = (usage or {}).get(proc)
    return u.get(key) if u else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def decode_cost(
    pool: list[str], encoder: str, dim: int, worker_decode_ms: dict[str, float], repeats: int = 5
) -> dict[str, Any]:
    """What decoding an embedding costs per query, in microseconds.

    ``worker``: the worker's own decode stage (parsing the record, and for a carried
    embedding decoding and checking it against the model) per query at saturation, from
    ``worker_decode_ms`` (each path's ``time_split_ms_per_query.decode``), and the
    difference the embedding makes. The micro-measures, in this process: the worker's
    record parser (:func:`~sidecar.stream.parse_query`) with and without an embedding,
    and the vector's decode alone done the same way (base64, little-endian float32, the
    finiteness check, the unit-length scaling).
    """
    from sidecar.stream import InputPolicy, Raw, parse_query

    rng = np.random.default_rng(0)
    vec = rng.standard_normal(dim).astype(np.float32)
    vec /= np.linalg.norm(vec)
    b64 = embedding_b64(vec)
    text = pool[0]
    policy = InputPolicy(kbs=("default",), default_kb="default")
    plain = json.dumps({"id": "q-0", "text": text, "ts": 0}).encode()
    carried = json.dumps(
        {"id": "q-0", "text": text, "ts": 0, "embedding": b64, "encoder": encoder}
    ).encode()

    def parse(value: bytes) -> Callable[[], Any]:
        raw = Raw(value=value, topic="queries", partition=0, offset=0)
        return lambda: parse_query(raw, policy)

    def vector_alone() -> Any:
        v = np.frombuffer(base64.b64decode(b64, validate=True), dtype="<f4")
        if not np.isfinite(v).all():
            raise ValueError("not finite")
        return v / np.linalg.norm(v)

    text_ms, emb_ms = worker_decode_ms.get("text"), worker_decode_ms.get("embeddings")
    worker = {
        "text": _us(text_ms),
        "embeddings": _us(emb_ms),
        "difference": _us(emb_ms - text_ms) if emb_ms is not None and text_ms is not None else None,
    }
    micro = {
        "parse_text_record": 1e6 * timeit(parse(plain), repeats=repeats),
        "parse_embedding_record": 1e6 * timeit(parse(carried), repeats=repeats),
        "vector_decode": 1e6 * timeit(vector_alone, repeats=repeats),
    }
    return {
        "worker_decode_stage_per_query": worker,
        **{k: round(v, 2) for k, v in micro.items()},
        "record_bytes": {"text": len(plain), "embedding": len(carried)},
    }


def language_detection_cost(pool: list[str], encoder: str, repeats: int = 5) -> dict[str, Any]:
    """Microseconds per query of the worker's language detector on the benchmark's texts,
    in batches of 64: with ``scoring.detect_language`` on (the default) the worker tells
    every query's language from its text, embedding or not (the ``encode`` stage of the
    embeddings path is this, on the encoder thread)."""
    from sidecar.encoders import LanguageDetector, detector_languages
    from sidecar.settings import ScoringSettings

    detector = LanguageDetector(detector_languages(encoder, ()))
    texts = [pool[i % len(pool)] for i in range(64)]
    per_batch = timeit(lambda: detector.detect(texts), repeats=repeats)
    return {
        "per_query": round(1e6 * per_batch / len(texts), 2),
        "worker_default_detect_language": ScoringSettings().detect_language,
    }


def _us(ms: float | None) -> float | None:
    return round(1000.0 * ms, 2) if ms is not None else None


def fold_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs as one: the text path folded by :func:`median_report`, the embeddings
    path's headline figures and the speedup as medians of the runs', every run kept."""

    def med(values: list[Any]) -> float | None:
        xs = [float(v) for v in values if v is not None]
        return round(statistics.median(xs), 3) if xs else None

    embs = [r["embeddings"] for r in runs]
    text = median_report([r["text"] for r in runs])
    text.pop("runs")
    emb = {
        "queries": embs[0]["queries"],
        "throughput_qps": med([e["throughput_qps"] for e in embs]),
        "latency_ms_p50": med([e["latency_ms_p50"] for e in embs]),
        "latency_ms_p99": med([e["latency_ms_p99"] for e in embs]),
        "worker_peak_rss_mb": max((e["worker_peak_rss_mb"] or 0.0) for e in embs) or None,
        "half_rate": {
            k: med([e["half_rate"][k] for e in embs])
            for k in ("rate_qps", "latency_ms_p50", "latency_ms_p99", "mean_batch_size")
        },
        "dead_lettered": sum(e["dead_lettered"] for e in embs),
    }
    return {
        **{k: runs[0][k] for k in ("bench", "encoder", "embedding_dim", "embedding_encoding")},
        **{k: runs[0][k] for k in ("machine", "placement", "load_average_1_5_15_start")},
        "load_average_1_5_15_end": runs[-1]["load_average_1_5_15_end"],
        "repeats": len(runs),
        "aggregate": "median over runs (worker_peak_rss_mb: the largest)",
        "text": text,
        "embeddings": emb,
        "speedup": med([r["speedup"] for r in runs]),
        "speedup_note": "the median of each run's own speedup",
        "runs": runs,
    }
