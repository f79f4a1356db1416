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

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sidecar.bench._e2e_encoder import encoder_only_qps
from sidecar.bench._e2e_phase import run_phase, time_split
from sidecar.bench._e2e_report import median_report, peak_rss_mb, scrape, targets
from sidecar.bench._report_file import write_report
from sidecar.errors import DataError

log = logging.getLogger(__name__)


def bench_texts(source: str, shared_data: Path | None = None) -> list[str]:
    """Realistic query texts: the demo queries, or CLINC-150 texts from ../shared/data.

    CLINC-150: the test utterances (in-scope and out-of-scope) where the file has them,
    else the validation ones.

    Raises
    ------
    DataError
        The CLINC-150 file is missing, unreadable or holds no utterances.
    """
    if source == "clinc":
        path = (shared_data or Path("../shared/data")) / "clinc150" / "data_full.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read CLINC-150 texts from {path}: {exc}") from exc
        for splits in (("test", "oos_test"), ("val", "oos_val")):
            texts = [str(t) for split in splits for t, *_ in doc.get(split, [])]
            if texts:
                return texts
        raise DataError(f"{path} has no test or val utterances")
    from sidecar.local import demo_data

    return [t for t, _ in demo_data().labelled()]


@dataclass(frozen=True)
class E2EBenchConfig:
    """The worker's settings and the load of ``sidecar bench e2e``, and where its report goes.

    ``queries``: the saturation run's queries; ``half_rate_queries``: at most this many
    in the half-rate run. ``batch_max``, ``batch_timeout_ms`` and the ``encoder_*``
    fields are the worker's ``scoring`` settings (``batch_max`` is also the encoder-only
    batch size). ``source``: "demo" or "clinc" texts. ``repeat``: whole runs, folded by
    :func:`median_report`. ``workdir``: where the worker log and the store are kept
    (None: a fresh temporary folder). ``timeout_s``: per wait for the worker or a phase.
    ``encoder``: the worker's encoder (None: ``scoring.encoder`` of the settings).
    """

    json_out: Path
    queries: int = 2000
    half_rate_queries: int = 1000
    batch_max: int = 64
    batch_timeout_ms: int = 5
    encoder_threads: int = 0
    encoder_dtype: str = "float32"
    encoder_backend: str = "auto"
    source: str = "demo"
    repeat: int = 1
    workdir: Path | None = None
    timeout_s: float = 600.0
    # the worker's scoring.encoder (None: the settings' own)
    encoder: str | None = None


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
        "encoders": list(encoders),
        "points": points,
    }
    write_report(config.json_out, report)
    return report


@dataclass(frozen=True)
class _WorkerRun:
    """What one run measured on the worker: its encoder, both timed phases (and the
    per-query time split between the ``/metrics`` scrapes around each), its peak RSS."""

    encoder: str
    backend: str
    sat: dict[str, Any]
    half: dict[str, Any]
    rate: float
    split: tuple[dict[str, float], float, float]
    half_split: tuple[dict[str, float], float, float]
    rss: float | None


