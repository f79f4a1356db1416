"""Run the demo: the streaming sidecar end to end on one machine (``sidecar demo``).

:func:`run_demo` starts an embedded broker, picks the model store (Redis when one
answers, else a directory store), starts ``sidecar worker`` as a child process, trains
and publishes the demo KB model, streams the labelled demo queries plus two malformed
records, and collects every verdict and dead letter. Everything it started is stopped by
pid before it returns. What it has to say goes to callbacks: the caller prints.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sidecar.errors import ConfigError
from sidecar.local._demo import (
    demo_data,
    demo_multilingual_queries,
    publish,
    train_demo_model,
    training_half,
)
from sidecar.local._embedded import EmbeddedBroker, free_port
from sidecar.local._worker import WorkerProcess
from sidecar.settings import Settings, load_settings, mask_url_password

# Records the worker must dead-letter: bytes that are not UTF-8, and an empty text.
_BAD_SAMPLES: list[tuple[str, bytes]] = [
    ("bad-1", b"\xff\xfe not utf-8"),
    ("bad-2", b'{"id": "bad-2", "text": ""}'),
]

Rows = list[dict[str, Any]]


class ProgressBar(Protocol):
    """Told of each verdict or dead letter collected (a tqdm bar has ``update``)."""

    def update(self, n: int = 1) -> Any: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs on: ``redis_url`` None uses the settings' Redis and falls back
    to a directory store when it does not answer (a URL given must answer);
    ``directory_store`` skips Redis; ``limit`` streams only the first N demo queries;
    ``timeout_s`` bounds the waits for the worker and the verdicts; ``workdir`` keeps the
    worker log and directory store (None: a new temp dir); ``encoder`` is the worker's
    ``scoring.encoder`` (None: the settings'); ``multilingual`` adds the multilingual
    turn, the clinic questions asked in five more languages."""

    redis_url: str | None = None
    directory_store: bool = False
    limit: int | None = None
    timeout_s: float = 180.0
    workdir: Path | None = None
    encoder: str | None = None
    multilingual: bool = False


@dataclass(frozen=True)
class DemoRun:
    """The verdicts (sorted by query id; each with ``text``, ``expected`` label and
    ``seen``: trained on) and dead letters of a demo, and where its model stayed:
    ``redis_url`` for a Redis store (None for a directory store) or ``store_dir``."""

    rows: Rows
    dead: Rows
    redis_url: str | None
    store_dir: Path


def run_demo(
    base: Settings,
    cfg: DemoConfig,
    *,
    say: Callable[[str], None] = lambda _line: None,
    bar: Callable[[int], AbstractContextManager[ProgressBar]] | None = None,
    show: Callable[[Rows, Rows], None] | None = None,
) -> DemoRun:
    """Run the demo on ``base`` settings, as ``cfg`` says.

    ``say`` gets each status line (the store, the broker, the worker, the model ...);
    ``bar(total)`` makes the progress bar of the verdicts to collect; ``show(rows, dead)``
    is called with the verdicts while the worker still runs, before it is stopped.
    Raises ConfigError, before anything is started or created, when the Redis of an
    explicit ``cfg.redis_url`` does not answer.
    """
    url = base.redis.url if cfg.redis_url is None else cfg.redis_url
    problem = None if cfg.directory_store else redis_problem(url, base)
    if problem and cfg.redis_url is not None:
        # Only the settings' URL falls back to the directory store quietly: one given
        # explicitly is meant to be used. Checked before anything is started or created.
        raise ConfigError(
            f"--redis-url {mask_url_password(url) or repr(url)}: {problem} "
            "(pass --directory-store to run without Redis)"
        )
    use_redis = not cfg.directory_store and problem is None
    work = cfg.workdir or Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    say(
        f"model store: Redis at {mask_url_password(url)}"
        if use_redis
        else f"model store: directory {work / 'store'}"
    )
    with EmbeddedBroker() as broker:
        pid = broker.proc.pid if broker.proc else "?"
        say(f"broker: embedded Tansu on {broker.bootstrap} (pid {pid})")
        settings = _demo_settings(broker, url, use_redis, work, cfg.encoder)
        from sidecar.stream import ensure_topics

        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, log_path=work / "worker.log")
        worker.start()  # loads its encoder while this process trains the model
        say(f"worker: pid {worker.pid}, HTTP on {worker.base_url}, log {work / 'worker.log'}")
        try:
            version, model = _train_and_publish(settings, say)
            say(f"model: {model.detector_name}, version {version}, threshold {model.threshold:.4f}")
            say("waiting for the worker to be ready ...")
            worker.wait_ready(cfg.timeout_s)
            queries = _queries(cfg.limit, cfg.multilingual)
            rows, dead = asyncio.run(
                _stream(settings, broker.bootstrap, queries, cfg.timeout_s, bar)
            )
            if show is not None:
                show(rows, dead)
        finally:
            code = worker.terminate()
            say(f"worker stopped (exit code {code}); broker stopping")
    return DemoRun(rows, dead, url if use_redis else None, work / "store")


