"""Stop the worker after a halt, without waiting for the records it holds."""

from __future__ import annotations

import asyncio
from typing import Any

# Keeps the crash tasks referenced until they run (the event loop holds them weakly).
_STOPPING: list[asyncio.Future[None]] = []


def stop_without_waiting(app: Any, reason: BaseException) -> None:
    """Crash ``app`` (the worker exits non-zero) without waiting for held records.

    Held records are never acked, so faust must not wait for them on the way out (it would,
    for ever): their offsets stay uncommitted and the next owner of the partitions reads
    them again.
    """
    app.conf.stream_wait_empty = False
    _STOPPING.append(asyncio.ensure_future(app.crash(reason)))
