"""The worker side of ``sidecar bench e2e``: the embedded broker, a directory store with
the demo model, one ``sidecar worker`` child, and the timed phases run against it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._e2e_config import VERDICT_PATH_FIELD, E2EBenchConfig
from sidecar.bench._e2e_machine import (
    CpuClock,
    CpuPlan,
    allowed_cpus,
    pinned_process,
    spawning_on,
    thread_count,
    thread_env,
)
from sidecar.bench._e2e_phase import PhaseTarget, run_phase, time_split
from sidecar.bench._e2e_report import peak_rss_mb, scrape


@dataclass(frozen=True)
class LoadPath:
    """One kind of query record the worker is timed on.

    ``name``: the report's key ("text", "embeddings"); ``pool``: distinct record bodies
    (without ``id`` and ``ts``), cycled to ``queries`` in the saturation run and to the
    half-rate run's count.
    """

    name: str
    pool: list[dict[str, Any]]
    queries: int

    def records(self, n: int) -> list[dict[str, Any]]:
        return [self.pool[i % len(self.pool)] for i in range(n)]


# Builds the paths from the encoder this process loaded and the model it published (the
# embeddings path precomputes its vectors with them, before any clock starts).
PathMaker = Callable[[Any, Any], list[LoadPath]]


@dataclass(frozen=True)
class PathRun:
    """What one path measured: both timed phases (and the per-query time split between
    the ``/metrics`` scrapes around each), the worker's peak RSS once they were done."""

    sat: dict[str, Any]
    half: dict[str, Any]
    rate: float
    split: tuple[dict[str, float], float, float]
    half_split: tuple[dict[str, float], float, float]
    rss: float | None


@dataclass(frozen=True)
class WorkerRun:
    """One worker's run: its encoder and backend, each path's figures (in the order run),
    and where on the machine each process was allowed to run."""

    encoder: str
    backend: str
    paths: dict[str, PathRun]
    placement: dict[str, Any]


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


def measure_worker(
    c: E2EBenchConfig,
    workdir: Path,
    make_paths: PathMaker,
    echo: Callable[[str], None],
    plan: CpuPlan | None = None,
) -> WorkerRun:
    """Start the broker and a worker (each on its part of the machine under ``plan``),
    publish the demo model, then time every path ``make_paths`` gives, one after another,
    against the same worker."""
    from sidecar.encoders import load_encoder
    from sidecar.local import EmbeddedBroker, WorkerProcess, publish, train_demo_model
    from sidecar.persistence import open_store
    from sidecar.stream import ensure_topics

    plan = plan or CpuPlan()
    broker = EmbeddedBroker()
    with spawning_on(plan.load_cpus):
        broker.start()
    try:
        settings = _worker_settings(c, broker, workdir)
        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, log_path=workdir / "worker.log")
        with spawning_on(plan.worker_cpus):
            worker.start()
        try:
            with pinned_process(plan.load_cpus):
                echo("training the demo model (the worker loads its encoder meanwhile) ...")
                encoder = load_encoder(settings.scoring)
                model = train_demo_model(encoder)
                store = open_store(settings)
                publish(store, model)
                store.close()
                ready = worker.wait_ready(c.timeout_s)
                resolved = resolved_backend(ready, c.encoder_backend)
                paths = make_paths(encoder, model)
                del encoder  # not needed while the clock runs
                broker_pid = broker.proc.pid if broker.proc else None
                placement = {
                    "plan": plan.describe(),
                    "allowed_cpus": {
                        "worker": allowed_cpus(worker.pid),
                        "broker": allowed_cpus(broker_pid),
                        "load_generator": allowed_cpus(os.getpid()),
                    },
                    # threads once the worker is ready (its BLAS pool sizes to its CPUs)
                    "threads": {
                        "worker": thread_count(worker.pid),
                        "broker": thread_count(broker_pid),
                    },
                    "thread_env": thread_env(),
                }
                clock = CpuClock(
                    {"worker": worker.pid, "broker": broker_pid, "load_generator": os.getpid()}
                )
                runs = {
                    p.name: _phases(c, broker.bootstrap, settings.kafka, worker, p, clock)
                    for p in paths
                }
        finally:
            worker.terminate()
    finally:
        broker.stop()
    return WorkerRun(settings.scoring.encoder, resolved, runs, placement)


def _phases(
    c: E2EBenchConfig, bootstrap: str, k: Any, worker: Any, path: LoadPath, clock: CpuClock
) -> PathRun:
    """Warm-up, saturation, then half the measured rate; the time split around each."""
    from tqdm import tqdm

    target = PhaseTarget(
        bootstrap,
        k.queries_topic,
        k.verdicts_topic,
        c.timeout_s,
        dlq_topic=k.dlq_topic,
        path_field=VERDICT_PATH_FIELD,
        clock=clock,
    )
    name = path.name

    def phase(
        batch: list[dict[str, Any]], prefix: str, rate: float | None, progress: Any = None
    ) -> dict[str, Any]:
        return asyncio.run(run_phase(target, batch, f"{name}-{prefix}", rate, progress))

    def metrics() -> dict[str, float]:
        return scrape(str(worker.get("/metrics")[1]))

    # A short untimed run first: the first batches pay one-off costs.
    phase(path.records(2 * c.batch_max), "warm", None)
    before = metrics()
    with tqdm(total=path.queries, desc=f"{name}: saturation", unit="q") as bar:
        sat = phase(path.records(path.queries), "sat", None, bar.update)
    after = metrics()
    rate = sat["throughput_qps"] / 2.0
    n_half = min(c.half_rate_queries, max(50, int(rate * 30)))
    with tqdm(total=n_half, desc=f"{name}: half rate {rate:.0f}/s", unit="q") as bar:
        half_before = metrics()
        half = phase(path.records(n_half), "half", rate, bar.update)
    half_after = metrics()
    return PathRun(
        sat=sat,
        half=half,
        rate=rate,
        split=time_split(before, after),
        half_split=time_split(half_before, half_after),
        rss=peak_rss_mb(worker.pid) if worker.pid else None,
    )


def resolved_backend(readyz: Any, setting: str) -> str:
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
