"""The worker side of ``sidecar bench e2e``: the embedded broker, a directory store with
the demo model, one ``sidecar worker`` child, and the timed phases run against it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._e2e_config import E2EBenchConfig
from sidecar.bench._e2e_phase import run_phase, time_split
from sidecar.bench._e2e_report import peak_rss_mb, scrape


@dataclass(frozen=True)
class WorkerRun:
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
    c: E2EBenchConfig, workdir: Path, texts: list[str], pool: list[str], echo: Callable[[str], None]
) -> WorkerRun:
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
            resolved = resolved_backend(ready, c.encoder_backend)
            phases = _phases(c, broker.bootstrap, settings.kafka, worker, texts, pool)
            rss = peak_rss_mb(worker.pid) if worker.pid else None
        finally:
            worker.terminate()
    return WorkerRun(settings.scoring.encoder, resolved, rss=rss, **phases)


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
