"""Write a batch's verdicts (and routing copies) and its dead letters, and wait for the broker.

:meth:`Publisher.dead_letter` is the ONE place a dead-letter record is built and sent:
decode failures, policy rejections and scoring failures all go through it.
:meth:`Publisher.publish` returns only when the broker has acknowledged every record of
the batch, so the caller may then ack the consumed offsets (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.errors import BrokerError
from sidecar.stream._batch import BatchOutcome
from sidecar.stream._records import DeadLetter, Verdict, dumps

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]


class Send(Protocol):
    """Hand one record to the producer; the result resolves when the broker has it."""

    def __call__(
        self, topic: str, key: bytes | None, value: bytes, headers: Headers
    ) -> Awaitable[Awaitable[Any]]: ...


@dataclass(frozen=True)
class TopicNames:
    verdicts: str
    dlq: str
    id: str | None = None  # routing topics, None when routing is off
    ood: str | None = None


class Publisher:
    """Produces the outcome of a batch.

    Parameters
    ----------
    send : Send
        ``await send(topic, key, value, headers)`` returns a future of the delivery.
    topics : TopicNames
        Where verdicts, routing copies and dead letters go.
    clock : callable
        Wall clock in seconds (for the ``ts`` and ``latency_ms`` fields).
    """

    def __init__(
        self, send: Send, topics: TopicNames, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._send = send
        self.topics = topics
        self._clock = clock

    async def verdict(self, v: Verdict, now_ms: float) -> list[Awaitable[Any]]:
        """Send one verdict (and its routing copy); returns the delivery futures."""
        key = v.query.id.encode("utf-8")
        value = dumps(v.to_record(now_ms=now_ms))
        headers: list[tuple[str, bytes]] = [("model_version", (v.model_version or "").encode())]
        futs = [await self._send(self.topics.verdicts, key, value, headers)]
        route = self.topics.ood if v.verdict == "OOD" else self.topics.id
        if route:
            futs.append(await self._send(route, key, value, headers))
        return futs

    async def dead_letter(self, d: DeadLetter, now_ms: float | None = None) -> Awaitable[Any]:
        """Send one dead-letter record (the single DLQ handler); returns its delivery future."""
        now_ms = self._clock() * 1000.0 if now_ms is None else now_ms
        record = d.to_record(now_ms=now_ms)
        log.info(
            "dead letter %s at %s[%s]@%s: %s",
            d.reason,
            d.raw.topic,
            d.raw.partition,
            d.raw.offset,
            record["detail"],  # the record's detail is capped; d.detail may not be
        )
        headers = [
            ("reason", d.reason.encode()),
            ("model_version", (d.model_version or "").encode()),
        ]
        return await self._send(self.topics.dlq, None, dumps(record), headers)

    async def publish(self, outcome: BatchOutcome) -> float:
        """Send everything in ``outcome`` and wait until the broker acknowledged it all.

        Returns the time (epoch ms) the batch was handed to the producer, the one each
        verdict's ``latency_ms`` ends at.

        Raises
        ------
        BrokerError
            A record could not be delivered; the caller must not ack the batch.
        """
        now_ms = self._clock() * 1000.0
        futs: list[Awaitable[Any]] = []
        try:
            for v in outcome.verdicts:
                futs.extend(await self.verdict(v, now_ms))
            for d in outcome.dead:
                futs.append(await self.dead_letter(d, now_ms))
            results = await asyncio.gather(*futs, return_exceptions=True)
        except Exception as exc:
            raise BrokerError(f"producing the batch failed: {exc}") from exc
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise BrokerError(
                f"{len(errors)} of {len(futs)} records were not delivered: {errors[0]!r}"
            ) from errors[0]
        return now_ms
