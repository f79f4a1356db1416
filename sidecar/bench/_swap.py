"""The live-swap benchmark's run: the embedded broker, a private redis-server, N real
``sidecar worker`` replicas in one consumer group, a steady query stream, a promotion a
third of the way in and a rollback two thirds in; every verdict is read back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.bench._report_file import write_report
from sidecar.bench._swap_report import aggregate_runs, swap_report
from sidecar.persistence import model_to_artifact

_KB = "bench"
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


@dataclass(frozen=True)
class SwapBenchConfig:
    """The load and the replicas of ``sidecar bench swap``, and where its report goes.

    ``rate``: queries per second for ``duration`` seconds; the promotion comes at a third
    of it, the rollback at two thirds. ``replicas`` workers share ``partitions``.
    ``swap_window``: seconds after a promotion or rollback counted as "during swap".
    ``log_dir``: where the workers' logs are kept (None: a fresh temporary folder).
    ``repeat``: independent runs (fresh broker, Redis and workers).
    """

    json_out: Path
    rate: float = 20.0
    duration: float = 30.0
    replicas: int = 2
    partitions: int = 4
    swap_window: float = 3.0
    log_dir: Path | None = None
    repeat: int = 1


def run_swap_bench(
    config: SwapBenchConfig, *, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Each run on its own embedded broker and private redis-server, then the runs
    folded by :func:`aggregate_runs`; writes the report and returns it. ``echo`` gets a
    line per run."""
    import tempfile

    from sidecar.local import EmbeddedBroker, EmbeddedRedis

    c = config
    logs = c.log_dir or Path(tempfile.mkdtemp(prefix="bench-swap-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(c.repeat):
        with EmbeddedBroker() as broker, EmbeddedRedis() as redis:
            run = asyncio.run(_run_swap(c, broker.url, redis.url, logs / f"run-{i}"))
        runs.append(run)
        echo(
            f"run {i + 1}/{c.repeat}: lost {run['lost']}, duplicates {run['duplicates']}, "
            f"regressions {run['version_regressions']}, swap max {run['swap_latency_ms']['max']} ms"
        )
    report = aggregate_runs(runs)
    write_report(c.json_out, report)
    return report


def _swap_settings(c: SwapBenchConfig, brokers: str, redis_url: str) -> Any:
    """The replicas' settings (each gets its own web port on top): one consumer group
    on the benchmark's topics, models in Redis, polled every second."""
    from sidecar.local import EmbeddedBroker, free_port
    from sidecar.settings import load_settings

    return load_settings(
        kafka={
            "brokers": brokers,
            "app_id": f"bench-swap-{free_port()}",
            "queries_topic": _TOPICS[0],
            "verdicts_topic": _TOPICS[1],
            "dlq_topic": _TOPICS[2],
            "partitions": c.partitions,
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        },
        redis={"url": redis_url},
        store={"backend": "redis", "poll_interval_s": 1.0},
        scoring={"kbs": (_KB,), "default_kb": _KB},
    )


async def _run_swap(c: SwapBenchConfig, brokers: str, redis_url: str, logs: Path) -> dict[str, Any]:
    """One run: publish A and B, start the replicas, stream with a promotion and a
    rollback, read every verdict back; the run's report."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from model_store import RedisStore
    from sidecar.local import WorkerProcess, free_port
    from sidecar.stream import bootstrap_servers, ensure_topics

    base = _swap_settings(c, brokers, redis_url)
    await ensure_topics(base)
    logs.mkdir(parents=True, exist_ok=True)
    art_a, art_b, enc = await asyncio.to_thread(_models, _KB)
    store = RedisStore(redis_url, prefix=base.redis.key_prefix)
    va, vb = store.put(art_a), store.put(art_b)
    store.promote(_KB, va)

    workers = [
        WorkerProcess(
            base.model_copy(update={"web": base.web.model_copy(update={"port": free_port()})}),
            log_path=logs / f"worker-{i}.log",
            extra_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        ).start()
        for i in range(c.replicas)
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
        owners = await _stable_assignment(workers, c.partitions)
        await consumer.start()
        await producer.start()
        reader = asyncio.create_task(_read(consumer, verdicts))
        stream = _Stream(c, store, workers, {"A": va, "B": vb})
        await stream.run(producer)
        deadline = time.time() + 60
        while len({v["id"] for v in verdicts}) < len(stream.sent) and time.time() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # let late duplicates show up
        reader.cancel()
        await asyncio.gather(*stream.watchers)
    finally:
        await producer.stop()
        await consumer.stop()
        for w in workers:
            await asyncio.to_thread(w.terminate)
        store.close()
    return swap_report(
        sent=stream.sent,
        verdicts=verdicts,
        marks=stream.marks,
        install=stream.install,
        owners=owners,
        versions={"A": va, "B": vb},
        swap_window=c.swap_window,
        config={
            "rate_qps": c.rate,
            "duration_s": c.duration,
            "replicas": c.replicas,
            "partitions": c.partitions,
            "encoder": enc["name"],
            "detector": "combined",
            "batch_max": base.scoring.batch_max,
            "batch_timeout_ms": base.scoring.batch_timeout_ms,
            "poll_interval_s": base.store.poll_interval_s,
            "swap_window_s": c.swap_window,
        },
    )


class _Stream:
    """The steady query stream, with B promoted a third of the way in and rolled back
    two thirds in; records when each query was sent (and to which partition), when each
    swap happened, and when each replica installed it."""

    def __init__(
        self, c: SwapBenchConfig, store: Any, workers: list[Any], versions: dict[str, str]
    ) -> None:
        self.c, self.store, self.workers, self.versions = c, store, workers, versions
        self.sent: dict[str, tuple[float, int]] = {}
        self.marks: dict[str, float] = {}
        self.install: dict[str, dict[str, float | None]] = {}
        self.watchers: list[asyncio.Task[None]] = []

    async def run(self, producer: Any) -> None:
        from tqdm import tqdm

        rate, duration = self.c.rate, self.c.duration
        t_promote, t_rollback = duration / 3, 2 * duration / 3
        t0 = time.time()
        n_total = int(rate * duration)
        with tqdm(total=n_total, desc="queries", unit="q") as bar:
            for i in range(n_total):
                at = t0 + i / rate
                now = time.time()
                if now < at:
                    await asyncio.sleep(at - now)
                for name, t_at in (("promote", t_promote), ("rollback", t_rollback)):
                    if name not in self.marks and time.time() - t0 >= t_at:
                        await self._swap(name)
                qid = f"q{i:07d}"
                doc = {"id": qid, "kb": _KB, "text": _QUERIES[i % len(_QUERIES)].format(n=i)}
                fut = await producer.send(_TOPICS[0], json.dumps(doc).encode(), key=qid.encode())
                md = await fut
                self.sent[qid] = (time.time(), md.partition)
                bar.update()

    async def _swap(self, name: str) -> None:
        """Promote B (or roll back to A) now, and start watching the replicas install it."""
        store, va, vb = self.store, self.versions["A"], self.versions["B"]
        ev = (
            await asyncio.to_thread(store.promote, _KB, vb)
            if name == "promote"
            else await asyncio.to_thread(store.rollback, _KB)
        )
        self.marks[name] = ev.ts if ev else time.time()
        target = vb if name == "promote" else va
        self.install[name] = {}
        self.watchers.append(
            asyncio.create_task(
                _watch_install(self.workers, target, self.marks[name], self.install[name])
            )
        )


async def _stable_assignment(workers: list[Any], partitions: int) -> dict[int, int]:
    """Partition -> replica index, once every partition is owned by exactly one replica."""
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
