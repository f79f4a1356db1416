"""One timed phase of ``sidecar bench e2e``: query records produced to the worker (paced
or flat out) and every answer read back (a verdict, or a dead letter), with throughput,
latency, the scoring path the verdicts name and each process's CPU time; and the per-query
time split between two ``/metrics`` scrapes."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.bench._e2e_machine import CpuClock, cpu_usage
from sidecar.bench._e2e_report import percentile
from sidecar.errors import BrokerError


@dataclass(frozen=True)
class PhaseTarget:
    """Where a phase sends and reads: the broker, the worker's topics, the wait.

    ``dlq_topic``: dead letters of the phase's queries count as answered (and are
    reported), so a worker that refuses them fails the phase at once, not at the timeout.
    ``path_field``: the verdict field that names the scoring path (counted per value).
    ``clock``: the processes whose CPU time is sampled when the first record is sent and
    when the last answer is read.
    """

    bootstrap: str
    topic_in: str
    topic_out: str
    timeout_s: float
    dlq_topic: str | None = None
    path_field: str | None = None
    clock: CpuClock | None = None


async def run_phase(
    target: PhaseTarget,
    records: Sequence[Mapping[str, Any]],
    prefix: str,
    rate_hz: float | None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Produce ``records`` (paced at ``rate_hz`` or flat out), each with an ``id`` and a
    ``ts`` added, and wait for every answer.

    The records are serialised before the clock starts (the same record object once), so
    the timed loop costs the client only an id, a timestamp and a send.
    """
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    bodies: dict[int, str] = {}
    for rec in records:
        if id(rec) not in bodies:
            body = json.dumps(dict(rec), separators=(",", ":"))
            bodies[id(rec)] = "," + body[1:] if body != "{}" else "}"
    topics = [target.topic_out, *([target.dlq_topic] if target.dlq_topic else [])]
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=target.bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
    )
    producer = AIOKafkaProducer(bootstrap_servers=target.bootstrap, linger_ms=0)
    await consumer.start()
    await producer.start()
    ids = {f"{prefix}-{i}" for i in range(len(records))}
    received: dict[str, float] = {}
    latencies: list[float] = []
    in_worker: list[float] = []  # the verdict's own latency_ms: record timestamp to produce
    paths: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    cpu_end: dict[str, tuple[float, float | None] | None] = {}
    done = asyncio.Event()

    def answered(qid: Any, now: float) -> bool:
        if qid not in ids or qid in received:
            return False
        received[qid] = now
        latencies.append(now - sent_ts[qid])
        if progress:
            progress(1)
        return True

    async def consume() -> None:
        while len(received) < len(ids):
            for tp, msgs in (await consumer.getmany(timeout_ms=50)).items():
                now = time.time() * 1000.0
                for m in msgs:
                    if tp.topic == target.dlq_topic:
                        qid, reason = _dead_letter_id(m.value)
                        if answered(qid, now):
                            dead[reason] += 1
                        continue
                    doc = json.loads(m.value)
                    if answered(doc["id"], now):
                        if doc.get("latency_ms") is not None:
                            in_worker.append(float(doc["latency_ms"]))
                        if target.path_field:
                            paths[str(doc.get(target.path_field))] += 1
        if target.clock is not None:
            cpu_end.update(target.clock.sample())
        done.set()

    sent_ts: dict[str, float] = {}
    task = asyncio.create_task(consume())
    cpu_start = target.clock.sample() if target.clock is not None else {}
    t_start = time.time()
    try:
        for i, rec in enumerate(records):
            if rate_hz:
                delay = t_start + i / rate_hz - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the offered load
            qid = f"{prefix}-{i}"
            ts = time.time() * 1000.0
            sent_ts[qid] = ts
            value = f'{{"id":"{qid}","ts":{int(ts)}{bodies[id(rec)]}'
            await producer.send(target.topic_in, value.encode(), key=qid.encode())
        await producer.flush()
        await asyncio.wait_for(done.wait(), target.timeout_s)
    except TimeoutError as exc:
        raise BrokerError(
            f"only {len(received)} of {len(ids)} answers in {target.timeout_s:.0f} s"
        ) from exc
    finally:
        task.cancel()
        await producer.stop()
        await consumer.stop()
    elapsed = (max(received.values()) / 1000.0) - t_start
    out: dict[str, Any] = {
        "queries": len(records),
        "elapsed_s": round(elapsed, 3),
        "throughput_qps": round(len(records) / elapsed, 2),
        "latency_ms_p50": round(percentile(latencies, 0.5), 2),
        "latency_ms_p99": round(percentile(latencies, 0.99), 2),
        "worker_latency_ms_p50": round(percentile(in_worker, 0.5), 2),
        "worker_latency_ms_p99": round(percentile(in_worker, 0.99), 2),
        "dead_lettered": sum(dead.values()),
    }
    if dead:
        out["dead_letter_reasons"] = dict(dead)
    if target.path_field:
        out["verdict_paths"] = dict(paths)
    if target.clock is not None:
        out["cpu"] = cpu_usage(cpu_start, cpu_end, elapsed, len(records))
    return out


def _dead_letter_id(value: bytes | None) -> tuple[Any, str]:
    """The query id inside a dead letter's payload (None when it has none) and the reason."""
    try:
        doc = json.loads(value or b"")
        reason = str(doc.get("reason"))
        payload = doc.get("payload")
        query = json.loads(payload) if doc.get("payload_encoding") == "utf-8" else None
        return (query.get("id") if isinstance(query, dict) else None), reason
    except (ValueError, AttributeError):
        return None, "unreadable"


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
