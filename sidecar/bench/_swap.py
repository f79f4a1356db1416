"""The live-swap benchmark's run: the embedded broker, a private redis-server, N real
``sidecar worker`` replicas in one consumer group, a steady query stream, a promotion a
third of the way in and a rollback two thirds in; every verdict is read back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sidecar.bench._swap_report import swap_report
from sidecar.persistence import model_to_artifact

_TOPICS = ("q", "v", "dlq")
_QUERIES = (
    "how do I reset my password for the {n}th time",
    "what is the refund policy for order {n}",
    "can you write me a poem about cheese number {n}",
    "which plan includes {n} seats and single sign-on",
    "who won the football match on day {n}",
    "how long does shipping to zone {n} take",
)


def _models(kb: str) -> tuple[Any, Any, dict[str, Any]]:
    """Two small real models (A, B) for the default encoder, fitted on synthetic vectors."""
    import numpy as np

    from sidecar.encoders import DEFAULT_ENCODER
    from sidecar.scoring import fit_ood_model

    enc = {"name": DEFAULT_ENCODER, "dim": 384}
    out = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)

        def unit(n: int, shift: float, rng: Any = rng) -> Any:
            x = rng.standard_normal((n, 384)) + shift
            return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

        out.append(
            fit_ood_model(
                kb=kb,
                encoder=enc,
                kb_embeddings=unit(300, 0.3),
                id_embeddings=unit(200, 0.3),
                ood_embeddings=unit(200, 0.0),
                detector="combined",
                criterion="pvalue",
                m=13,
                seed=seed,
            )
        )
    return model_to_artifact(out[0]), model_to_artifact(out[1]), enc


async def run_swap(
    brokers: str,
    redis_url: str,
    *,
    rate: float,
    duration: float,
    replicas: int,
    partitions: int,
    swap_window: float,
    logs: Path,
    free_port: Any,
) -> dict[str, Any]:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from tqdm import tqdm

    from model_store import RedisStore
    from sidecar.local import EmbeddedBroker, WorkerProcess
    from sidecar.settings import load_settings
    from sidecar.stream import bootstrap_servers, ensure_topics

    kb = "bench"
    base = load_settings(
        kafka={
            "brokers": brokers,
            "app_id": f"bench-swap-{free_port()}",
            "queries_topic": _TOPICS[0],
            "verdicts_topic": _TOPICS[1],
            "dlq_topic": _TOPICS[2],
            "partitions": partitions,
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        },
        redis={"url": redis_url},
        store={"backend": "redis", "poll_interval_s": 1.0},
        scoring={"kbs": (kb,), "default_kb": kb},
    )
    await ensure_topics(base)
    logs.mkdir(parents=True, exist_ok=True)
    art_a, art_b, enc = await asyncio.to_thread(_models, kb)
    store = RedisStore(redis_url, prefix=base.redis.key_prefix)
    va, vb = store.put(art_a), store.put(art_b)
    store.promote(kb, va)

    workers = [
        WorkerProcess(
            base.model_copy(update={"web": base.web.model_copy(update={"port": free_port()})}),
            log_path=logs / f"worker-{i}.log",
            extra_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        ).start()
        for i in range(replicas)
    ]
    bootstrap = bootstrap_servers(brokers)
    consumer = AIOKafkaConsumer(
        _TOPICS[1],
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    verdicts: list[dict[str, Any]] = []
    try:
        for w in workers:
            await asyncio.to_thread(w.wait_ready, 300.0)
        owners = await _stable_assignment(workers, partitions)
        await consumer.start()
        await producer.start()
        reader = asyncio.create_task(_read(consumer, verdicts))
        sent: dict[str, tuple[float, int]] = {}
        t_promote, t_rollback = duration / 3, 2 * duration / 3
        marks: dict[str, float] = {}
        install: dict[str, dict[str, float | None]] = {}
        watchers: list[asyncio.Task[None]] = []
        t0 = time.time()
        n_total = int(rate * duration)
        with tqdm(total=n_total, desc="queries", unit="q") as bar:
            for i in range(n_total):
                at = t0 + i / rate
                now = time.time()
                if now < at:
                    await asyncio.sleep(at - now)
                for name, t_at, act in (("promote", t_promote, "p"), ("rollback", t_rollback, "r")):
                    if name not in marks and time.time() - t0 >= t_at:
                        ev = (
                            await asyncio.to_thread(store.promote, kb, vb)
                            if act == "p"
                            else await asyncio.to_thread(store.rollback, kb)
                        )
                        marks[name] = ev.ts if ev else time.time()
                        target = vb if act == "p" else va
                        install[name] = {}
                        watchers.append(
                            asyncio.create_task(
                                _watch_install(workers, target, marks[name], install[name])
                            )
                        )
                qid = f"q{i:07d}"
                doc = {"id": qid, "kb": kb, "text": _QUERIES[i % len(_QUERIES)].format(n=i)}
                fut = await producer.send(_TOPICS[0], json.dumps(doc).encode(), key=qid.encode())
                md = await fut
                sent[qid] = (time.time(), md.partition)
                bar.update()
        deadline = time.time() + 60
        while len({v["id"] for v in verdicts}) < len(sent) and time.time() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # let late duplicates show up
        reader.cancel()
        await asyncio.gather(*watchers)
    finally:
        await producer.stop()
        await consumer.stop()
        for w in workers:
            await asyncio.to_thread(w.terminate)
        store.close()
    return swap_report(
        sent=sent,
        verdicts=verdicts,
        marks=marks,
        install=install,
        owners=owners,
        versions={"A": va, "B": vb},
        swap_window=swap_window,
        config={
            "rate_qps": rate,
            "duration_s": duration,
            "replicas": replicas,
            "partitions": partitions,
            "encoder": enc["name"],
            "detector": "combined",
            "batch_max": base.scoring.batch_max,
            "batch_timeout_ms": base.scoring.batch_timeout_ms,
            "poll_interval_s": base.store.poll_interval_s,
            "swap_window_s": swap_window,
        },
    )


async def _stable_assignment(workers: list[Any], partitions: int) -> dict[int, int]:
    """Partition -> replica index, once every partition is owned by exactly one replica."""
    import asyncio

    deadline = time.time() + 120
    while time.time() < deadline:
        owners: dict[int, int] = {}
        clash = False
        for i, w in enumerate(workers):
            try:
                _, doc = await asyncio.to_thread(w.get, "/readyz")
            except Exception:
                doc = {}
            assigned = (
                doc.get("checks", {}).get("partitions", {}).get("assigned") or []
                if isinstance(doc, dict)
                else []
            )
            for p in assigned:
                clash = clash or p in owners
                owners[p] = i
        if not clash and len(owners) == partitions:
            return owners
        await asyncio.sleep(0.5)
    return {}


async def _watch_install(
    workers: list[Any], version: str, since: float, out: dict[str, float | None]
) -> None:
    """Record, per replica, when ``/models`` shows ``version`` loaded (ms after ``since``)."""
    import asyncio

    pending = dict(enumerate(workers))
    deadline = time.time() + 30
    while pending and time.time() < deadline:
        for i, w in list(pending.items()):
            try:
                _, doc = await asyncio.to_thread(w.get, "/models")
                m = next(iter(doc["models"].values()))
            except Exception:
                continue
            if m and m["version"] == version:
                out[f"replica-{i}"] = round((m["loaded_at"] - since) * 1000, 1)
                del pending[i]
        await asyncio.sleep(0.05)
    for i in pending:
        out[f"replica-{i}"] = None


async def _read(consumer: Any, out: list[dict[str, Any]]) -> None:
    async for msg in consumer:
        try:
            doc = json.loads(msg.value)
        except ValueError:
            continue
        doc["_partition"], doc["_offset"] = msg.partition, msg.offset
        out.append(doc)
