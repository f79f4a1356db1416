"""The http encoder against a real embeddings server running the real default encoder.

The server (``tests/support/embedding_server.py``) is a separate process speaking the
OpenAI ``/v1/embeddings`` protocol; its switches make it slow, failing (429 with
``Retry-After``, 5xx, a closed port) or serve other weights under the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from sidecar.encoders import HttpEncoder, SentenceTransformerEncoder, embed_probes
from sidecar.errors import EncoderInputRejected, EncoderRefused, EncoderUnavailable
from sidecar.scoring import MIN_PROBE_COSINE, PROBE_TEXTS, probe_cosines, probe_mismatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = [
    "How do I book an appointment with a paediatrician?",
    "Is the clinic open on public holidays?",
    "Write a haiku about the sea",
    "x",
    "Crème brûlée à la CAFÉ: numbers 3.14 & emoji 🙂?",
    "reimbursement of physiotherapy after knee surgery",
    "What is the capital of Mongolia?",
]


@pytest.fixture
def server(embedding_server: Any) -> Iterator[Any]:
    """The session's server, reset before and after the test."""
    embedding_server.reset()
    yield embedding_server
    embedding_server.reset()


@pytest.fixture
def local(local_encoder: SentenceTransformerEncoder) -> SentenceTransformerEncoder:
    return local_encoder


def encoder(server: Any, **kw: Any) -> HttpEncoder:
    kw.setdefault("backoff_s", 0.05)
    kw.setdefault("api_key", server.api_key)
    return HttpEncoder("all-MiniLM-L6-v2", base_url=server.base_url, **kw)


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_the_server_embeds_as_the_local_encoder_does(
    server: Any, local: SentenceTransformerEncoder, encoding_format: str
) -> None:
    enc = encoder(server, encoding_format=encoding_format, max_batch=3, concurrency=2)
    E = enc.encode(TEXTS)
    assert E.shape == (len(TEXTS), 384) and E.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5)
    assert probe_cosines(local.encode(TEXTS), E).min() > 0.99999
    # Batches of 3 at most, at most 2 in flight, in the format asked for.
    sizes = [r["n"] for r in server.requests()]
    assert sorted(sizes) == [1, 3, 3]
    assert all(r["in_flight"] <= 2 for r in server.requests())
    assert {r["encoding_format"] for r in server.requests()} == {encoding_format}
    # The identity a model records: the setting's name, the server's width and probes.
    assert (enc.name, enc.dim) == ("all-MiniLM-L6-v2", 384)
    assert probe_mismatch(embed_probes(local.encode), PROBE_TEXTS, enc.probe()) is None
    assert enc.state().reachable and enc.state().served_model == "all-MiniLM-L6-v2"


def test_429_and_5xx_are_retried_and_retry_after_is_honoured(server: Any) -> None:
    faults = [{"status": 429, "retry_after": "1"}, {"status": 500}, {"status": 503}]
    server.control(faults=faults)
    enc = encoder(server, deadline_s=20.0)
    E = enc.encode(TEXTS[:2])
    assert E.shape == (2, 384)
    log = server.requests()
    assert [r["status"] for r in log] == [429, 500, 503, 200]
    assert enc.retries == 3
    # The second try came no sooner than the server asked.
    assert log[1]["t"] - log[0]["t"] >= 1.0


def test_a_slow_server_misses_the_deadline_and_recovers(server: Any) -> None:
    server.control(delay_s=3.0)
    enc = encoder(server, timeout_s=0.5, deadline_s=1.5)
    with pytest.raises(EncoderUnavailable, match=r"deadline|no answer") as caught:
        enc.encode(TEXTS[:1])
    assert not isinstance(caught.value, EncoderRefused)  # worth retrying later
    assert enc.state().reachable is False and "no answer" in str(enc.state().error)
    server.control(delay_s=0.0)
    assert enc.encode(TEXTS[:1]).shape == (1, 384)
    assert enc.state().reachable is True and enc.state().error is None


def test_a_retry_after_past_the_deadline_gives_up_at_once(server: Any) -> None:
    server.control(faults=[{"status": 429, "retry_after": "30"}])
    enc = encoder(server, deadline_s=5.0)
    with pytest.raises(EncoderUnavailable, match=r"HTTP 429.*deadline"):
        enc.encode(TEXTS[:1])
    assert len(server.requests()) == 1


def test_a_closed_port_is_unavailable_until_it_opens(server: Any) -> None:
    server.control(serving=False)
    enc = encoder(server, deadline_s=1.0)
    with pytest.raises(EncoderUnavailable, match="unreachable"):
        enc.encode(TEXTS[:1])
    server.control(serving=True)
    assert enc.encode(TEXTS[:1]).shape == (1, 384)


def test_refusals_fail_at_once_and_never_show_the_key(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "sk-test-wrong-key-0123456789"
    wrong = encoder(server, api_key=secret)
    # The server echoes the key it was given; the encoder shows *** instead.
    with pytest.raises(EncoderRefused, match=r"HTTP 401: Incorrect API key provided: \*\*\*"):
        wrong.encode(TEXTS[:1])
    with pytest.raises(EncoderRefused, match=r"HTTP 404.*does not exist"):
        encoder(server, model="no-such-model").encode(TEXTS[:1])
    with pytest.raises(EncoderInputRejected, match=r"HTTP 400.*too many inputs"):
        encoder(server, max_batch=100).encode(["a text"] * 65)
    assert [r["status"] for r in server.requests()] == [401, 404, 400]  # none retried
    assert wrong.state().reachable is False and "401" in str(wrong.state().error)
    assert secret not in caplog.text
    assert secret not in repr(wrong.describe()) and secret not in str(wrong.state())


def test_other_weights_under_the_same_name_fail_the_probe_check(
    server: Any, local: SentenceTransformerEncoder
) -> None:
    recorded = embed_probes(local.encode)  # what a model trained locally keeps
    enc = encoder(server)
    assert probe_mismatch(recorded, PROBE_TEXTS, enc.probe()) is None
    server.control(weights="wrong")
    wrong = enc.probe()
    why = probe_mismatch(recorded, PROBE_TEXTS, wrong)
    assert why is not None and "differently" in why
    assert probe_cosines(recorded, wrong).min() < MIN_PROBE_COSINE
