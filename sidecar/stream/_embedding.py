"""Query embeddings a client sends with its query: decoded, and checked against the model
that scores them.

A RAG service embeds every query to retrieve with it; when it sends that vector along
(``"embedding"`` in the query record) and names its encoder, the worker scores the vector
instead of encoding the text again. The vector is used only when

- an encoder is named (``"encoder"``, else the record's ``sidecar-encoder`` header) and it
  is the encoder of the model that scores the query: the model's recorded name, an alias
  of the same packaged encoder (``sentence-transformers/all-MiniLM-L6-v2``), or a hub id
  ending in that name (:func:`same_encoder`);
- it decodes: a base64 string of little-endian float32 (a whole number of 4-byte floats)
  or a JSON array of numbers (no strings, booleans or nulls), not empty, not all zeros;
- every component is finite (no NaN or infinity, none past float32's range);
- its length is that model's width.

Each failed condition has its own dead-letter reason code, checked in that order (the
encoder first: a vector of another encoder is refused whatever its shape). The checks run
when the batch is scored, against the model of the batch's one snapshot, so a hot swap to
a model of another encoder can never score a vector made for the previous one.

A usable vector is scaled to unit length, as every encoder of the sidecar returns its
embeddings and as the detectors were fitted: a cosine-based encoder's vector means its
direction (OpenAI-style servers normalise already; some servers do not).

Proving that the named encoder really is the model's (same weights, not only the same
name) is done once, before any vector is sent: ``sidecar check-encoder`` and
:mod:`sidecar.stream._encoder_proof`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar._json_types import json_type
from sidecar.stream._records import (
    EMBEDDING_DIMENSION,
    EMBEDDING_MALFORMED,
    EMBEDDING_NOT_FINITE,
    ENCODER_MISMATCH,
    ENCODER_MISSING,
    MAX_QUOTED_CHARS,
    Query,
    quote,
    utf8_encodable,
)

# The Kafka header that may name the encoder of a record's embedding.
ENCODER_HEADER = "sidecar-encoder"
# No model is wider: a longer vector is refused before anything is allocated for it.
MAX_EMBEDDING_DIM = 16384
_MAX_BASE64_CHARS = 4 * ((4 * MAX_EMBEDDING_DIM + 2) // 3)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class EmbeddingProblem:
    """Why a client embedding cannot be scored: a dead-letter reason code and a detail."""

    reason: str
    detail: str


def client_embedding(
    query: Query, model_encoder: Mapping[str, Any]
) -> np.ndarray | EmbeddingProblem | None:
    """The query's own embedding, checked for the model built with ``model_encoder``.

    Parameters
    ----------
    query : Query
        A parsed query; its ``embedding`` and ``encoder`` fields as the record held them.
    model_encoder : mapping
        The scoring model's encoder record, ``{"name": str, "dim": int}``.

    Returns
    -------
    ndarray of shape (dim,), float32, unit length; or EmbeddingProblem when the vector
    cannot be used; or None when the query carries no embedding.
    """
    if query.embedding is None:
        return None
    name = encoder_name(query)
    if isinstance(name, EmbeddingProblem):
        return name
    want, dim = str(model_encoder["name"]), int(model_encoder["dim"])
    if not same_encoder(name, want):
        return EmbeddingProblem(
            ENCODER_MISMATCH,
            f"embedding by encoder {quote(name)}; the model scoring KB {quote(query.kb)} "
            f"was built with {want!r} ({dim} dims)",
        )
    vector = decode_embedding(query.embedding)
    if isinstance(vector, EmbeddingProblem):
        return vector
    if vector.shape[0] != dim:
        return EmbeddingProblem(
            EMBEDDING_DIMENSION,
            f"embedding has {vector.shape[0]} dimensions; the model of encoder {want!r} "
            f"expects {dim}",
        )
    return vector


def encoder_name(query: Query) -> str | EmbeddingProblem:
    """The encoder a query names for its embedding: ``"encoder"``, else the header."""
    name = query.encoder
    if name is None:
        for key, value in query.raw.headers:
            if key == ENCODER_HEADER:
                name = _header_text(value)
                if name is None:
                    return EmbeddingProblem(
                        ENCODER_MISSING, f"the {ENCODER_HEADER} header is not UTF-8 text"
                    )
                break
        if name is None:
            return EmbeddingProblem(
                ENCODER_MISSING,
                f"an embedding without its encoder: name it in 'encoder' or the "
                f"{ENCODER_HEADER} header",
            )
    if not isinstance(name, str):
        return EmbeddingProblem(
            ENCODER_MISSING, f"'encoder' is {type(name).__name__}, expected a string"
        )
    if not name.strip() or not utf8_encodable(name):
        return EmbeddingProblem(ENCODER_MISSING, f"encoder name {quote(name)} is not a name")
    return name


def _header_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


@functools.lru_cache(maxsize=256)
def same_encoder(client: str, model: str) -> bool:
    """Whether encoder name ``client`` names the encoder a model recorded as ``model``.

    The same name; two spellings of one packaged encoder (``default``,
    ``sentence-transformers/all-MiniLM-L6-v2``); or a hub id whose last part is the name
    (``BAAI/bge-small-en-v1.5`` for ``bge-small-en-v1.5``: a model records an encoder by
    the last part of its ``scoring.encoder``, see ``sidecar.encoders.encoder_label``).
    A name is a claim, not a proof: ``sidecar check-encoder`` proves the weights.
    """
    if client == model or client.rsplit("/", 1)[-1] == model:
        return True
    if len(client) > MAX_QUOTED_CHARS * 4:
        return False
    from sidecar.encoders import encoder_spec

    a, b = encoder_spec(client), encoder_spec(model)
    return a is not None and b is not None and a.name == b.name


def decode_embedding(value: Any) -> np.ndarray | EmbeddingProblem:
    """A vector as a record carries it, decoded strictly.

    Parameters
    ----------
    value : str or list
        A base64 string of little-endian float32, or a JSON array of numbers.

    Returns
    -------
    ndarray of shape (n,), float32, scaled to unit length; or the EmbeddingProblem
    (``embedding_malformed``, ``embedding_not_finite`` or, past
    :data:`MAX_EMBEDDING_DIM`, ``embedding_dimension``).
    """
    if isinstance(value, str):
        vector = _from_base64(value)
    elif isinstance(value, list):
        vector = _from_numbers(value)
    else:
        return EmbeddingProblem(
            EMBEDDING_MALFORMED,
            f"'embedding' is {json_type(value)}; expected a base64 string of little-endian "
            "float32 or an array of numbers",
        )
    if isinstance(vector, EmbeddingProblem):
        return vector
    # One pass finds both: a NaN or infinity makes the squared norm NaN or inf, and finite
    # float32 components cannot overflow it in float64.
    wide = vector.astype(np.float64)
    squared = float(wide @ wide)
    if not math.isfinite(squared):
        i = int(np.argmax(~np.isfinite(vector)))
        return EmbeddingProblem(
            EMBEDDING_NOT_FINITE, f"component {i} of the embedding is {float(vector[i])!r}"
        )
    if squared == 0.0:
        return EmbeddingProblem(EMBEDDING_MALFORMED, "the embedding is all zeros (no direction)")
    wide *= 1.0 / math.sqrt(squared)
    return wide.astype(np.float32)


def _from_base64(value: str) -> np.ndarray | EmbeddingProblem:
    if not value:
        return EmbeddingProblem(EMBEDDING_MALFORMED, "'embedding' is an empty string")
    if len(value) > _MAX_BASE64_CHARS:
        return _too_long(f"{len(value)} base64 characters")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        # ValueError: a non-ASCII character; binascii.Error: outside the alphabet, padding
        return EmbeddingProblem(EMBEDDING_MALFORMED, f"'embedding' is not base64: {str(exc)[:120]}")
    if len(data) % 4:
        return EmbeddingProblem(
            EMBEDDING_MALFORMED,
            f"'embedding' decodes to {len(data)} bytes, not a whole number of float32 "
            "(4 bytes each)",
        )
    return np.frombuffer(data, dtype="<f4")


_NUMBER_TYPES = (float, int)


def _from_numbers(value: list[Any]) -> np.ndarray | EmbeddingProblem:
    if not value:
        return EmbeddingProblem(EMBEDDING_MALFORMED, "'embedding' is an empty array")
    if len(value) > MAX_EMBEDDING_DIM:
        return _too_long(f"{len(value)} numbers")
    # type() rather than isinstance: a JSON true is a bool, which isinstance calls an int.
    if not all(type(x) in _NUMBER_TYPES for x in value):
        i, x = next((i, x) for i, x in enumerate(value) if type(x) not in _NUMBER_TYPES)
        return EmbeddingProblem(
            EMBEDDING_MALFORMED, f"component {i} of the embedding is {json_type(x)}, not a number"
        )
    try:
        wide = np.array(value, dtype=np.float64)
    except OverflowError:  # a JSON integer past float range
        big = (i for i, x in enumerate(value) if type(x) is int and abs(x) > _FLOAT32_MAX)
        i = next(big, 0)
        return EmbeddingProblem(
            EMBEDDING_NOT_FINITE, f"component {i} of the embedding is past float32 range"
        )
    past = ~(np.abs(wide) <= _FLOAT32_MAX)  # NaN, infinities, and what float32 cannot hold
    if past.any():
        i = int(np.argmax(past))
        what = repr(float(wide[i])) if not np.isfinite(wide[i]) else "past float32 range"
        return EmbeddingProblem(EMBEDDING_NOT_FINITE, f"component {i} of the embedding is {what}")
    return wide.astype(np.float32)


def _too_long(what: str) -> EmbeddingProblem:
    return EmbeddingProblem(
        EMBEDDING_DIMENSION,
        f"'embedding' holds {what}; no model is wider than {MAX_EMBEDDING_DIM} dimensions",
    )
