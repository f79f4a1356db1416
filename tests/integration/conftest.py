"""Real parts for integration tests: the embedded Tansu broker, a private redis-server and
an OpenAI-compatible embeddings server running the real default encoder.

All run as child processes on free ports on 127.0.0.1 and are stopped by pid. Nothing
here mocks a Kafka or Redis client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


@pytest.fixture(scope="session")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real OpenAI-compatible embeddings server running the default encoder, as a child
    process (``tests/support/embedding_server.py``) that wants ``server.api_key`` as a
    bearer token; tests switch its faults on and off and reset it."""
    from support.embedding_server import EmbeddingServerProcess

    log_path = tmp_path_factory.mktemp("embedding-server") / "server.log"
    key = "sk-test-embeddings-7f3a"
    with EmbeddingServerProcess(log_path=log_path, max_batch=64, api_key=key) as server:
        yield server


@pytest.fixture(scope="session")
def local_encoder() -> Any:
    """The default encoder run locally (sentence-transformers on torch), loaded once: what
    the embedding server's answers are compared with."""
    from sidecar.encoders import SentenceTransformerEncoder

    return SentenceTransformerEncoder()
