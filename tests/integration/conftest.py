"""Real parts for integration tests: the embedded Tansu broker and a private redis-server.

Both run as child processes on free ports on 127.0.0.1 and are stopped by pid. Nothing
here mocks a Kafka or Redis client.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.local import EmbeddedBroker, EmbeddedRedis

# (A pytestmark here would mark nothing: modules that use the broker or Redis mark
# themselves `integration`; the rest of this folder needs the real encoder, not services.)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One broker per test session; tests use their own topic names and group ids."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:
    """A fresh, empty redis-server per test (restartable with ``stop()`` / ``start()``)."""
    with EmbeddedRedis() as r:
        yield r
