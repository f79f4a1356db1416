"""Two fixes found by ``sidecar bench faults``, with fakes of the parts they read.

``/readyz`` said ready through a whole broker outage (its checks looked at the partition
assignment, which a consumer keeps while it cannot reach the broker); it now has a
``broker`` check. A halted worker whose broker had gone away took 60 s to exit (faust
waited on its consumer thread); the process now ends after a grace period.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from sidecar.stream._halt import HALT_EXIT_CODE, exit_after
from sidecar.stream._transport import broker_contact


class Conn:
    def __init__(self, open_: bool, answered_s_ago: float) -> None:
        self._open = open_
        self._last_action = time.monotonic() - answered_s_ago

    def connected(self) -> bool:
        return self._open


def app_with(*conns: Conn) -> Any:
    client = SimpleNamespace(_conns={i: c for i, c in enumerate(conns)})
    consumer = SimpleNamespace(_client=client)
    thread = SimpleNamespace(_ensure_consumer=lambda: consumer)
    return SimpleNamespace(consumer=SimpleNamespace(_thread=thread))


def test_in_touch_while_a_connection_is_open_and_answered_lately() -> None:
    doc = broker_contact(app_with(Conn(True, 0.2), Conn(False, 0.0)), within_s=10.0)
    assert doc["ok"] and doc["connections"] == 1 and doc["last_response_s"] < 1.0


def test_no_open_connection_is_no_contact() -> None:
    # The broker went away: its connections are closed at once.
    doc = broker_contact(app_with(Conn(False, 0.1), Conn(False, 0.1)), within_s=10.0)
    assert doc == {"ok": False, "connections": 0, "last_response_s": None}


def test_open_but_silent_for_a_session_timeout_is_no_contact() -> None:
    # A broker that hangs keeps its connections open and answers nothing.
    doc = broker_contact(app_with(Conn(True, 12.0)), within_s=10.0)
    assert not doc["ok"] and doc["connections"] == 1 and doc["last_response_s"] >= 12.0


def test_a_consumer_not_started_is_no_contact() -> None:
    def not_started() -> Any:
        raise RuntimeError("ConsumerNotStarted")

    thread = SimpleNamespace(_ensure_consumer=not_started)
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=thread))
    assert broker_contact(app, within_s=10.0)["ok"] is False


def test_a_halted_worker_that_does_not_stop_is_ended_after_the_grace() -> None:
    ended: list[int] = []
    fired = threading.Event()

    def end(code: int) -> None:
        ended.append(code)
        fired.set()

    timer = exit_after(0.05, end=end)
    assert timer.daemon  # never keeps a process alive that exits on its own
    assert fired.wait(5.0)
    assert ended == [HALT_EXIT_CODE]


def test_the_grace_timer_can_still_be_outrun() -> None:
    ended: list[int] = []
    timer = exit_after(60.0, end=ended.append)
    timer.cancel()  # what the process exiting first amounts to
    timer.join(1.0)
    assert ended == []
