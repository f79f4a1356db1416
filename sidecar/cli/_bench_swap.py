"""``sidecar bench swap``: promote and roll back a model under a steady query stream.

Starts the embedded broker and a private redis-server, publishes model A, starts N
``sidecar worker`` replicas (child processes, one consumer group), streams queries at a
fixed rate, promotes model B a third of the way in and rolls back two thirds in, then
reads every verdict and reports loss, duplicates, version regressions, swap latency per
replica and the latency tail in steady state and around the swaps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import bench

TARGETS = {
    "lost": 0,
    "duplicates": 0,
    "version_regressions": 0,
    "swap_latency_ms": 1000.0,
    "p99_during_swap_over_steady": 2.0,
}
_TOPICS = ("q", "v", "dlq")
_QUERIES = (
    "how do I reset my password for the {n}th time",
    "what is the refund policy for order {n}",
    "can you write me a poem about cheese number {n}",
    "which plan includes {n} seats and single sign-on",
    "who won the football match on day {n}",
    "how long does shipping to zone {n} take",
)


@bench.command("swap")
@click.option(
    "--json",
    "json_out",
    type=click.Path(path_type=Path),
    required=True,
    help="Write the report here (e.g. tests/benchmarks/swap.json).",
)
@click.option(
    "--rate",
    default=20.0,
    show_default=True,
    type=click.FloatRange(1, 2000),
    help="Queries per second.",
)
@click.option(
    "--duration",
    default=30.0,
    show_default=True,
    type=click.FloatRange(6, 3600),
    help="Seconds of streaming; promote at 1/3, roll back at 2/3.",
)
@click.option(
    "--replicas",
    default=2,
    show_default=True,
    type=click.IntRange(1, 8),
    help="Worker processes in the consumer group.",
)
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--swap-window",
    default=3.0,
    show_default=True,
    type=float,
    help="Seconds after a promotion or rollback counted as 'during swap'.",
)
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep the workers' logs here [default: a temporary directory].",
)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Independent runs (fresh broker, Redis and workers); latencies are their medians.",
)
def swap_command(
    json_out: Path,
    rate: float,
    duration: float,
    replicas: int,
    partitions: int,
    swap_window: float,
    log_dir: Path | None,
    repeat: int,
) -> None:
    """Measure a live model swap through the real sidecar (embedded broker, real Redis)."""
    import asyncio
    import tempfile

    from sidecar.embedded import EmbeddedBroker, EmbeddedRedis, free_port

    logs = log_dir or Path(tempfile.mkdtemp(prefix="bench-swap-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(repeat):
        with EmbeddedBroker() as broker, EmbeddedRedis() as redis:
            run = asyncio.run(
                _run(
                    broker.url,
                    redis.url,
                    rate=rate,
                    duration=duration,
                    replicas=replicas,
                    partitions=partitions,
                    swap_window=swap_window,
                    logs=logs / f"run-{i}",
                    free_port=free_port,
                )
            )
        runs.append(run)
        click.echo(
            f"run {i + 1}/{repeat}: lost {run['lost']}, duplicates {run['duplicates']}, "
            f"regressions {run['version_regressions']}, swap max {run['swap_latency_ms']['max']} ms"
        )
    report = _aggregate(runs)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    s = report["swap_latency_ms"]
    click.echo(
        f"sent {report['sent']}, verdicts {report['verdicts']}, lost {report['lost']}, "
        f"duplicates {report['duplicates']}, regressions {report['version_regressions']}"
    )
    click.echo(
        f"swap latency max {s['max']} ms; p99 steady {report['p99_latency_ms_steady']} "
        f"ms, during swap {report['p99_latency_ms_during_swap']} ms"
    )
    click.echo(f"all targets met: {all(report['met'].values())}  ->  {json_out}")


def _models(kb: str) -> tuple[Any, Any, dict[str, Any]]:
    """Two small real models (A, B) for the default encoder, fitted on synthetic vectors."""
    import numpy as np

    from sidecar.scoring import DEFAULT_ENCODER, fit_ood_model

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
    return out[0].to_artifact(), out[1].to_artifact(), enc


async def _run(
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
    from sidecar.embedded import EmbeddedBroker
    from sidecar.settings import load_settings
    from sidecar.stream import WorkerProcess, bootstrap_servers, ensure_topics

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
    return _report(
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


def _p(values: list[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(values, q)), 1) if values else None


def _report(
    *,
    sent: dict[str, tuple[float, int]],
    verdicts: list[dict[str, Any]],
    marks: dict[str, float],
    install: dict[str, dict[str, float | None]],
    owners: dict[int, int],
    versions: dict[str, str],
    swap_window: float,
    config: dict[str, Any],
) -> dict[str, Any]:
    from collections import Counter

    counts = Counter(v["id"] for v in verdicts)
    # The versions a partition may go through, and from when: A, then B from the promotion,
    # then A again from the rollback. Anything else is a regression.
    inf = float("inf")
    epochs = [
        (versions["A"], -inf),
        (versions["B"], marks.get("promote", inf) * 1000),
        (versions["A"], marks.get("rollback", inf) * 1000),
    ]
    regressions, no_model = 0, 0
    by_part: dict[int, list[dict[str, Any]]] = {}
    for v in verdicts:
        by_part.setdefault(v["_partition"], []).append(v)
    for rows in by_part.values():
        e = 0
        for v in sorted(rows, key=lambda r: r["_offset"]):
            mv = v.get("model_version")
            if mv is None:
                no_model += 1
                continue
            ok = [
                j for j in range(e, len(epochs)) if epochs[j][0] == mv and epochs[j][1] <= v["ts"]
            ]
            if ok:
                e = ok[0]
            else:
                regressions += 1
    swap: dict[str, Any] = {}
    for name, target in (("promote", versions["B"]), ("rollback", versions["A"])):
        since = marks.get(name)
        per_replica: dict[str, float | None] = {}
        for i in sorted(set(owners.values())):
            parts = [p for p, o in owners.items() if o == i]
            firsts = [
                v["ts"]
                for v in verdicts
                if v["_partition"] in parts
                and v.get("model_version") == target
                and since
                and v["ts"] >= since * 1000
            ]
            per_replica[f"replica-{i}"] = (
                round(min(firsts) - since * 1000, 1) if firsts and since else None
            )
        vals = [x for x in per_replica.values() if x is not None]
        swap[name] = {
            "first_verdict_per_replica": per_replica,
            "installed_per_replica": install.get(name, {}),
            "max": max(vals) if vals and len(vals) == len(per_replica) else None,
        }
    maxes = [s["max"] for s in swap.values()]
    swap["max"] = max(maxes) if all(m is not None for m in maxes) else None

    windows = [(t, t + swap_window) for t in marks.values()]
    warm = min(sent.values())[0] + 2.0 if sent else 0.0
    first: dict[str, dict[str, Any]] = {}
    for v in verdicts:
        first.setdefault(v["id"], v)
    steady: list[float] = []
    during: list[float] = []
    for qid, (t_sent, _) in sent.items():
        fv = first.get(qid)
        if fv is None or fv.get("latency_ms") is None:
            continue
        if any(a <= t_sent <= b for a, b in windows):
            during.append(float(fv["latency_ms"]))
        elif t_sent >= warm:
            steady.append(float(fv["latency_ms"]))
    p99_s, p99_d = _p(steady, 99), _p(during, 99)
    lost = sum(1 for q in sent if q not in counts)
    dups = sum(c - 1 for c in counts.values() if c > 1)
    report: dict[str, Any] = {
        "bench": "swap",
        "config": config,
        "versions": versions,
        "partition_owner": {str(p): f"replica-{o}" for p, o in sorted(owners.items())},
        "sent": len(sent),
        "verdicts": len(verdicts),
        "lost": lost,
        "duplicates": dups,
        "version_regressions": regressions,
        "no_model_verdicts": no_model,
        "swap_latency_ms": swap,
        "p50_latency_ms_steady": _p(steady, 50),
        "p99_latency_ms_steady": p99_s,
        "p50_latency_ms_during_swap": _p(during, 50),
        "p99_latency_ms_during_swap": p99_d,
        "n_steady": len(steady),
        "n_during_swap": len(during),
        "targets": TARGETS,
    }
    report["met"] = {
        "lost": lost == TARGETS["lost"],
        "duplicates": dups == TARGETS["duplicates"],
        "version_regressions": regressions == TARGETS["version_regressions"],
        "swap_latency_ms": swap["max"] is not None and swap["max"] <= TARGETS["swap_latency_ms"],
        "p99_during_swap": (
            p99_s is not None
            and p99_d is not None
            and p99_d <= TARGETS["p99_during_swap_over_steady"] * p99_s
        ),
    }
    return report


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts summed over runs; latencies as the median over runs (each run kept in full)."""
    import statistics

    def med(key: str) -> float | None:
        vals = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    counts = ("sent", "verdicts", "lost", "duplicates", "version_regressions", "no_model_verdicts")
    swap_max = [r["swap_latency_ms"]["max"] for r in runs]
    known = [x for x in swap_max if x is not None]
    out: dict[str, Any] = {
        "bench": "swap",
        "config": {**runs[0]["config"], "repeat": len(runs)},
        **{k: sum(r[k] for r in runs) for k in counts},
        "swap_latency_ms": {
            # The median over runs of each run's max over replicas (promote and rollback).
            "max": round(statistics.median(known), 1) if len(known) == len(runs) else None,
            "worst": max(known) if known else None,
            "per_run": swap_max,
        },
        **{
            k: med(k)
            for k in (
                "p50_latency_ms_steady",
                "p99_latency_ms_steady",
                "p50_latency_ms_during_swap",
                "p99_latency_ms_during_swap",
            )
        },
        "targets": TARGETS,
    }
    p99_s, p99_d = out["p99_latency_ms_steady"], out["p99_latency_ms_during_swap"]
    out["met"] = {
        "lost": out["lost"] == TARGETS["lost"],
        "duplicates": out["duplicates"] == TARGETS["duplicates"],
        "version_regressions": out["version_regressions"] == TARGETS["version_regressions"],
        "swap_latency_ms": out["swap_latency_ms"]["max"] is not None
        and out["swap_latency_ms"]["max"] <= TARGETS["swap_latency_ms"],
        "p99_during_swap": p99_s is not None
        and p99_d is not None
        and p99_d <= TARGETS["p99_during_swap_over_steady"] * p99_s,
    }
    out["met_every_run"] = {k: all(r["met"][k] for r in runs) for k in out["met"]}
    out["runs"] = runs
    return out
