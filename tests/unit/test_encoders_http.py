"""The http encoder's parts without a server: the wire format, ``Retry-After``, the
settings section, the backend choice, and the retry loop over httpx's own in-memory
transport (the integration tests run it against a real server)."""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from sidecar.cli._options import encoder_overrides
from sidecar.encoders import HttpEncoder, load_encoder
from sidecar.encoders._http_wire import error_message, parse_retry_after, read_embeddings
from sidecar.errors import (
    ConfigError,
    EncoderInputRejected,
    EncoderRefused,
    EncoderUnavailable,
)
from sidecar.settings import EmbeddingServerSettings, ScoringSettings, load_settings

URL = "http://embeddings.test/v1"


def answer(rows: list[list[float]], *, fmt: str = "float", order: list[int] | None = None) -> bytes:
    order = order if order is not None else list(range(len(rows)))
    data = []
    for i in order:
        vec: Any = rows[i]
        if fmt == "base64":
            vec = base64.b64encode(np.asarray(rows[i], dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    doc = {"object": "list", "data": data, "model": "mini", "usage": {"prompt_tokens": 3}}
    return json.dumps(doc).encode()


# -- the wire format -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_an_answer_becomes_unit_rows_in_input_order(fmt: str) -> None:
    rows = [[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]
    E, model = read_embeddings(answer(rows, fmt=fmt, order=[1, 0]), 2, None)
    np.testing.assert_allclose(E, [[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], atol=1e-6)
    assert E.dtype == np.float32 and model == "mini"


@pytest.mark.parametrize(
    ("body", "n", "dim", "match"),
    [
        (b"<html>502 Bad Gateway</html>", 1, None, "not JSON"),
        (b'{"object": "list"}', 1, None, "no 'data'"),
        (answer([[1.0, 0.0]]), 2, None, "1 embeddings for 2 texts"),
        (answer([[1.0, 0.0], [0.0, 1.0]], order=[0, 0]), 2, None, "missing or repeated"),
        (answer([[1.0, 0.0], [0.0, 1.0, 0.0]]), 2, None, "text 1 has 3 dims, 2 expected"),
        (answer([[1.0, 0.0]]), 1, 384, "2 dims, 384 expected"),
        (b'{"data": [{"index": 0, "embedding": "not base64!"}]}', 1, None, "not base64"),
        (b'{"data": [{"index": 0, "embedding": "AAA="}]}', 1, None, "not float32"),
        (b'{"data": [{"index": 0, "embedding": ["a", "b"]}]}', 1, None, "list of numbers"),
        (b'{"data": [{"index": 0}]}', 1, None, "neither numbers nor base64"),
    ],
)
def test_an_answer_that_is_not_embeddings_is_refused(
    body: bytes, n: int, dim: int | None, match: str
) -> None:
    with pytest.raises(EncoderRefused, match=match):
        read_embeddings(body, n, dim)


def test_rows_that_cannot_be_scored_reject_the_input() -> None:
    with pytest.raises(EncoderInputRejected, match="text 1 is all zeros"):
        read_embeddings(answer([[1.0, 0.0], [0.0, 0.0]]), 2, 2)
    nan = b'{"data": [{"index": 0, "embedding": [NaN, 1.0]}]}'
    with pytest.raises(EncoderInputRejected, match="not finite"):
        read_embeddings(nan, 1, 2)


def test_error_bodies_become_one_line() -> None:
    openai = {"error": {"message": "The model `x` does not exist", "type": "invalid_request"}}
    assert error_message(json.dumps(openai).encode()) == "The model `x` does not exist"
    fastapi = {"detail": [{"loc": ["body", "input"], "msg": "field required"}]}
    assert "field required" in error_message(json.dumps(fastapi).encode())
    assert error_message(b"upstream\nconnect error") == "'upstream connect error'"
    assert len(error_message(b"x" * 5000)) < 300


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after("2") == 2.0 and parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("inf") is None and parse_retry_after("nan") is None
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


# -- settings and the backend choice ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("embeddings:7997/v1", "must be http"),
        ("http://", "names no host"),
        ("http://emb /v1", "must be http"),
    ],
)
def test_a_base_url_that_cannot_work_is_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(embedding_server={"base_url": url})


def test_the_api_key_comes_from_a_secret_file_and_stays_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "embedding_server__api_key").write_text("sk-from-the-file\n")
    monkeypatch.setenv("SIDECAR_SECRETS_DIR", str(tmp_path))
    s = load_settings(embedding_server={"base_url": URL})
    assert s.embedding_server.api_key is not None
    assert s.embedding_server.api_key.get_secret_value() == "sk-from-the-file"
    assert "sk-from-the-file" not in repr(s) and "sk-from-the-file" not in str(s.model_dump())
    (tmp_path / "embedding_server__api_key").write_text("  \n")
    with pytest.raises(ConfigError, match=r"embedding_server\.api_key is set but empty"):
        load_settings()


def test_a_ca_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a readable CA bundle"):
        HttpEncoder("mini", base_url=URL, ca_file=tmp_path / "missing.pem")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a readable CA bundle"):
        HttpEncoder("mini", base_url=URL, ca_file=tmp_path / "bad.pem")


def test_section_checks() -> None:
    with pytest.raises(ConfigError, match="backoff_s"):
        load_settings(embedding_server={"backoff_s": 9, "backoff_max_s": 1})
    assert EmbeddingServerSettings(ca_file="").ca_file is None
    assert load_settings(embedding_server={"base_url": URL}).embedding_server.deadline_s > 0


def test_the_http_backend_needs_the_whole_settings_and_a_url() -> None:
    s = load_settings(scoring={"encoder_backend": "http"}, embedding_server={"base_url": URL})
    enc = load_encoder(s)
    assert isinstance(enc, HttpEncoder)
    # The name models record is the setting's; the server is asked for the same model.
    assert (enc.name, enc.model, enc.known_dim, enc.url) == (
        "all-MiniLM-L6-v2",
        "all-MiniLM-L6-v2",
        384,
        URL + "/embeddings",
    )
    other = load_encoder(s, name="BAAI/bge-small-en-v1.5")
    assert (other.name, other.model, other.known_dim) == (  # type: ignore[attr-defined]
        "bge-small-en-v1.5",
        "BAAI/bge-small-en-v1.5",
        None,
    )
    with pytest.raises(ConfigError, match="no embedding_server settings"):
        load_encoder(ScoringSettings(encoder_backend="http"))
    with pytest.raises(ConfigError, match=r"needs embedding_server\.base_url"):
        load_encoder(load_settings(scoring={"encoder_backend": "http"}))


def test_encoder_url_option_sets_the_backend_and_the_url() -> None:
    assert encoder_overrides(None, None) == {}
    assert encoder_overrides("mini", URL) == {
        "scoring": {"encoder": "mini", "encoder_backend": "http"},
        "embedding_server": {"base_url": URL},
    }


# -- the retry loop over an in-memory transport ----------------------------------------------


class Script:
    """Answers requests from a list of (status, headers, body); records what came."""

    def __init__(self, *replies: tuple[int, dict[str, str], bytes]) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[float, dict[str, Any], dict[str, str]]] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            self.seen.append((time.monotonic(), body, dict(request.headers)))
            status, headers, content = self.replies.pop(0) if self.replies else (200, {}, b"")
        if status == 200 and not content:
            content = answer([[1.0, float(i)] for i in range(len(body["input"]))])
        return httpx.Response(status, headers=headers, content=content)


def http(script: Script, **kw: Any) -> HttpEncoder:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return HttpEncoder("mini", base_url=URL, transport=httpx.MockTransport(script), **kw)


def test_requests_carry_at_most_max_batch_texts_and_the_key() -> None:
    script = Script()
    enc = http(script, max_batch=3, api_key="sk-abc", encoding_format="float")
    E = enc.encode([f"t{i}" for i in range(7)])
    assert E.shape == (7, 2) and enc.dim == 2  # the width learned from the answer
    bodies = sorted((b for _, b, _ in script.seen), key=lambda b: b["input"][0])
    assert [len(b["input"]) for b in bodies] == [3, 3, 1]
    assert {b["model"] for b in bodies} == {"mini"}
    assert {b["encoding_format"] for b in bodies} == {"float"}
    assert {h["authorization"] for _, _, h in script.seen} == {"Bearer sk-abc"}
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-6)


def test_a_retry_after_date_is_waited_for() -> None:
    # Two seconds ahead, in whole seconds as HTTP dates are: at least one to wait.
    when = email.utils.formatdate(time.time() + 2.0, usegmt=True)
    script = Script((503, {"Retry-After": when}, b"busy"))
    enc = http(script, deadline_s=10)
    enc.encode(["a"])
    (t0, _, _), (t1, _, _) = script.seen
    assert t1 - t0 >= 0.9 and enc.retries == 1


def test_retries_stop_at_max_retries() -> None:
    script = Script(*[(500, {}, b'{"error": {"message": "boom"}}')] * 5)
    with pytest.raises(EncoderUnavailable, match=r"HTTP 500: boom \(3 tries"):
        http(script, max_retries=2).encode(["a"])
    assert len(script.seen) == 3


def test_a_width_other_than_the_declared_one_is_refused() -> None:
    with pytest.raises(EncoderRefused, match="2 dims, 384 expected"):
        http(Script(), dim=384).encode(["a"])


def test_a_suspended_encoder_asks_nobody_but_probes_still_go_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    script = Script()
    enc = http(script)
    enc.suspend("its vectors no longer match")
    with pytest.raises(EncoderUnavailable, match="no longer match"):
        enc.encode(["a"])
    assert script.seen == []
    assert enc.probe().shape == (6, 2) and len(script.seen) == 1
    enc.suspend(None)
    assert enc.encode(["a"]).shape == (1, 2)
    assert "not embedding" in caplog.text and "embedding again" in caplog.text


def test_closing_ends_a_retry_that_waits() -> None:
    script = Script((429, {"Retry-After": "30"}, b""))
    enc = http(script, deadline_s=60)
    threading.Timer(0.2, enc.close).start()
    t0 = time.monotonic()
    with pytest.raises(EncoderUnavailable, match="closed"):
        enc.encode(["a"])
    assert time.monotonic() - t0 < 30


def test_state_follows_the_last_answer() -> None:
    script = Script((401, {}, b'{"error": {"message": "bad key sk-secret-1"}}'))
    enc = http(script, api_key="sk-secret-1")
    assert enc.state().reachable is None
    with pytest.raises(EncoderRefused, match=r"bad key \*\*\*"):
        enc.encode(["a"])
    assert enc.state().reachable is False and "sk-secret-1" not in str(enc.describe())
    enc.encode(["a"])
    assert enc.state().reachable is True and enc.state().served_model == "mini"
