"""The ``/v1/embeddings`` wire format: the request body, the answer read back into unit
vectors, an error body as one line, and ``Retry-After``.

Pure functions (no I/O), so every malformed answer a server or a proxy can give is
unit-testable.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sidecar.errors import EncoderInputRejected, EncoderRefused

# Statuses worth asking again: the server is busy, restarting or behind a gateway that
# is. Everything else in 4xx is an answer about this request or this client.
RETRY_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
# The texts of this request, not the client or the server: one of them is refused.
INPUT_STATUS = frozenset({400, 413, 422})
_MAX_MESSAGE = 240


def request_body(texts: Sequence[str], model: str, encoding_format: str) -> dict[str, Any]:
    """The JSON body of one request for ``texts``."""
    return {"input": list(texts), "model": model, "encoding_format": encoding_format}


def read_embeddings(body: bytes, n: int, dim: int | None) -> tuple[np.ndarray, str | None]:
    """Unit rows ``(n, dim)`` float32 from an answer, and the model the server names.

    ``data`` items may come in any order (``index`` says where each goes) and as JSON
    numbers or base64 little-endian float32, whichever the server sent. ``dim`` is the
    width expected (None: whatever the first row has).

    Raises
    ------
    EncoderRefused
        The answer is not an embeddings list for these ``n`` texts (not JSON, items
        missing or repeated, rows of another width): a wrong URL or an incompatible server.
    EncoderInputRejected
        A row is not finite or is all zeros: that text cannot be scored.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise EncoderRefused(
            f"the answer is not JSON (starts {_shown(body[:60])}): is base_url an "
            "OpenAI-compatible /v1 endpoint?"
        ) from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise EncoderRefused("the answer has no 'data' list of embeddings")
    if len(data) != n:
        raise EncoderRefused(f"the answer holds {len(data)} embeddings for {n} texts")
    placed: dict[int, np.ndarray] = {}
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise EncoderRefused(f"data[{position}] is not an object")
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < n or index in placed:
            raise EncoderRefused(f"data[{position}] has index {index!r}: missing or repeated")
        placed[index] = _vector(item.get("embedding"), position)
    rows = [placed[i] for i in range(n)]  # n items, n distinct indices below n: all there
    width = dim if dim is not None else rows[0].shape[0] if rows else 0
    for index, row in enumerate(rows):
        if row.shape[0] != width:
            raise EncoderRefused(
                f"the embedding of text {index} has {row.shape[0]} dims, {width} expected: "
                "does the server run another model than the one this encoder names?"
            )
    E = np.stack(rows) if rows else np.zeros((0, width))
    if not np.all(np.isfinite(E)):
        bad = int(np.argmin(np.isfinite(E).all(axis=1)))
        raise EncoderInputRejected(f"the server's embedding of text {bad} is not finite")
    norms = np.linalg.norm(E, axis=1, keepdims=True)
    if n and not np.all(norms > 0):
        raise EncoderInputRejected(
            f"the server's embedding of text {int(np.argmin(norms[:, 0]))} is all zeros"
        )
    # Servers normalise or not (OpenAI does, some do not); the detectors expect unit rows.
    E = (E / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    model = doc.get("model")
    return E, model if isinstance(model, str) else None


def _vector(value: Any, position: int) -> np.ndarray:
    """One embedding, given as a list of numbers or as base64 float32."""
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise EncoderRefused(f"data[{position}].embedding is not base64") from None
        if not raw or len(raw) % 4:
            raise EncoderRefused(
                f"data[{position}].embedding holds {len(raw)} bytes, not float32 values"
            )
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if isinstance(value, list) and value:
        try:
            row = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            row = None
        if row is None or row.ndim != 1:
            raise EncoderRefused(f"data[{position}].embedding is not a list of numbers")
        return row
    raise EncoderRefused(f"data[{position}].embedding is neither numbers nor base64")


def error_message(body: bytes) -> str:
    """What an error answer says, on one line: OpenAI's ``{"error": {"message"}}``, a
    FastAPI ``{"detail"}``, or the start of the body."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _shown(body[:_MAX_MESSAGE])
    said: Any = doc
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            said = err.get("message") or err
        elif err is not None:
            said = err
        elif "detail" in doc:
            said = doc["detail"]
        elif "message" in doc:
            said = doc["message"]
    text = said if isinstance(said, str) else json.dumps(said, ensure_ascii=False)
    return _one_line(text)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date
    (None when absent or unreadable; never negative)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if np.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT, whether or not it says so
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _shown(raw: bytes) -> str:
    return repr(_one_line(raw.decode("utf-8", errors="replace")))


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."
