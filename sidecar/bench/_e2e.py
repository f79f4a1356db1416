"""End-to-end benchmark of the worker: the embedded broker, the real worker, real queries.

Phases (each measured from this process, which produces and consumes):

1. saturation: ``queries`` records produced as fast as possible; throughput is
   ``queries / (last verdict received - first record sent)``;
2. half rate: records paced at half the measured throughput; latency p50/p99 there;
3. encoder only: a fresh ``python -m sidecar bench e2e-encoder`` child process embeds the
   same texts in batches of ``batch_max`` (no Kafka, no Redis): the ceiling.

Latency is the query's ``ts`` (set when it is produced) to the moment its verdict is
read back here, so it includes both broker hops; ``worker_latency_ms_*`` is the verdicts'
own ``latency_ms`` (the query record's timestamp to the verdict handed to the producer).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sidecar.bench._e2e_config import E2EBenchConfig, bench_texts
from sidecar.bench._e2e_encoder import encoder_only_qps
from sidecar.bench._e2e_machine import (
    CpuPlan,
    allowed_cpus,
    cpu_info,
    cpu_plan,
    load_average,
    spawning_on,
)
from sidecar.bench._e2e_report import median_report, targets
from sidecar.bench._e2e_worker import LoadPath, PathRun, WorkerRun, measure_worker
from sidecar.bench._report_file import write_report
from sidecar.errors import DataError

__all__ = [
    "E2EBenchConfig",
    "bench_texts",
    "run_e2e_batch_sweep",
    "run_e2e_bench",
    "run_e2e_encoder_comparison",
]

log = logging.getLogger(__name__)


def run_e2e_bench(config: E2EBenchConfig, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark, ``config.repeat`` times; writes the report and returns it."""
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-"))
    runs = []
    for i in range(config.repeat):
        run_dir = work / f"run-{i}" if config.repeat > 1 else work
        run_dir.mkdir(parents=True, exist_ok=True)
        runs.append(_run_once(config, run_dir, echo))
    report = runs[0] if config.repeat == 1 else median_report(runs)
    write_report(config.json_out, report)
    return report


# What each point of a batch-size sweep keeps of its run's report.
SWEEP_FIELDS = (
    "throughput_qps",
    "encoder_only_qps",
    "ratio_to_encoder",
    "mean_batch_size_saturation",
    "time_split_ms_per_query",
    "half_rate",
    "worker_peak_rss_mb",
    "encoder_backend",
    "encoder_threads",
    "load_average_1_5_15_start",
    "load_average_1_5_15_end",
    "placement",
    "cpu_saturation",
)


