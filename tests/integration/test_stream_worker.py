"""The scoring worker end to end: real broker, real redis-server, real encoder, real faust.

Workers run as ``python -m sidecar worker`` child processes configured by environment
variables (as in production) and are stopped by pid. Each test uses its own topics and
consumer group on the session broker. Waits are on verdicts consumed from the broker,
each with a timeout; nothing sleeps in place of synchronisation.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess, free_port
from sidecar.settings import Settings, load_settings
from sidecar.stream import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WAIT_S = 120.0  # generous: CI machines are shared


@pytest.fixture(scope="module")
def store_redis() -> Iterator[EmbeddedRedis]:
    """One redis-server for this module's model store (the workers only read it)."""
    with EmbeddedRedis() as r:
        yield r


@pytest.fixture(scope="module")
def demo_model() -> Any:
    """The demo KB model, fitted on real embeddings (the encoder loads once here)."""
    from sidecar.encoders import SentenceTransformerEncoder
    from sidecar.local._demo import train_demo_model

    return train_demo_model(SentenceTransformerEncoder())


@pytest.fixture
def make_settings(
    broker: EmbeddedBroker, store_redis: EmbeddedRedis, demo_model: Any, tmp_path: Path
) -> Callable[..., Awaitable[Settings]]:
    """Settings for one test: its own topics and group; the demo model promoted in Redis."""
    from sidecar.local._demo import publish
    from sidecar.persistence import open_store

    tag = uuid.uuid4().hex[:8]

    async def make(*, on: EmbeddedBroker | None = None, **kafka: Any) -> Settings:
        s = load_settings(
            kafka={
                "brokers": (on or broker).url,
                "app_id": f"it-{tag}",
                "queries_topic": f"q-{tag}",
                "verdicts_topic": f"v-{tag}",
                "dlq_topic": f"dlq-{tag}",
                "id_topic": f"id-{tag}",
                "ood_topic": f"ood-{tag}",
                "partitions": 4,
                "session_timeout_s": 6.0,
                "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
                **kafka,
            },
            redis={"url": store_redis.url},
            store={"backend": "redis", "poll_interval_s": 1.0},
            scoring={"batch_max": 32, "batch_timeout_ms": 20, "max_text_chars": 300},
            web={"host": "127.0.0.1", "port": free_port()},
        )
        store = open_store(s)
        try:
            publish(store, demo_model)
        finally:
            store.close()
        await ensure_topics(s)
        return s

    return make


def worker(settings: Settings, tmp_path: Path, name: str) -> WorkerProcess:
    return WorkerProcess(settings, log_path=tmp_path / f"{name}.log")


async def produce(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    keys: list[bytes | None],
    rate_hz: float | None = None,
) -> list[tuple[int, int]]:
    """Send values in order; returns (partition, offset) of each."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        futs = []
        for value, key in zip(values, keys, strict=True):
            futs.append(await p.send(topic, value, key=key))
            if rate_hz:
                await asyncio.sleep(1.0 / rate_hz)  # pacing the load, not synchronisation
        metas = await asyncio.gather(*futs)
        return [(m.partition, m.offset) for m in metas]
    finally:
        await p.stop()


async def collect(
    bootstrap: str,
    topics: list[str],
    done: Callable[[dict[str, list[Any]]], bool],
    timeout_s: float = WAIT_S,
) -> dict[str, list[Any]]:
    """Read ``topics`` from the start until ``done(records_by_topic)`` or the timeout."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await c.start()
    got: dict[str, list[Any]] = {t: [] for t in topics}
    try:
        async with asyncio.timeout(timeout_s):
            while not done(got):
                batch = await c.getmany(timeout_ms=500)
                for tp, msgs in batch.items():
                    got[tp.topic].extend(msgs)
    except TimeoutError:
        pass
    finally:
        await c.stop()
    return got