def _demo_settings(
    broker: EmbeddedBroker, url: str, use_redis: bool, work: Path, encoder: str | None = None
) -> Settings:
    """The worker's and the demo's settings: the embedded broker, the demo's key prefix
    (and ``encoder`` as ``scoring.encoder`` when given)."""
    return load_settings(
        **({"scoring": {"encoder": encoder}} if encoder else {}),
        kafka={
            "brokers": broker.url,
            "app_id": "sidecar-demo",
            "route_topics": True,
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
            "partitions": 2,
        },
        redis={"url": url, "key_prefix": "oodsc-demo"},
        store={
            "backend": "redis" if use_redis else "directory",
            "directory": work / "store",
            "poll_interval_s": 1.0,
        },
        web={"host": "127.0.0.1", "port": free_port()},
    )


def redis_problem(url: str, settings: Settings) -> str | None:
    """None when a Redis answers at ``url``, else why not, in a few words."""
    import redis

    from model_store import RedisStore, StoreMisconfigured

    try:  # the store's own URL check: redis-py reads a URL without a host as localhost
        RedisStore(url).close()
    except StoreMisconfigured as exc:  # "invalid Redis URL <masked>: why"
        return f"not a usable Redis URL ({str(exc).split(': ', 1)[-1]})"

    pw = settings.redis.password
    try:
        client = redis.Redis.from_url(
            url,
            password=pw.get_secret_value() if pw else None,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
        )
    except (redis.RedisError, OSError, ValueError) as exc:  # e.g. no redis:// scheme
        return f"not a usable Redis URL ({exc or type(exc).__name__})"
    try:
        if client.ping():
            return None
        return "Redis did not answer the ping"
    except (redis.RedisError, OSError, ValueError) as exc:
        return f"no Redis answers ({exc or type(exc).__name__})"
    finally:
        client.close()


def _train_and_publish(settings: Settings, say: Callable[[str], None]) -> tuple[str, Any]:
    from sidecar.encoders import load_encoder
    from sidecar.persistence import open_store

    say(f"training the demo KB model (loading the encoder {settings.scoring.encoder}) ...")
    encoder = load_encoder(settings.scoring)
    model = train_demo_model(encoder, kb=settings.scoring.default_kb)
    store = open_store(settings)
    try:
        return publish(store, model), model
    finally:
        store.close()


def _queries(limit: int | None, multilingual: bool) -> dict[str, dict[str, Any]]:
    """The queries to stream by id: the labelled demo queries (the first ``limit``), then
    with ``multilingual`` the multilingual turn; each with its ``text``, ``expected``
    label, whether it was ``seen`` in training and, for the turn, its ``lang``."""
    d = demo_data()
    labelled = d.labelled()[:limit] if limit else d.labelled()
    seen = set(training_half(d.id_queries)) | set(training_half(d.ood_queries))
    out = {
        f"demo-{i:03d}": {"text": text, "expected": label, "seen": text in seen}
        for i, (text, label) in enumerate(labelled)
    }
    if multilingual:
        for i, row in enumerate(demo_multilingual_queries()):
            out[f"lang-{i:03d}"] = {
                "text": row["text"],
                "expected": row["expected"],
                "seen": False,
                "lang": row["lang"],
            }
    return out


async def _stream(
    settings: Settings,
    bootstrap: str,
    queries: dict[str, dict[str, Any]],
    timeout_s: float,
    bar: Callable[[int], AbstractContextManager[ProgressBar]] | None,
) -> tuple[Rows, Rows]:
    """Produce the demo queries, collect their verdicts and dead letters."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    k = settings.kafka
    consumer = AIOKafkaConsumer(
        k.verdicts_topic,
        k.dlq_topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=settings.kafka.fetch_max_wait_ms,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    rows: dict[str, dict[str, Any]] = {}
    dead: Rows = []
    make_bar = bar or (lambda _total: nullcontext(_NoBar()))
    try:
        expected = queries
        for qid, query in queries.items():
            doc = {
                "id": qid,
                "text": query["text"],
                "kb": settings.scoring.default_kb,
                "ts": int(time.time() * 1000),
            }
            await producer.send(k.queries_topic, json.dumps(doc).encode(), key=qid.encode())
        for key, raw in _BAD_SAMPLES:
            await producer.send(k.queries_topic, raw, key=key.encode())
        await producer.flush()
        with make_bar(len(expected) + len(_BAD_SAMPLES)) as shown:
            async with asyncio.timeout(timeout_s):
                while len(rows) < len(expected) or len(dead) < len(_BAD_SAMPLES):
                    for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                        for m in msgs:
                            doc = json.loads(m.value)
                            if tp.topic == k.dlq_topic:
                                dead.append(doc)
                                shown.update(1)
                            elif doc["id"] in expected and doc["id"] not in rows:
                                rows[doc["id"]] = {**doc, **expected[doc["id"]]}
                                shown.update(1)
    finally:
        await producer.stop()
        await consumer.stop()
    return [rows[q] for q in sorted(rows)], dead
