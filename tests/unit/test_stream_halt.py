"""The worker's halt on a batch it cannot score or deliver, with fakes of its own parts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from sidecar.errors import StreamHalted
from sidecar.settings import load_settings
from sidecar.stream import Runtime
from sidecar.stream._publish import Publisher, TopicNames


class Encoder:
    name, dim = "fake", 4

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32)


@dataclass(frozen=True)
class Model:
    threshold: float = 0.5
    detector_name: str = "fake"

    def score(self, E: np.ndarray) -> np.ndarray:
        return np.zeros(len(E))


@dataclass(frozen=True)
class Loaded:
    kb: str = "default"
    version: str = "v1"
    model: Model = field(default_factory=Model)
    loaded_at: float = 0.0


class Holder:
    """Per-record failures become dead letters inside the scorer; a holder that raises is
    the scorer itself failing."""

    def __init__(self) -> None:
        self.broken = False

    def snapshot(self) -> dict[str, Loaded]:
        if self.broken:
            raise MemoryError("out of memory")
        return {"default": Loaded()}


@dataclass
class Message:
    value: bytes
    offset: int
    topic: str = "q"
    partition: int = 0
    timestamp: float | None = None


@dataclass
class Event:
    message: Message
    acks: int = 0

    def ack(self) -> None:
        self.acks += 1


class Send:
    """The producer as the publisher sees it; refuses everything once ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[bytes] = []

    async def __call__(self, topic: str, key: bytes | None, value: bytes, headers: Any) -> Any:
        if self.down:
            raise ConnectionError("broker gone")
        self.sent.append(value)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def events(start: int, n: int) -> list[Event]:
    return [
        Event(Message(json.dumps({"id": f"q{i}", "text": "hello"}).encode(), i))
        for i in range(start, start + n)
    ]


def runtime() -> tuple[Runtime, Holder, Send, list[str]]:
    holder, send, reasons = Holder(), Send(), []
    rt = Runtime(load_settings(), encoder=Encoder(), holder=holder, store=None, watcher=None)
    rt.publisher = Publisher(send, TopicNames(verdicts="v", dlq="d"))
    rt.on_halt = reasons.append
    return rt, holder, send, reasons


async def test_an_undelivered_batch_halts_and_nothing_after_it_is_acked() -> None:
    rt, _, send, reasons = runtime()
    first, second, third = events(0, 3), events(3, 3), events(6, 3)
    await rt.handle(first)
    await rt.drain()
    assert [e.acks for e in first] == [1, 1, 1] and len(send.sent) == 3

    send.down = True
    await rt.handle(second)
    with pytest.raises(StreamHalted, match="not delivered"):
        await rt.drain()
    send.down = False  # even a broker that is back gets nothing more from this worker
    with pytest.raises(StreamHalted):
        await rt.handle(third)
    assert [e.acks for e in second + third] == [0] * 6
    assert len(send.sent) == 3
    assert len(reasons) == 1 and "broker gone" in reasons[0]
    assert "q[0]@3" in reasons[0]  # where the undelivered batch starts
    assert rt.halted == reasons[0]


async def test_a_batch_that_cannot_be_scored_halts_before_anything_is_sent() -> None:
    rt, holder, send, reasons = runtime()
    holder.broken = True
    batch = events(0, 2)
    with pytest.raises(StreamHalted, match="could not be scored"):
        await rt.handle(batch)
    await rt.drain()  # nothing in flight
    assert send.sent == [] and [e.acks for e in batch] == [0, 0]
    assert len(reasons) == 1 and "MemoryError" in reasons[0]


async def test_the_batch_in_flight_when_a_later_one_fails_is_still_delivered() -> None:
    rt, holder, send, reasons = runtime()
    first = events(0, 2)
    await rt.handle(first)  # published in the background
    holder.broken = True
    with pytest.raises(StreamHalted):
        await rt.handle(events(2, 2))
    await rt.drain()
    assert [e.acks for e in first] == [1, 1] and len(send.sent) == 2
    assert len(reasons) == 1


async def test_latency_metric_ends_where_the_verdicts_latency_does() -> None:
    # Both end at the hand-off to the producer; the wait for the broker's acks is the
    # produce stage. The metric used to be taken after the acks, on another clock.
    rt, _, send, _ = runtime()
    rt.publisher = Publisher(send, TopicNames(verdicts="v", dlq="d"), clock=lambda: 1000.0)
    batch = events(0, 4)
    for ev in batch:
        ev.message.timestamp = 999.75  # 250 ms before the hand-off
    await rt.handle(batch)
    await rt.drain()
    assert [json.loads(v)["latency_ms"] for v in send.sent] == [250.0] * 4
    samples = {s.name: s.value for fam in rt.metrics.registry.collect() for s in fam.samples}
    assert samples["sidecar_latency_seconds_count"] == 4
    assert samples["sidecar_latency_seconds_sum"] == pytest.approx(4 * 0.25)