def _run_once(c: E2EBenchConfig, workdir: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """One run: the worker's phases, then the encoder alone; the run's report."""
    pool = bench_texts(c.source)
    texts = [pool[i % len(pool)] for i in range(c.queries)]
    load_start = os.getloadavg()
    report: dict[str, Any] = {
        "source": c.source,
        "batch_max": c.batch_max,
        "batch_timeout_ms": c.batch_timeout_ms,
        "cpu_count": os.cpu_count(),
    }
    run = _measure_worker(c, workdir, texts, pool, echo)
    echo("measuring the encoder alone in a fresh process ...")
    threads, enc_qps, cpus, enc_all = _encoder_ceiling(c, texts, run.encoder, run.backend)
    split, n, batches = run.split
    half_split, n_half_seen, half_batches = run.half_split
    sat, half = run.sat, run.half
    report.update(
        {
            "encoder": run.encoder,
            "queries": c.queries,
            "throughput_qps": sat["throughput_qps"],
            "latency_ms_p50": sat["latency_ms_p50"],
            "latency_ms_p99": sat["latency_ms_p99"],
            "encoder_threads": threads,
            "encoder_dtype": c.encoder_dtype,
            "encoder_backend": run.backend,
            "encoder_backend_setting": c.encoder_backend,
            "encoder_only_qps": enc_qps,
            "ratio_to_encoder": round(sat["throughput_qps"] / enc_qps, 3) if enc_qps else None,
            # The encoder alone on every CPU, nothing beside it: not the worker's setting,
            # reported so the thread choice can be judged.
            "encoder_only_qps_all_cpus": {"threads": cpus, "qps": enc_all},
            "worker_peak_rss_mb": round(run.rss, 1) if run.rss is not None else None,
            "time_split_ms_per_query": split,
            "mean_batch_size_saturation": round(n / batches, 2) if batches else None,
            "half_rate": {
                "rate_qps": round(run.rate, 2),
                **half,
                "time_split_ms_per_query": half_split,
                "mean_batch_size": round(n_half_seen / half_batches, 2) if half_batches else None,
            },
            "load_average_1_5_15_start": [round(x, 2) for x in load_start],
            "load_average_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    report["targets"] = targets(
        report["ratio_to_encoder"], half["latency_ms_p99"], report["worker_peak_rss_mb"]
    )
    return report


def _worker_settings(c: E2EBenchConfig, broker: Any, workdir: Path) -> Any:
    """The worker's settings: the embedded broker, a directory store in ``workdir``."""
    from sidecar.local import EmbeddedBroker, free_port
    from sidecar.settings import load_settings

    return load_settings(
        kafka={
            "brokers": broker.url,
            "app_id": "sidecar-bench",
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        },
        store={"backend": "directory", "directory": workdir / "store", "poll_interval_s": 1.0},
        scoring={
            **({"encoder": c.encoder} if c.encoder else {}),
            "batch_max": c.batch_max,
            "batch_timeout_ms": c.batch_timeout_ms,
            "encoder_threads": c.encoder_threads,
            "encoder_dtype": c.encoder_dtype,
            "encoder_backend": c.encoder_backend,
        },
        web={"host": "127.0.0.1", "port": free_port()},
    )


def _measure_worker(
    c: E2EBenchConfig, workdir: Path, texts: list[str], pool: list[str], echo: Callable[[str], None]
) -> _WorkerRun:
    """Start the broker and a worker, publish the demo model, time both phases."""
    from sidecar.encoders import load_encoder
    from sidecar.local import EmbeddedBroker, WorkerProcess, publish, train_demo_model
    from sidecar.persistence import open_store
    from sidecar.stream import ensure_topics

    with EmbeddedBroker() as broker:
        settings = _worker_settings(c, broker, workdir)
        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, log_path=workdir / "worker.log")
        worker.start()
        try:
            echo("training the demo model (the worker loads its encoder meanwhile) ...")
            model = train_demo_model(load_encoder(settings.scoring))
            store = open_store(settings)
            publish(store, model)
            store.close()
            ready = worker.wait_ready(c.timeout_s)
            resolved = _resolved_backend(ready, c.encoder_backend)
            phases = _phases(c, broker.bootstrap, settings.kafka, worker, texts, pool)
            rss = peak_rss_mb(worker.pid) if worker.pid else None
        finally:
            worker.terminate()
    return _WorkerRun(settings.scoring.encoder, resolved, rss=rss, **phases)


def _phases(
    c: E2EBenchConfig, bootstrap: str, k: Any, worker: Any, texts: list[str], pool: list[str]
) -> dict[str, Any]:
    """Warm-up, saturation, then half the measured rate; the time split around each."""
    from tqdm import tqdm

    def phase(
        batch: list[str], prefix: str, rate: float | None, progress: Any = None
    ) -> dict[str, Any]:
        return asyncio.run(
            run_phase(
                bootstrap, k.queries_topic, k.verdicts_topic, batch, prefix, rate, c.timeout_s,
                progress,
            )
        )  # fmt: skip

    def metrics() -> dict[str, float]:
        return scrape(str(worker.get("/metrics")[1]))

    # A short untimed run first: the first batches pay one-off costs.
    phase(texts[: 2 * c.batch_max], "warm", None)
    before = metrics()
    with tqdm(total=c.queries, desc="saturation", unit="q") as bar:
        sat = phase(texts, "sat", None, bar.update)
    after = metrics()
    rate = sat["throughput_qps"] / 2.0
    n_half = min(c.half_rate_queries, max(50, int(rate * 30)))
    half_texts = [pool[i % len(pool)] for i in range(n_half)]
    with tqdm(total=n_half, desc=f"half rate {rate:.0f}/s", unit="q") as bar:
        half_before = metrics()
        half = phase(half_texts, "half", rate, bar.update)
    half_after = metrics()
    return {
        "sat": sat,
        "half": half,
        "rate": rate,
        "split": time_split(before, after),
        "half_split": time_split(half_before, half_after),
    }


def _encoder_ceiling(
    c: E2EBenchConfig, texts: list[str], encoder: str, backend: str
) -> tuple[int, float, int, float]:
    """The encoder alone in a fresh process: with the worker's threads, and with every
    CPU (the same figure where they are equal); also both thread counts."""
    from sidecar.encoders import available_cpus
    from sidecar.encoders import encoder_threads as resolve_threads

    threads = resolve_threads(c.encoder_threads)

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

    enc_qps = ceiling(threads)
    cpus = available_cpus()
    enc_all = ceiling(cpus) if cpus != threads else enc_qps
    return threads, enc_qps, cpus, enc_all


def _resolved_backend(readyz: Any, setting: str) -> str:
    """The encoder backend the worker runs, from its ``/readyz`` document."""
    try:
        backend = readyz["checks"]["encoder"]["backend"]
    except (KeyError, TypeError):
        backend = None
    if isinstance(backend, str) and backend:  # torch, onnx, or a packaged runtime's own
        return backend
    if setting != "auto":
        return setting
    raise RuntimeError(f"the worker's /readyz does not name its encoder backend: {readyz}")
