"""Dynamic micro-batching between the consumer and the encoder.

faust's ``stream.take_events(n, within)`` stops filling its buffer while a batch is being
processed and, once the batch is done, waits up to ``within`` again for the buffer to
fill, even when records are already queued. A record that arrives during an encode of
50 ms therefore waits for that encode, then for the window, then for its own encode.

:class:`MicroBatcher` decouples the two sides instead. The agent puts records in as fast
as faust delivers them; one runner task takes *everything already waiting* (up to
``max_size``) as soon as the previous batch is scored, so batches grow with the load on
their own. Only when the encoder is idle and the queue is empty does the runner wait for
companions of the first record, and for at most ``linger_s``. The queue is bounded
(``max_queued``): when it is full, :meth:`put` waits, which stops the agent pulling and
lets faust's flow control pause fetching.

Nothing here acks or commits: the handler owns that (see ``sidecar.stream._app``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class MicroBatcher(Generic[T]):
    """A bounded queue drained in batches by one runner task.

    Parameters
    ----------
    handler : async callable
        Called with each batch (a non-empty list, in arrival order), one call at a time.
        An exception stops the runner; the next :meth:`put` re-raises it.
    max_size : int
        Most items per batch.
    linger_s : float
        When the runner is idle and the queue empty, how long it waits after the first
        item for more before handling a batch smaller than ``max_size``.
    max_queued : int, optional
        Items the queue holds before :meth:`put` waits; default ``2 * max_size``.
    """

    def __init__(
        self,
        handler: Callable[[list[T]], Awaitable[None]],
        *,
        max_size: int,
        linger_s: float,
        max_queued: int | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.handler = handler
        self.max_size = max_size
        self.linger_s = max(0.0, linger_s)
        self.max_queued = max(max_queued or 2 * max_size, max_size)
        self._items: deque[T] = deque()
        self._arrived = asyncio.Event()  # set while items are queued
        self._space = asyncio.Event()  # set while the queue has room
        self._space.set()
        self._closing = False
        self._runner: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return len(self._items)

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())

    async def put(self, item: T) -> None:
        """Queue ``item``; waits while the queue is full; re-raises a handler failure."""
        self._raise_if_failed()
        while len(self._items) >= self.max_queued:
            self._space.clear()
            waiter = asyncio.ensure_future(self._space.wait())
            assert self._runner is not None, "start() the batcher first"
            await asyncio.wait({waiter, self._runner}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            self._raise_if_failed()
        self._items.append(item)
        self._arrived.set()

    async def close(self) -> None:
        """Handle the batch in progress, then stop; queued items are left unhandled.

        Items still queued were never handed to the handler, so whoever holds them (the
        consumer's uncommitted offsets) gets them again; nothing is handled twice here.
        """
        self._closing = True
        self._arrived.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.shield(runner)

    def _raise_if_failed(self) -> None:
        r = self._runner
        if r is not None and r.done() and not r.cancelled() and r.exception() is not None:
            raise r.exception()  # type: ignore[misc]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            if not self._items:
                self._arrived.clear()
                await self._arrived.wait()
                if self._closing:
                    return
                # Idle encoder, empty queue: give the first record a short window for
                # companions (a batch of 8 costs far less than 8 batches of 1).
                deadline = loop.time() + self.linger_s
                while len(self._items) < self.max_size and not self._closing:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    self._arrived.clear()
                    try:
                        await asyncio.wait_for(self._arrived.wait(), left)
                    except TimeoutError:
                        break
                if self._closing:
                    return
            batch = self._take()
            await self.handler(batch)

    def _take(self) -> list[T]:
        n = min(self.max_size, len(self._items))
        batch = [self._items.popleft() for _ in range(n)]
        if len(self._items) < self.max_queued:
            self._space.set()
        return batch