async def read_to_end(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record now in ``topic`` (up to the end offsets taken at the call)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        out: list[Any] = []
        async with asyncio.timeout(WAIT_S):
            while True:
                behind = [tp for tp in tps if await c.position(tp) < end[tp]]
                if not behind:
                    return out
                for msgs in (await c.getmany(*behind, timeout_ms=500)).values():
                    out.extend(msgs)
    finally:
        await c.stop()


async def committed_offsets(bootstrap: str, group: str, topic: str, n: int) -> dict[int, int]:
    """The group's committed offset per partition (0 where nothing was committed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()  # not subscribed: it reads offsets without joining the group
    try:
        return {p: (await c.committed(TopicPartition(topic, p))) or 0 for p in range(n)}
    finally:
        await c.stop()


def ids_of(records: list[Any]) -> list[str]:
    return [json.loads(r.value)["id"] for r in records]


def queries(n: int, prefix: str) -> tuple[list[bytes], list[bytes | None], dict[str, str]]:
    """``n`` demo queries (ID and OOD interleaved) as values, keys and id -> expected."""
    from sidecar.local._demo import demo_data

    labelled = demo_data().labelled()
    values, keys, expected = [], [], {}
    for i in range(n):
        text, exp = labelled[i % len(labelled)]
        qid = f"{prefix}-{i}"
        values.append(json.dumps({"id": qid, "text": text, "ts": 0}).encode())
        keys.append(qid.encode())
        expected[qid] = exp
    return values, keys, expected


BAD_INPUTS: list[tuple[bytes, str]] = [
    (b"\xff\xfe\xfa", "undecodable"),
    (b"{nope", "invalid_json"),
    (json.dumps({"text": "no id"}).encode(), "missing_id"),
    (json.dumps({"id": "b1"}).encode(), "missing_text"),
    (json.dumps({"id": "b2", "text": "  "}).encode(), "empty_text"),
    (json.dumps({"id": "b3", "text": 42}).encode(), "bad_text_type"),
    (json.dumps({"id": "b4", "text": "hi", "kb": "elsewhere"}).encode(), "unknown_kb"),
    (json.dumps({"id": "b5", "text": "x" * 301}).encode(), "too_long"),
]


async def test_n_queries_get_n_verdicts_routed_and_bad_input_is_dead_lettered(
    make_settings: Callable[..., Awaitable[Settings]], broker: EmbeddedBroker, tmp_path: Path
) -> None:
    s = await make_settings(route_topics=True)
    k = s.kafka
    good1, keys1, expected = queries(30, "a")
    good2, keys2, expected2 = queries(30, "b")
    expected.update(expected2)
    bad = [v for v, _ in BAD_INPUTS]
    # Bad input in the middle: the stream must go on past it.
    values = good1 + bad + good2
    keys = keys1 + [None] * len(bad) + keys2

    with worker(s, tmp_path, "w1") as w:
        await asyncio.to_thread(w.wait_ready, WAIT_S)
        positions = await produce(broker.bootstrap, k.queries_topic, values, keys)
        topics = [k.verdicts_topic, k.id_topic, k.ood_topic, k.dlq_topic]
        got = await collect(
            broker.bootstrap,
            topics,
            lambda g: len(g[k.verdicts_topic]) >= len(expected) and len(g[k.dlq_topic]) >= len(bad),
        )
        status, metrics = w.get("/metrics")
        ready_status, ready = w.get("/readyz")
        models_status, models = w.get("/models")
        health_status, _ = w.get("/healthz")
        hidden = [w.get(p)[0] for p in ("/router", "/table", "/graph")]

    verdicts = [json.loads(r.value) for r in got[k.verdicts_topic]]
    assert sorted(v["id"] for v in verdicts) == sorted(expected)  # exactly N, no extra
    for v in verdicts:
        assert set(v) >= {
            "id",
            "kb",
            "verdict",
            "score",
            "threshold",
            "detector",
            "model_version",
            "latency_ms",
            "ts",
        }
        assert v["verdict"] in ("ID", "OOD") and v["kb"] == "default"
        assert (v["score"] > v["threshold"]) == (v["verdict"] == "OOD")
    headers = dict(got[k.verdicts_topic][0].headers)
    assert headers["model_version"].decode() == verdicts[0]["model_version"]
    by_verdict = {v["id"]: v["verdict"] for v in verdicts}
    assert sorted(ids_of(got[k.id_topic])) == sorted(i for i, x in by_verdict.items() if x == "ID")
    assert sorted(ids_of(got[k.ood_topic])) == sorted(
        i for i, x in by_verdict.items() if x == "OOD"
    )
    # The demo model is good on its own queries (half of them unseen in training).
    agree = sum(by_verdict[i] == e for i, e in expected.items()) / len(expected)
    assert agree >= 0.8

    dead = [json.loads(r.value) for r in got[k.dlq_topic]]
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in BAD_INPUTS)
    bad_positions = set(positions[len(good1) : len(good1) + len(bad)])
    for d in dead:
        assert (d["partition"], d["offset"]) in bad_positions
        assert d["topic"] == k.queries_topic and d["detail"]
    undecodable = next(d for d in dead if d["reason"] == "undecodable")
    assert undecodable["payload_encoding"] == "base64"

    assert status == 200
    assert 'sidecar_dlq_total{reason="too_long"} 1.0' in metrics
    assert f"sidecar_records_total {len(values)}.0" in metrics
    assert "sidecar_model_info{" in metrics and "sidecar_consumer_lag{" in metrics
    assert "\nsidecar_ready 1.0" in metrics and 'sidecar_ready_check{check="store"} 1.0' in metrics
    assert ready_status == 200 and ready["ready"] and ready["checks"]["partitions"]["assigned"]
    assert models_status == 200 and models["models"]["default"]["detector"] == "knn"
    assert health_status == 200
    assert hidden == [404, 404, 404]  # faust's data pages are off


async def test_second_worker_joining_mid_stream_loses_no_query(
    make_settings: Callable[..., Awaitable[Settings]], broker: EmbeddedBroker, tmp_path: Path
) -> None:
    s = await make_settings()
    k = s.kafka
    a = worker(s, tmp_path, "a")
    b = worker(
        s.model_copy(update={"web": s.web.model_copy(update={"port": free_port()})}), tmp_path, "b"
    )
    sent: list[str] = []
    try:
        a.start()
        await asyncio.to_thread(a.wait_ready, WAIT_S)
        b.start()  # joins while the stream below flows: a rebalance in the middle
        b_ready = asyncio.create_task(asyncio.to_thread(b.wait_ready, WAIT_S))
        i = 0
        while not b_ready.done():
            values, keys, _ = queries(10, f"r{i}")
            await produce(broker.bootstrap, k.queries_topic, values, keys, rate_hz=50)
            sent += [key.decode() for key in keys if key]
            i += 1
        await b_ready  # re-raises if b never became ready
        values, keys, _ = queries(40, "after")
        await produce(broker.bootstrap, k.queries_topic, values, keys)
        sent += [key.decode() for key in keys if key]
        want = set(sent)
        got = await collect(
            broker.bootstrap, [k.verdicts_topic], lambda g: want <= set(ids_of(g[k.verdicts_topic]))
        )
        _, metrics_b = b.get("/metrics")
    finally:
        a.terminate()
        b.terminate()
    seen = Counter(ids_of(got[k.verdicts_topic]))
    assert want - set(seen) == set(), "queries lost across the rebalance"
    assert set(seen) <= want
    # b really took partitions over and scored some of the stream.
    assert "sidecar_records_total 0.0" not in metrics_b


async def test_sigterm_drains_commits_and_a_restart_loses_nothing(
    make_settings: Callable[..., Awaitable[Settings]], broker: EmbeddedBroker, tmp_path: Path
) -> None:
    s = await make_settings()
    k = s.kafka
    values, keys, expected = queries(400, "t")
    a = worker(s, tmp_path, "a")
    try:
        a.start()
        await asyncio.to_thread(a.wait_ready, WAIT_S)
        positions = await produce(broker.bootstrap, k.queries_topic, values, keys)
        await collect(
            broker.bootstrap, [k.verdicts_topic], lambda g: len(g[k.verdicts_topic]) >= 40
        )
        code = await asyncio.to_thread(a.terminate, WAIT_S)  # SIGTERM in mid-stream
    finally:
        a.kill()
    assert code == 0

    by_a = ids_of(await read_to_end(broker.bootstrap, k.verdicts_topic, k.partitions))
    committed = await committed_offsets(broker.bootstrap, k.app_id, k.queries_topic, k.partitions)
    pos = dict(zip(ids_of_values(values), positions, strict=True))
    # Drained and committed: per partition, the commit is right after the last record a
    # scored, and every record below the commit has its verdict.
    for p in range(k.partitions):
        done_offsets = [pos[i][1] for i in by_a if pos[i][0] == p]
        assert committed[p] == (max(done_offsets) + 1 if done_offsets else 0)
    below = {i for i, (p, o) in pos.items() if o < committed[p]}
    assert below <= set(by_a)
    assert 40 <= len(set(by_a)) < len(expected)

    seen = Counter(await restart_until_all_scored(s, tmp_path, broker.bootstrap, set(expected)))
    assert set(expected) - set(seen) == set(), "queries lost across the restart"
    # The restart did not redo what a had committed.
    assert all(seen[i] == 1 for i in below)


async def restart_until_all_scored(
    s: Settings, tmp_path: Path, bootstrap: str, expected: set[str]
) -> list[str]:
    """Start a worker "b" in the same group and read verdicts until ``expected`` all have
    one (or the wait runs out); returns the ids of every verdict on the topic."""
    k = s.kafka
    b = worker(s, tmp_path, "b")
    try:
        b.start()
        await asyncio.to_thread(b.wait_ready, WAIT_S)
        got = await collect(
            bootstrap, [k.verdicts_topic], lambda g: expected <= set(ids_of(g[k.verdicts_topic]))
        )
    finally:
        b.terminate()
    return ids_of(got[k.verdicts_topic])


def ids_of_values(values: list[bytes]) -> list[str]:
    return [json.loads(v)["id"] for v in values]


async def test_an_undeliverable_batch_halts_the_worker_and_a_restart_redelivers_it(
    make_settings: Callable[..., Awaitable[Settings]], tmp_path: Path
) -> None:
    # A broker that stops answering mid-stream (SIGSTOP, on a broker of this test's own):
    # the batch in flight cannot be delivered within kafka.produce_timeout_s. The worker
    # must halt and exit non-zero without committing past it, and lose nothing.
    import signal

    with EmbeddedBroker() as own:
        assert own.proc is not None
        s = await make_settings(on=own, produce_timeout_s=3.0)
        k = s.kafka
        values, keys, expected = queries(400, "h")
        a = worker(s, tmp_path, "a")
        try:
            a.start()
            await asyncio.to_thread(a.wait_ready, WAIT_S)
            positions = await produce(own.bootstrap, k.queries_topic, values, keys)
            await collect(
                own.bootstrap, [k.verdicts_topic], lambda g: len(g[k.verdicts_topic]) >= 40
            )
            own.proc.send_signal(signal.SIGSTOP)
            try:
                halted = await asyncio.to_thread(_wait_for_log, a, "stream halted", WAIT_S)
            finally:
                own.proc.send_signal(signal.SIGCONT)
            code = await asyncio.to_thread(a.proc.wait, WAIT_S)  # type: ignore[union-attr]
        finally:
            a.kill()
        assert halted, a.log_tail()
        assert code != 0, a.log_tail()

        by_a = set(ids_of(await read_to_end(own.bootstrap, k.verdicts_topic, k.partitions)))
        committed = await committed_offsets(own.bootstrap, k.app_id, k.queries_topic, k.partitions)
        pos = dict(zip(ids_of_values(values), positions, strict=True))
        below = {i for i, (p, o) in pos.items() if o < committed[p]}
        assert below <= by_a, "committed records without a verdict"
        assert len(by_a) < len(expected)  # the halt came mid-stream

        seen = await restart_until_all_scored(s, tmp_path, own.bootstrap, set(expected))
    assert set(expected) - set(seen) == set(), "queries lost"


def _wait_for_log(w: WorkerProcess, needle: str, timeout_s: float) -> bool:
    """Poll the worker's log for ``needle`` (the worker writes it; nothing else signals)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in w.log_tail(400):
            return True
        if w.proc is not None and w.proc.poll() is not None:
            return needle in w.log_tail(400)
        time.sleep(0.2)
    return False
