"""What the Kafka client logs while a start-up step runs is held back: dropped with the
step's own one-line error when it fails, passed on unchanged when it succeeds."""

from __future__ import annotations

import logging

import pytest

from sidecar.stream._topics import held_client_logs


class Refused(Exception):
    pass


def test_a_failed_step_holds_the_client_lines_back(caplog: pytest.LogCaptureFixture) -> None:
    client = logging.getLogger("aiokafka")
    with caplog.at_level(logging.INFO), pytest.raises(Refused), held_client_logs() as held:
        client.error("Unable connect to %r", "h:1")
        raise Refused
    assert [r.getMessage() for r in held.records] == ["Unable connect to 'h:1'"]
    assert not [r for r in caplog.records if r.name == "aiokafka"]
    assert not client.filters


def test_a_step_that_succeeds_passes_the_lines_on(caplog: pytest.LogCaptureFixture) -> None:
    client = logging.getLogger("aiokafka")
    with caplog.at_level(logging.INFO):
        with held_client_logs():
            client.error("Unable connect to %r", "h:1")
            assert not caplog.records
        client.warning("after")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("aiokafka", "ERROR", "Unable connect to 'h:1'"),
        ("aiokafka", "WARNING", "after"),
    ]
    assert not client.filters


def test_other_loggers_are_not_held(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(Refused), held_client_logs():
        logging.getLogger("sidecar.test").warning("mine")
        raise Refused
    assert [r.getMessage() for r in caplog.records] == ["mine"]
