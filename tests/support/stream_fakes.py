"""Small fakes of the scoring path's own protocols (encoder, model, holder, producer,
faust events), shared by the batch tests and the record fuzz."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class FakeEncoder:
    """Embeds a text as [len/10, 1, 0, 0]; raises on any batch containing 'POISON'."""

    name, dim = "fake", 4

    def __init__(self, on_encode: object = None) -> None:
        self.threads: list[int] = []
        self.calls: list[int] = []
        self.on_encode = on_encode

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        self.threads.append(threading.get_ident())
        self.calls.append(len(texts))
        if callable(self.on_encode):
            self.on_encode()
        if any("POISON" in t for t in texts):
            raise RuntimeError("tokenizer exploded")
        return np.array([[len(t) / 10.0, 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)


@dataclass(frozen=True)
class FakeModel:
    threshold: float = 0.5
    detector_name: str = "fake"
    # The encoder it was "built" with: FakeEncoder's, unless a test says otherwise.
    encoder: dict[str, Any] = field(default_factory=lambda: {"name": "fake", "dim": 4})

    def score(self, E: np.ndarray) -> np.ndarray:
        s = E[:, 0].astype(np.float64)
        if np.any(np.isclose(s, 9.9)):  # a 99-char text breaks this detector
            raise FloatingPointError("singular")
        s[np.isclose(s, 7.7)] = np.nan  # a 77-char text makes it return NaN
        return s


@dataclass(frozen=True)
class FakeLoaded:
    kb: str
    version: str
    model: FakeModel
    loaded_at: float = 0.0


class FakeHolder:
    def __init__(self, models: Mapping[str, FakeLoaded]) -> None:
        self.models = dict(models)
        self.snapshots = 0

    def snapshot(self) -> Mapping[str, FakeLoaded]:
        self.snapshots += 1
        return dict(self.models)


def holder(**versions: str) -> FakeHolder:
    """A holder serving each named KB at the given version with a :class:`FakeModel`."""
    return FakeHolder({kb: FakeLoaded(kb, v, FakeModel()) for kb, v in versions.items()})


@dataclass
class Message:
    """What the worker reads of a faust message (key and headers included, as consumed)."""

    value: bytes | None
    offset: int
    topic: str = "q"
    partition: int = 0
    timestamp: float | None = None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class Event:
    message: Message
    acks: int = 0

    def ack(self) -> None:
        self.acks += 1


@dataclass(frozen=True)
class Sent:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


class RecordingSend:
    """The producer as the publisher sees it: keeps every record, delivers at once."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    async def __call__(self, topic: str, key: bytes | None, value: bytes, headers: Any) -> Any:
        self.sent.append(Sent(topic, key, value, list(headers)))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut
