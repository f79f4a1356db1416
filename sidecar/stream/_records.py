"""Message shapes on the scoring path: the query in, the verdict and the dead letter out.

Input (``kafka.queries_topic``), JSON::

    {"id": str, "text": str, "kb": str?, "ts": epoch ms?, "meta": object?,
     "embedding": str | [number, ...]?, "encoder": str?, "language": str?}

``embedding`` is the query's embedding by the client's own encoder: a base64 string of
little-endian float32 (what OpenAI-style ``/v1/embeddings`` answers with
``encoding_format=base64``) or a JSON array of numbers. ``encoder`` names that encoder, or
the record's ``sidecar-encoder`` header does (the field wins). A query with a usable
embedding is scored without being encoded here; see ``sidecar.stream._embedding`` for
what makes one usable and ``scoring.embedding_fallback`` for what happens to one that is
not. ``text`` is still required: a refused embedding falls back to it, and the language
detector reads it.

``language`` is the query's language as the client knows it (a BCP-47 tag: ``nl``,
``nl-NL``, ``pt_BR``, ``zh-Hant``), or the record's ``sidecar-language`` header says it
(the field wins). Its primary subtag, lowercased (``nl``, ``pt``, ``zh``), picks the
model's threshold for that language instead of the detector's guess, and the detector
does not read the query. See ``sidecar._language_tags`` for what is a tag.

Verdict (``kafka.verdicts_topic``, keyed by ``id``, header ``model_version``)::

    {"id", "kb", "verdict": "ID"|"OOD", "score", "threshold", "detector",
     "model_version", "latency_ms", "ts"}
    (+ "truncated": true, + "reason": "no_model" | "encoder_unavailable",
     + "embedding_source": "client" | "sidecar", + "embedding_fallback": reason code,
     + "language": code, + "language_source": "client" | "detected")

A scored verdict says whose embedding it scored: ``client`` (the record's own) or
``sidecar`` (its text, embedded by the worker's encoder). ``embedding_fallback`` names
the reason code of a client embedding that was refused and replaced by the worker's
(``scoring.embedding_fallback=encode``). ``language`` is the query's language, whose
threshold it met where the model has one (``und``: the detector could not tell; absent:
no language was given and none detected), and ``language_source`` says who told it:
``client`` (the record's ``language`` or header) or ``detected``.

Dead letter (``kafka.dlq_topic``)::

    {"reason", "detail", "payload", "payload_encoding", "payload_size", "payload_truncated",
     "topic", "partition", "offset", "model_version", "ts"}

``payload`` keeps at most the first :data:`MAX_DLQ_PAYLOAD_BYTES` of the record's value
(``payload_size`` is the original size in bytes), so a dead letter always fits the
producer's request size whatever was consumed (it stays under
:data:`MAX_DLQ_RECORD_BYTES`).

Parsing is pure (no I/O) so that every bad-input class is unit-testable.
"""

from __future__ import annotations

import base64
import codecs
import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.errors import DataError
from sidecar.stream._query_language import client_language

# Reason codes of the dead-letter topic (stable: dashboards and alerts key on them).
UNDECODABLE = "undecodable"  # the value is not UTF-8
INVALID_JSON = "invalid_json"  # not JSON, or JSON but not an object
MISSING_ID = "missing_id"  # no "id", or not a non-empty string
ID_TOO_LONG = "id_too_long"  # "id" longer than InputPolicy.max_id_chars
MISSING_TEXT = "missing_text"  # no "text" field
EMPTY_TEXT = "empty_text"  # "text" is empty or only whitespace
BAD_TEXT_TYPE = "bad_text_type"  # "text" is not a string
# "kb" not a string, "ts" not a number (or too large for a float), "meta" not an object,
# or "id" / "kb" / "text" holding a lone surrogate (not encodable as UTF-8)
BAD_FIELD = "bad_field"
UNKNOWN_KB = "unknown_kb"  # a KB this sidecar does not serve
TOO_LONG = "too_long"  # text over scoring.max_text_chars with overlong = "reject"
SCORING_FAILED = "scoring_failed"  # the encoder or the detector raised on this query
# the parser itself, or the check of the record's embedding, raised on this record (a bug,
# not bad input)
PARSE_FAILED = "parse_failed"
# "embedding" is neither a base64 string of little-endian float32 nor a JSON array of
# numbers (not base64, a byte length that is not a multiple of 4, a non-number, empty,
# or all zeros)
EMBEDDING_MALFORMED = "embedding_malformed"
# "embedding" holds a NaN or an infinity (or a number past float32's range)
EMBEDDING_NOT_FINITE = "embedding_not_finite"
# "embedding" has another length than the width of the model that scores the query
EMBEDDING_DIMENSION = "embedding_dimension"
# an "embedding" without the name of its encoder ("encoder", or the sidecar-encoder header)
ENCODER_MISSING = "encoder_missing"
# the named encoder is not the one the model that scores the query was built with
ENCODER_MISMATCH = "encoder_mismatch"
# "language" (or the sidecar-language header) is not a language tag: not a string, empty,
# over 35 characters, or not one BCP-47 tag such as "nl" or "pt-BR"
LANGUAGE_MALFORMED = "language_malformed"

REASONS = (
    UNDECODABLE,
    INVALID_JSON,
    MISSING_ID,
    ID_TOO_LONG,
    MISSING_TEXT,
    EMPTY_TEXT,
    BAD_TEXT_TYPE,
    BAD_FIELD,
    UNKNOWN_KB,
    TOO_LONG,
    SCORING_FAILED,
    PARSE_FAILED,
    EMBEDDING_MALFORMED,
    EMBEDDING_NOT_FINITE,
    EMBEDDING_DIMENSION,
    ENCODER_MISSING,
    ENCODER_MISMATCH,
    LANGUAGE_MALFORMED,
)

# The id is the verdict's Kafka key and is repeated in its value: a bound keeps every
# verdict far below the producer's max request size, whatever the client sent.
MAX_ID_CHARS = 256
# Raw bytes of the consumed value kept in a dead letter. Even if every byte became a
# six-character JSON escape (control characters), the record stays under
# MAX_DLQ_RECORD_BYTES, well below the producer's 1,000,000-byte default.
MAX_DLQ_PAYLOAD_BYTES = 64 * 1024
# A dead letter's detail is logged at INFO; exception texts and user values in it are cut
# here so neither the log line nor the record can grow with the input.
MAX_DETAIL_CHARS = 1000
# The largest dead letter, headers and record overhead included, whatever was consumed:
# a payload of 64 KiB of control characters is 384 KiB of escapes, a detail of them 6 KB,
# and the topic name (at most 249 characters), the model version and the other fields a
# few hundred bytes. (The fuzz of tests/unit/test_records_fuzz.py holds every dead letter
# to it; "400 KB" in decimal was 421 bytes short of that worst case.)
MAX_DLQ_RECORD_BYTES = 400 * 1024
# How much of a user-supplied value (an unknown kb) a detail quotes.
MAX_QUOTED_CHARS = 80

NO_MODEL = "no_model"  # verdict reason when fail_mode decided instead of a model


@dataclass(frozen=True)
class Raw:
    """One consumed Kafka record, as the batch sees it."""

    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp_ms: float | None = None  # the record's Kafka timestamp
    # The record's headers as consumed (only the encoder's name and the language are read).
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class Query:
    """A well-formed query, ready to be embedded.

    ``embedding`` and ``encoder`` are the record's fields as read (None when absent): the
    vector is decoded and checked when its batch is scored, against the model that scores
    it (:func:`sidecar.stream._embedding.client_embedding`). ``language`` is the code of
    the language the client gave (field or header), None when it gave none.
    """

    raw: Raw
    id: str
    text: str
    kb: str
    ts: float | None = None
    meta: dict[str, Any] | None = None
    truncated: bool = False
    embedding: Any = None
    encoder: Any = None
    language: str | None = None


@dataclass(frozen=True)
class Rejected:
    """A record that cannot be scored, with its dead-letter reason code."""

    raw: Raw
    reason: str
    detail: str
    kb: str | None = None


@dataclass(frozen=True)
class InputPolicy:
    """What the parser accepts (from ``settings.scoring``)."""

    kbs: Collection[str]
    default_kb: str
    max_text_chars: int = 4000
    overlong: Literal["reject", "truncate"] = "reject"
    max_id_chars: int = MAX_ID_CHARS


def parse_query(raw: Raw, policy: InputPolicy) -> Query | Rejected:
    """Decode and validate one record; never raises."""

    def reject(reason: str, detail: str, kb: str | None = None) -> Rejected:
        return Rejected(raw=raw, reason=reason, detail=detail, kb=kb)

    if raw.value is None:
        return reject(INVALID_JSON, "empty record (null value)")
    try:
        text_doc = raw.value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return reject(UNDECODABLE, f"value is not UTF-8: {exc.reason} at byte {exc.start}")
    try:
        doc = json.loads(text_doc)
    except RecursionError:
        # Deeply nested arrays or objects exhaust the decoder's recursion limit: still
        # just a document we will not read, not a failure of the batch.
        return reject(INVALID_JSON, "not JSON: nested too deeply")
    except ValueError as exc:
        return reject(INVALID_JSON, f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return reject(INVALID_JSON, f"JSON {type(doc).__name__}, expected an object")

    qid = doc.get("id")
    if not isinstance(qid, str) or not qid:
        return reject(MISSING_ID, "'id' must be a non-empty string")
    if len(qid) > policy.max_id_chars:
        return reject(ID_TOO_LONG, f"'id' has {len(qid)} chars, limit {policy.max_id_chars}")
    if not utf8_encodable(qid):
        return reject(BAD_FIELD, "'id' is not valid UTF-8 (it holds a lone surrogate)")
    kb = doc.get("kb", policy.default_kb)
    if kb is None:
        kb = policy.default_kb
    if not isinstance(kb, str):
        return reject(BAD_FIELD, "'kb' must be a string")
    if not utf8_encodable(kb):
        return reject(BAD_FIELD, "'kb' is not valid UTF-8 (it holds a lone surrogate)")
    if "text" not in doc:
        return reject(MISSING_TEXT, "no 'text' field", kb)
    text = doc["text"]
    if not isinstance(text, str):
        return reject(BAD_TEXT_TYPE, f"'text' is {type(text).__name__}, expected a string", kb)
    if not text.strip():
        return reject(EMPTY_TEXT, "'text' is empty", kb)
    if not utf8_encodable(text):
        # The tokenizer would fail on it and take the whole encoder batch into a retry.
        return reject(BAD_FIELD, "'text' is not valid UTF-8 (it holds a lone surrogate)", kb)
    ts = doc.get("ts")
    if ts is not None and not _is_epoch_number(ts):
        return reject(BAD_FIELD, "'ts' must be epoch milliseconds (a finite number)", kb)
    meta = doc.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return reject(BAD_FIELD, "'meta' must be an object", kb)
    try:
        language = client_language(doc.get("language"), raw.headers)
    except DataError as exc:
        return reject(LANGUAGE_MALFORMED, str(exc), kb)
    if kb not in policy.kbs:
        return reject(UNKNOWN_KB, f"kb {quote(kb)} is not served here", kb)
    truncated = False
    if len(text) > policy.max_text_chars:
        if policy.overlong == "reject":
            return reject(
                TOO_LONG, f"text has {len(text)} chars, limit {policy.max_text_chars}", kb
            )
        text, truncated = text[: policy.max_text_chars], True
    # Read as they are: what a client vector is worth depends on the model that scores it.
    embedding = doc.get("embedding")
    encoder = doc.get("encoder") if embedding is not None else None
    return Query(
        raw=raw,
        id=qid,
        text=text,
        kb=kb,
        ts=ts,
        meta=meta,
        truncated=truncated,
        embedding=embedding,
        encoder=encoder,
        language=language,
    )


def utf8_encodable(s: str) -> bool:
    """Whether ``s`` can be written as UTF-8 (no lone surrogates)."""
    # JSON's \ud800 escapes decode to lone surrogates, which no UTF-8 encoder accepts: the
    # key of a verdict, or the tokenizer, would fail on them later, outside this parser.
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_epoch_number(ts: object) -> bool:
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return False
    try:
        # A JSON integer has no size limit; one past float range would raise in isfinite
        # here, and in the latency arithmetic of the verdict later.
        return math.isfinite(float(ts))
    except OverflowError:
        return False


def quote(value: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``repr(value)`` of at most ``limit`` characters, with the full length when cut."""
    r = repr(value[:limit])
    if len(value) <= limit and len(r) <= limit + 2:  # + 2: the quotes
        return r
    return f"{r[:limit]}... ({len(value)} chars)"


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters (plus a note of the full length)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


@dataclass(frozen=True)
class Verdict:
    """The decision for one query."""

    query: Query
    verdict: Literal["ID", "OOD"]
    score: float | None
    threshold: float | None
    detector: str | None
    model_version: str | None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_record(self, *, now_ms: float) -> dict[str, Any]:
        """The JSON document written to the verdict topic at ``now_ms``."""
        q = self.query
        start = q.raw.timestamp_ms if q.raw.timestamp_ms is not None else q.ts
        doc: dict[str, Any] = {
            "id": q.id,
            "kb": q.kb,
            "verdict": self.verdict,
            "score": self.score,
            "threshold": self.threshold,
            "detector": self.detector,
            "model_version": self.model_version,
            # Broker timestamp of the query to the verdict being handed to the producer.
            "latency_ms": round(now_ms - start, 3) if start is not None else None,
            "ts": int(now_ms),
        }
        if q.truncated:
            doc["truncated"] = True
        if self.reason is not None:
            doc["reason"] = self.reason
        doc.update(self.extra)  # e.g. the query's detected language
        return doc


@dataclass(frozen=True)
class DeadLetter:
    """A record that goes to the dead-letter topic instead of a verdict."""

    raw: Raw
    reason: str
    detail: str
    model_version: str | None = None

    def to_record(self, *, now_ms: float) -> dict[str, Any]:
        """The JSON document written to the dead-letter topic at ``now_ms``."""
        payload, encoding = encode_payload(self.raw.value)
        value = self.raw.value
        return {
            "reason": self.reason,
            "detail": clip(self.detail),
            "payload": payload,
            "payload_encoding": encoding,
            "payload_size": len(value) if value is not None else None,
            "payload_truncated": value is not None and len(value) > MAX_DLQ_PAYLOAD_BYTES,
            "topic": self.raw.topic,
            "partition": self.raw.partition,
            "offset": self.raw.offset,
            "model_version": self.model_version,
            "ts": int(now_ms),
        }


def encode_payload(
    value: bytes | None, limit: int = MAX_DLQ_PAYLOAD_BYTES
) -> tuple[str | None, str]:
    """The first ``limit`` bytes of ``value`` as text: UTF-8 when they decode, base64 otherwise.

    The bytes are cut before they are encoded, so a cut base64 payload still decodes to a
    prefix of the original; a UTF-8 one drops the partial character the cut left at its
    end (at most 3 bytes) rather than turning into base64.
    """
    if value is None:
        return None, "none"
    head = value[:limit]
    try:
        # Where the cap cut the value, final=False holds back a character split by the cut
        # instead of raising; a value kept whole must decode to its last byte.
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) == len(value))
    except UnicodeDecodeError:
        return base64.b64encode(head).decode("ascii"), "base64"
    return text, "utf-8"


def dumps(doc: dict[str, Any]) -> bytes:
    """Compact JSON bytes (NaN/inf scores become null: JSON has no such numbers).

    Non-ASCII stays UTF-8 rather than ``\\uXXXX`` escapes: six bytes for each Cyrillic
    letter instead of two would make a dead letter's payload three times its size.
    """
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str, ensure_ascii=False)
    # A lone surrogate (say, in an exception text in a detail) cannot be UTF-8; non-ASCII
    # only ever occurs inside JSON strings, where its backslash escape is the same valid
    # \uXXXX escape that ensure_ascii would have written.
    return text.encode("utf-8", errors="backslashreplace")


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or None when it is missing or not finite."""
    if x is None:
        return None
    fx = float(x)
    return fx if math.isfinite(fx) else None
