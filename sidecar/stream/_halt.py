"""Stop the worker after a halt, without waiting for the records it holds."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Keeps the crash tasks referenced until they run (the event loop holds them weakly).
_STOPPING: list[asyncio.Future[None]] = []

# How long a halted worker may take to stop cleanly before the process is ended at once.
# A clean stop takes a second or two; with the broker unreachable, faust waited 60 s for
# its consumer thread (``sidecar bench faults``, broker_unreachable_past_timeout), all
# that time holding its partitions and restarting nothing.
HALT_EXIT_GRACE_S = 10.0
HALT_EXIT_CODE = 1


def stop_without_waiting(
    app: Any, reason: BaseException, *, grace_s: float = HALT_EXIT_GRACE_S
) -> None:
    """Crash ``app`` (the worker exits non-zero) without waiting for held records.

    Held records are never acked, so faust must not wait for them on the way out (it would,
    for ever): their offsets stay uncommitted and the next owner of the partitions reads
    them again. Should the stop itself hang (faust's consumer thread waits on a broker that
    went away), the process ends after ``grace_s``: after a halt nothing is published or
    acked any more, so ending it loses nothing.
    """
    app.conf.stream_wait_empty = False
    _STOPPING.append(asyncio.ensure_future(app.crash(reason)))
    exit_after(grace_s)


def exit_after(grace_s: float, *, end: Callable[[int], Any] = os._exit) -> threading.Timer:
    """End the process with :data:`HALT_EXIT_CODE` in ``grace_s`` unless it exits first.

    A daemon timer thread, so it fires even when the event loop is blocked and does not
    keep a process alive that exits on its own.
    """

    def fire() -> None:
        log.critical("the halted worker did not stop within %.0f s; ending the process", grace_s)
        for handler in logging.getLogger().handlers:
            handler.flush()
        end(HALT_EXIT_CODE)

    timer = threading.Timer(grace_s, fire)
    timer.daemon = True
    timer.start()
    return timer
