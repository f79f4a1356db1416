"""One timed phase of ``sidecar bench e2e``: queries produced to the worker (paced or flat
out) and every verdict read back, with throughput and latency; and the per-query time
split between two ``/metrics`` scrapes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from sidecar.bench._e2e_report import percentile
from sidecar.errors import BrokerError


async def run_phase(
    bootstrap: str,
    topic_in: str,
    topic_out: str,
    texts: list[str],
    prefix: str,
    rate_hz: float | None,
    timeout_s: float,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Produce ``texts`` (paced at ``rate_hz`` or flat out) and wait for every verdict."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        topic_out,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await consumer.start()
    await producer.start()
    ids = {f"{prefix}-{i}" for i in range(len(texts))}
    received: dict[str, float] = {}
    latencies: list[float] = []
    in_worker: list[float] = []  # the verdict's own latency_ms: record timestamp to produce
    done = asyncio.Event()

    async def consume() -> None:
        while len(received) < len(ids):
            for msgs in (await consumer.getmany(timeout_ms=50)).values():
                now = time.time() * 1000.0
                for m in msgs:
                    doc = json.loads(m.value)
                    qid = doc["id"]
                    if qid in ids and qid not in received:
                        received[qid] = now
                        latencies.append(now - sent_ts[qid])
                        if doc.get("latency_ms") is not None:
                            in_worker.append(float(doc["latency_ms"]))
                        if progress:
                            progress(1)
        done.set()

    sent_ts: dict[str, float] = {}
    task = asyncio.create_task(consume())
    t_start = time.time()
    try:
        for i, text in enumerate(texts):
            if rate_hz:
                delay = t_start + i / rate_hz - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the offered load
            qid = f"{prefix}-{i}"
            ts = time.time() * 1000.0
            sent_ts[qid] = ts
            doc = {"id": qid, "text": text, "ts": int(ts)}
            await producer.send(topic_in, json.dumps(doc).encode(), key=qid.encode())
        await producer.flush()
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError as exc:
        raise BrokerError(
            f"only {len(received)} of {len(ids)} verdicts in {timeout_s:.0f} s"
        ) from exc
    finally:
        task.cancel()
        await producer.stop()
        await consumer.stop()
    elapsed = (max(received.values()) / 1000.0) - t_start
    return {
        "queries": len(texts),
        "elapsed_s": round(elapsed, 3),
        "throughput_qps": round(len(texts) / elapsed, 2),
        "latency_ms_p50": round(percentile(latencies, 0.5), 2),
        "latency_ms_p99": round(percentile(latencies, 0.99), 2),
        "worker_latency_ms_p50": round(percentile(in_worker, 0.5), 2),
        "worker_latency_ms_p99": round(percentile(in_worker, 0.99), 2),
    }


def time_split(
    before: dict[str, float], after: dict[str, float]
) -> tuple[dict[str, float], float, float]:
    """Per-query ms in each stage between two scrapes; also the records and batches."""
    n = after.get("sidecar_records_total", 0.0) - before.get("sidecar_records_total", 0.0)
    b0, b1 = before.get("sidecar_batch_size_count", 0.0), after.get("sidecar_batch_size_count", 0.0)
    split = {
        s: round(
            1000.0 * (after.get(f"stage_{s}", 0.0) - before.get(f"stage_{s}", 0.0)) / max(n, 1.0), 4
        )
        for s in ("decode", "encode", "detect", "produce")
    }
    return split, n, b1 - b0
