"""A worker whose encoder is a real embeddings server, end to end: real broker, real
redis-server, the real default encoder behind the OpenAI ``/v1/embeddings`` protocol.

The worker runs as ``python -m sidecar worker`` (settings from the environment, the API
key from a secret file) and is stopped by pid. The server starts closed, then serves,
fails, slows down and serves other weights under the same name; every phase waits on
verdicts read from the broker or on ``/readyz``, each with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess, free_port
from sidecar.settings import Settings, load_settings
from sidecar.stream import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WAIT_S = 120.0  # generous: CI machines are shared


@pytest.fixture(scope="module")
def store_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as r:
        yield r


@pytest.fixture(scope="module")
def local(local_encoder: Any) -> Any:
    return local_encoder


@pytest.fixture(scope="module")
def local_model(local: Any) -> Any:
    """The demo model trained with the local encoder (torch, in this process), with the
    probe embeddings `sidecar train` records."""
    import dataclasses

    from sidecar.encoders import embed_probes
    from sidecar.local import train_demo_model
    from sidecar.scoring import PROBE_TEXTS

    model = train_demo_model(local)
    probes = embed_probes(local.encode)
    return dataclasses.replace(model, encoder_probes=probes, encoder_probe_texts=PROBE_TEXTS)


@pytest.fixture
def server(embedding_server: Any) -> Iterator[Any]:
    embedding_server.reset()
    yield embedding_server
    embedding_server.reset()


def worker_settings(broker: EmbeddedBroker, redis: EmbeddedRedis, server: Any) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        kafka={
            "brokers": broker.url,
            "app_id": f"http-{tag}",
            "queries_topic": f"q-{tag}",
            "verdicts_topic": f"v-{tag}",
            "dlq_topic": f"dlq-{tag}",
            "id_topic": f"id-{tag}",
            "ood_topic": f"ood-{tag}",
            "partitions": 2,
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        },
        redis={"url": redis.url, "key_prefix": f"http{tag}"},
        store={"backend": "redis", "poll_interval_s": 1.0},
        scoring={"encoder_backend": "http", "batch_max": 16, "batch_timeout_ms": 20},
        embedding_server={
            "base_url": server.base_url,
            "timeout_s": 1.0,
            "deadline_s": 2.5,
            "backoff_s": 0.05,
            "backoff_max_s": 0.5,
            "max_batch": 8,
            "check_interval_s": 1.0,
        },
        web={"host": "127.0.0.1", "port": free_port()},
    )


def start_worker(s: Settings, server: Any, tmp_path: Path) -> WorkerProcess:
    """The worker, with the server's key as the secret file embedding_server__api_key."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "embedding_server__api_key").write_text(server.api_key + "\n")
    env = {"SIDECAR_SECRETS_DIR": str(secrets), "OMP_NUM_THREADS": "1"}
    return WorkerProcess(s, log_path=tmp_path / "worker.log", extra_env=env).start()