def run_e2e_batch_sweep(
    config: E2EBenchConfig,
    batch_sizes: Sequence[int],
    *,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The benchmark once per ``scoring.batch_max`` in ``batch_sizes``, one worker each.

    Every point is a whole run (saturation, half of that run's own throughput, the encoder
    alone at that batch size), so throughput and half-load latency can be drawn against
    the batch size. Writes ``{"batch_sizes", "points": [{"batch_max", ...}], ...}`` to
    ``config.json_out`` and returns it.
    """
    if not batch_sizes or any(n < 1 for n in batch_sizes):
        raise DataError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-sweep-"))
    points = []
    for i, n in enumerate(batch_sizes):
        echo(f"batch_max {n} ({i + 1} of {len(batch_sizes)}) ...")
        run_dir = work / f"batch-{n}"
        run_dir.mkdir(parents=True, exist_ok=True)
        run = _run_once(replace(config, batch_max=n), run_dir, echo)
        points.append({"batch_max": n, **{k: run[k] for k in SWEEP_FIELDS}})
    report = {
        "source": config.source,
        "queries": config.queries,
        "batch_timeout_ms": config.batch_timeout_ms,
        "encoder_dtype": config.encoder_dtype,
        "cpu_count": os.cpu_count(),
        "machine": cpu_info(),
        "pinned": config.pin,
        "batch_sizes": list(batch_sizes),
        "points": points,
    }
    write_report(config.json_out, report)
    return report


def run_e2e_encoder_comparison(
    config: E2EBenchConfig,
    encoders: Sequence[str],
    *,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The benchmark once per encoder in ``encoders``, one worker each, on the same texts
    and settings: throughput, half-load latency and the encoder's own ceiling side by side.
    Writes ``{"encoders", "points": [{"encoder", ...}], ...}`` to ``config.json_out``."""
    if not encoders:
        raise DataError("name at least one encoder to compare")
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-encoders-"))
    points = []
    for i, name in enumerate(encoders):
        echo(f"encoder {name} ({i + 1} of {len(encoders)}) ...")
        run_dir = work / f"encoder-{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        run = _run_once(replace(config, encoder=name), run_dir, echo)
        points.append({"encoder": run["encoder"], **{k: run[k] for k in SWEEP_FIELDS}})
    report = {
        "source": config.source,
        "queries": config.queries,
        "batch_max": config.batch_max,
        "batch_timeout_ms": config.batch_timeout_ms,
        "cpu_count": os.cpu_count(),
        "machine": cpu_info(),
        "pinned": config.pin,
        "encoders": list(encoders),
        "points": points,
    }
    write_report(config.json_out, report)
    return report


def _run_once(c: E2EBenchConfig, workdir: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """One run: the worker's phases, then the encoder alone; the run's report."""
    pool = bench_texts(c.source)
    texts = [pool[i % len(pool)] for i in range(c.queries)]
    plan = cpu_plan(c.pin)
    report: dict[str, Any] = {
        "source": c.source,
        "batch_max": c.batch_max,
        "batch_timeout_ms": c.batch_timeout_ms,
        "cpu_count": os.cpu_count(),
        "machine": cpu_info(),
        "load_average_1_5_15_start": load_average(),
    }
    run = measure_worker(c, workdir, text_path(c, pool), echo, plan)
    echo("measuring the encoder alone in a fresh process ...")
    ceiling = encoder_ceiling(c, texts, run.encoder, run.backend, plan)
    report.update(path_report(run.paths["text"]))
    report.update(ceiling_report(c, run, ceiling))
    report["placement"] = placement_report(run, plan)
    report["load_average_1_5_15_end"] = load_average()
    report["targets"] = targets(
        report["ratio_to_encoder"],
        report["half_rate"]["latency_ms_p99"],
        report["worker_peak_rss_mb"],
    )
    return report


def text_path(c: E2EBenchConfig, pool: list[str]) -> Callable[[Any, Any], list[LoadPath]]:
    """The text path: records holding the query text alone, as today's clients send."""
    records = [{"text": t} for t in pool]
    return lambda _encoder, _model: [LoadPath("text", records, c.queries)]


def path_report(pr: PathRun) -> dict[str, Any]:
    """One path's figures: saturation throughput and latency, the half-rate run, the time
    split and CPU time per query of each process, the worker's peak RSS so far."""
    split, n, batches = pr.split
    half_split, n_half_seen, half_batches = pr.half_split
    sat, half = pr.sat, pr.half
    return {
        "queries": sat["queries"],
        "throughput_qps": sat["throughput_qps"],
        "latency_ms_p50": sat["latency_ms_p50"],
        "latency_ms_p99": sat["latency_ms_p99"],
        "worker_peak_rss_mb": round(pr.rss, 1) if pr.rss is not None else None,
        "time_split_ms_per_query": split,
        "mean_batch_size_saturation": round(n / batches, 2) if batches else None,
        "verdict_paths": sat.get("verdict_paths"),
        "dead_lettered": sat.get("dead_lettered", 0) + half.get("dead_lettered", 0),
        # CPU seconds of each process over the saturation run (first record sent to last
        # answer read), per query and as cores kept busy.
        "cpu_saturation": sat.get("cpu"),
        "half_rate": {
            "rate_qps": round(pr.rate, 2),
            **{k: v for k, v in half.items() if k not in ("cpu", "verdict_paths")},
            "time_split_ms_per_query": half_split,
            "mean_batch_size": round(n_half_seen / half_batches, 2) if half_batches else None,
            "cpu": half.get("cpu"),
        },
    }


def ceiling_report(
    c: E2EBenchConfig, run: WorkerRun, ceiling: tuple[int, float, int, float]
) -> dict[str, Any]:
    """The text path's encoder fields: backend, threads, the encoder-only ceiling and the
    saturation throughput's ratio to it."""
    threads, enc_qps, cpus, enc_all = ceiling
    qps = run.paths["text"].sat["throughput_qps"]
    return {
        "encoder": run.encoder,
        "encoder_threads": threads,
        "encoder_dtype": c.encoder_dtype,
        "encoder_backend": run.backend,
        "encoder_backend_setting": c.encoder_backend,
        "encoder_only_qps": enc_qps,
        "ratio_to_encoder": round(qps / enc_qps, 3) if enc_qps else None,
        # The encoder alone on every CPU, nothing beside it: not the worker's setting,
        # reported so the thread choice can be judged.
        "encoder_only_qps_all_cpus": {"threads": cpus, "qps": enc_all},
    }


def placement_report(run: WorkerRun, plan: CpuPlan) -> dict[str, Any]:
    """Which CPUs each figure had: the plan, each process's allowed CPUs as read back
    from the kernel, and the encoder-only runs' CPUs."""
    everyone = allowed_cpus(os.getpid())
    return {
        **run.placement,
        "encoder_only": list(plan.worker_cpus) if plan.worker_cpus else everyone,
        "encoder_only_all_cpus": everyone,
    }


def encoder_ceiling(
    c: E2EBenchConfig, texts: list[str], encoder: str, backend: str, plan: CpuPlan
) -> tuple[int, float, int, float]:
    """The encoder alone in a fresh process: with the worker's threads on the worker's
    CPUs, and with every CPU (the same figure where they are equal); also both thread
    counts."""
    from sidecar.encoders import available_cpus
    from sidecar.encoders import encoder_threads as resolve_threads

    threads = c.encoder_threads or (
        max(1, len(plan.worker_cpus) - 1) if plan.worker_cpus else resolve_threads(0)
    )

    def ceiling(n_threads: int) -> float:
        return encoder_only_qps(
            texts,
            c.batch_max,
            encoder=encoder,
            threads=n_threads,
            dtype=c.encoder_dtype,
            backend=backend,
            repeats=2,
        )

    with spawning_on(plan.worker_cpus):
        enc_qps = ceiling(threads)
    cpus = available_cpus()
    enc_all = ceiling(cpus) if cpus != threads or plan.pinned else enc_qps
    return threads, enc_qps, cpus, enc_all