class Stream:
    """Queries in; verdicts and dead letters read as they come, with one consumer."""

    def __init__(self, bootstrap: str, s: Settings) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        k = s.kafka
        self.topics = (k.queries_topic, k.verdicts_topic, k.dlq_topic)
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(
            k.verdicts_topic,
            k.dlq_topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            group_id=None,
        )
        self.verdicts: dict[str, dict[str, Any]] = {}
        self.dead: list[dict[str, Any]] = []

    async def __aenter__(self) -> Stream:
        await self.producer.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()
        await self.consumer.stop()

    async def send(self, texts: list[str], prefix: str) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(len(texts))]
        for qid, text in zip(ids, texts, strict=True):
            value = json.dumps({"id": qid, "text": text}).encode()
            await self.producer.send_and_wait(self.topics[0], value, key=qid.encode())
        return ids

    async def answers(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Each id's verdict, waiting until all have one (a dead letter fails the test)."""
        async with asyncio.timeout(WAIT_S):
            while not all(i in self.verdicts for i in ids):
                for tp, msgs in (await self.consumer.getmany(timeout_ms=500)).items():
                    for m in msgs:
                        doc = json.loads(m.value)
                        if tp.topic == self.topics[2]:
                            self.dead.append(doc)
                        else:
                            assert doc["id"] not in self.verdicts, f"two verdicts for {doc['id']}"
                            self.verdicts[doc["id"]] = doc
                assert self.dead == [], self.dead
        return {i: self.verdicts[i] for i in ids}


async def readyz_until(w: WorkerProcess, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll ``/readyz`` until its document satisfies ``holds``; that document."""
    import httpx

    last: Any = None
    async with asyncio.timeout(WAIT_S):
        while True:
            assert w.proc is not None and w.proc.poll() is None, w.log_tail()
            try:
                _, last = await asyncio.to_thread(w.get, "/readyz")
                if isinstance(last, dict) and holds(last):
                    return last
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)


def encoder_check(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["checks"]["encoder"])


def publish(s: Settings, model: Any, *, promote: bool = True) -> str:
    from sidecar.persistence import model_to_artifact, open_store

    store = open_store(s)
    try:
        version = store.put(model_to_artifact(model))
        if promote:
            store.promote(model.kb, version)
        return version
    finally:
        store.close()


def demo_texts(start: int, n: int) -> tuple[list[str], list[str]]:
    """``n`` labelled demo queries from ``start``: texts and expected verdicts."""
    from sidecar.local import demo_data

    labelled = demo_data().labelled()
    pairs = [labelled[(start + i) % len(labelled)] for i in range(n)]
    return [t for t, _ in pairs], [e for _, e in pairs]


def assert_scored_as_locally(
    answers: dict[str, dict[str, Any]], texts: list[str], model: Any, local: Any
) -> None:
    """Every verdict came from ``model`` with the server's embeddings, and equals what the
    local encoder gives within float tolerance."""
    expected = np.asarray(model.score(local.encode(texts)), dtype=np.float64)
    got = [answers[i] for i in sorted(answers, key=lambda i: int(i.rsplit("-", 1)[1]))]
    assert all(v.get("reason") is None for v in got), got
    scores = np.array([v["score"] for v in got], dtype=np.float64)
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5)
    margin = 1e-4 * max(1.0, abs(model.threshold))
    for v, e in zip(got, expected, strict=True):
        if abs(e - model.threshold) > margin:
            assert v["verdict"] == ("OOD" if e > model.threshold else "ID")


async def test_a_worker_waits_for_the_server_retries_and_follows_fail_mode(
    broker: EmbeddedBroker,
    store_redis: EmbeddedRedis,
    server: Any,
    local: Any,
    local_model: Any,
    tmp_path: Path,
) -> None:
    s = worker_settings(broker, store_redis, server)
    await ensure_topics(s)
    version = publish(s, local_model)  # trained locally: served through the server
    server.control(serving=False)
    w = start_worker(s, server, tmp_path)
    try:
        async with Stream(broker.bootstrap, s) as stream:
            # 1. The server is down at start: not ready, nothing consumed; queries wait.
            doc = await readyz_until(
                w, lambda d: encoder_check(d).get("server", {}).get("reachable") is False
            )
            assert doc["ready"] is False and encoder_check(doc)["ok"] is False
            assert "unreachable" in encoder_check(doc)["server"]["error"]
            assert server.api_key not in json.dumps(doc)
            texts, _ = demo_texts(0, 12)
            ids = await stream.send(texts, "a")
            assert w.get("/healthz")[1]["batches"] == 0

            # It comes up: ready, and the queries that waited are scored by the model.
            server.control(serving=True)
            doc = await readyz_until(w, lambda d: d["ready"])
            assert encoder_check(doc)["server"]["served_model"] == "all-MiniLM-L6-v2"
            answers = await stream.answers(ids)
            assert {v["model_version"] for v in answers.values()} == {version}
            assert_scored_as_locally(answers, texts, local_model, local)

            # 2. 429 (Retry-After) and 5xx answers are retried: every query is scored.
            server.reset()
            faults = [{"status": 429, "retry_after": "1"}, {"status": 500}, {"status": 502}]
            server.control(faults=faults)
            texts, _ = demo_texts(12, 6)
            answers = await stream.answers(await stream.send(texts, "b"))
            assert_scored_as_locally(answers, texts, local_model, local)
            statuses = [r["status"] for r in server.requests()]
            assert statuses[:3] == [429, 500, 502] and 200 in statuses[3:]

            # 3. Too slow for the deadline: the batch follows fail_mode (closed: OOD),
            # every query answered, none lost, none dead-lettered; not ready meanwhile.
            server.control(delay_s=4.0)
            texts, _ = demo_texts(18, 5)
            answers = await stream.answers(await stream.send(texts, "c"))
            assert {(v["verdict"], v["reason"]) for v in answers.values()} == {
                ("OOD", "encoder_unavailable")
            }
            assert all(v["model_version"] is None for v in answers.values())
            doc = await readyz_until(w, lambda d: not encoder_check(d)["ok"])
            server.control(delay_s=0.0)
            await readyz_until(w, lambda d: d["ready"])
            texts, _ = demo_texts(23, 4)
            answers = await stream.answers(await stream.send(texts, "d"))
            assert_scored_as_locally(answers, texts, local_model, local)
    finally:
        w.terminate()
    assert w.proc is not None and w.proc.returncode == 0, w.log_tail()
    assert server.api_key not in (tmp_path / "worker.log").read_text()


async def test_a_model_trained_through_the_server_serves_and_other_weights_are_refused(
    broker: EmbeddedBroker,
    store_redis: EmbeddedRedis,
    server: Any,
    local: Any,
    local_model: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sidecar.cli import main
    from sidecar.persistence import open_store

    s = worker_settings(broker, store_redis, server)
    await ensure_topics(s)
    first = publish(s, local_model)
    w = start_worker(s, server, tmp_path)
    try:
        async with Stream(broker.bootstrap, s) as stream:
            await readyz_until(w, lambda d: d["ready"])

            # `sidecar train --encoder-url`: embedded by the same server, stored unpromoted.
            monkeypatch.setenv("SIDECAR_REDIS__URL", s.redis.url)
            monkeypatch.setenv("SIDECAR_REDIS__KEY_PREFIX", s.redis.key_prefix)
            monkeypatch.setenv("SIDECAR_EMBEDDING_SERVER__API_KEY", server.api_key)
            out = tmp_path / "trained"
            t0 = time.perf_counter()
            args = ["train", "--encoder-url", server.base_url, "--out", str(out)]
            args += ["--detector", "knn", "--m", "8", "--publish", "--no-promote"]
            args += ["--cache-dir", str(tmp_path / "cache"), "--no-report", "--no-progress"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            train_s = time.perf_counter() - t0
            assert any(r.get("n") for r in server.requests()), "training did not use the server"
            store = open_store(s)
            try:
                trained = [v for v in store.versions("default") if v != first]
                assert len(trained) == 1
                version = trained[0]
                artifact = store.get("default", version)
            finally:
                store.close()
            assert artifact.encoder == {"name": "all-MiniLM-L6-v2", "dim": 384}

            # The server now runs other weights under the same name: the worker stops
            # embedding with it (fail_mode), and the new version is refused at install.
            server.control(weights="wrong")
            doc = await readyz_until(w, lambda d: encoder_check(d)["server"]["suspended"])
            assert "no longer match" in encoder_check(doc)["server"]["suspended"]
            texts, _ = demo_texts(0, 4)
            answers = await stream.answers(await stream.send(texts, "e"))
            assert {v["reason"] for v in answers.values()} == {"encoder_unavailable"}
            _promote(s, version)
            status = await _models_until(
                w, lambda st: str(st["default"]["last_error"]).startswith(version)
            )
            assert "probe" in status["default"]["last_error"]
            assert status["default"]["version"] == first

            # Its own weights again: resumed, and the refused version is installed.
            server.control(weights="real")
            doc = await readyz_until(
                w, lambda d: d["ready"] and d["checks"]["models"]["active"]["default"] == version
            )
            texts, _ = demo_texts(30, 6)
            answers = await stream.answers(await stream.send(texts, "f"))
            assert {v["model_version"] for v in answers.values()} == {version}
            from sidecar.persistence import model_from_artifact

            assert_scored_as_locally(answers, texts, model_from_artifact(artifact), local)
    finally:
        w.terminate()
    print(f"sidecar train through the server took {train_s:.1f} s")


def _promote(s: Settings, version: str) -> None:
    from sidecar.persistence import open_store

    store = open_store(s)
    try:
        store.promote("default", version)
    finally:
        store.close()


async def _models_until(
    w: WorkerProcess, holds: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        while True:
            _, doc = await asyncio.to_thread(w.get, "/models")
            if holds(doc["status"]):
                return dict(doc["status"])
            await asyncio.sleep(0.2)
