"""Message shapes on the scoring path: the query in, the verdict and the dead letter out.

Input (``kafka.queries_topic``), JSON::

    {"id": str, "text": str, "kb": str?, "ts": epoch ms?, "meta": object?}

Verdict (``kafka.verdicts_topic``, keyed by ``id``, header ``model_version``)::

    {"id", "kb", "verdict": "ID"|"OOD", "score", "threshold", "detector",
     "model_version", "latency_ms", "ts"}   (+ "truncated": true, + "reason": "no_model")

Dead letter (``kafka.dlq_topic``)::

    {"reason", "detail", "payload", "payload_encoding", "topic", "partition", "offset",
     "model_version", "ts"}

Parsing is pure (no I/O) so that every bad-input class is unit-testable.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

# Reason codes of the dead-letter topic (stable: dashboards and alerts key on them).
UNDECODABLE = "undecodable"  # the value is not UTF-8
INVALID_JSON = "invalid_json"  # not JSON, or JSON but not an object
MISSING_ID = "missing_id"  # no "id", or not a non-empty string
MISSING_TEXT = "missing_text"  # no "text" field
EMPTY_TEXT = "empty_text"  # "text" is empty or only whitespace
BAD_TEXT_TYPE = "bad_text_type"  # "text" is not a string
BAD_FIELD = "bad_field"  # "kb" not a string, "ts" not a number, "meta" not an object
UNKNOWN_KB = "unknown_kb"  # a KB this sidecar does not serve
TOO_LONG = "too_long"  # text over scoring.max_text_chars with overlong = "reject"
SCORING_FAILED = "scoring_failed"  # the encoder or the detector raised on this query

REASONS = (
    UNDECODABLE,
    INVALID_JSON,
    MISSING_ID,
    MISSING_TEXT,
    EMPTY_TEXT,
    BAD_TEXT_TYPE,
    BAD_FIELD,
    UNKNOWN_KB,
    TOO_LONG,
    SCORING_FAILED,
)

NO_MODEL = "no_model"  # verdict reason when fail_mode decided instead of a model


@dataclass(frozen=True)
class Raw:
    """One consumed Kafka record, as the batch sees it."""

    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp_ms: float | None = None  # the record's Kafka timestamp


@dataclass(frozen=True)
class Query:
    """A well-formed query, ready to be embedded."""

    raw: Raw
    id: str
    text: str
    kb: str
    ts: float | None = None
    meta: dict[str, Any] | None = None
    truncated: bool = False


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
    except ValueError as exc:
        return reject(INVALID_JSON, f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return reject(INVALID_JSON, f"JSON {type(doc).__name__}, expected an object")

    qid = doc.get("id")
    if not isinstance(qid, str) or not qid:
        return reject(MISSING_ID, "'id' must be a non-empty string")
    kb = doc.get("kb", policy.default_kb)
    if kb is None:
        kb = policy.default_kb
    if not isinstance(kb, str):
        return reject(BAD_FIELD, "'kb' must be a string")
    if "text" not in doc:
        return reject(MISSING_TEXT, "no 'text' field", kb)
    text = doc["text"]
    if not isinstance(text, str):
        return reject(BAD_TEXT_TYPE, f"'text' is {type(text).__name__}, expected a string", kb)
    if not text.strip():
        return reject(EMPTY_TEXT, "'text' is empty", kb)
    ts = doc.get("ts")
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts)
    ):
        return reject(BAD_FIELD, "'ts' must be epoch milliseconds (a number)", kb)
    meta = doc.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return reject(BAD_FIELD, "'meta' must be an object", kb)
    if kb not in policy.kbs:
        return reject(UNKNOWN_KB, f"kb {kb!r} is not served here", kb)
    truncated = False
    if len(text) > policy.max_text_chars:
        if policy.overlong == "reject":
            return reject(
                TOO_LONG, f"text has {len(text)} chars, limit {policy.max_text_chars}", kb
            )
        text, truncated = text[: policy.max_text_chars], True
    return Query(raw=raw, id=qid, text=text, kb=kb, ts=ts, meta=meta, truncated=truncated)


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
        return doc


@dataclass(frozen=True)
class DeadLetter:
    """A record that goes to the dead-letter topic instead of a verdict."""

    raw: Raw
    reason: str
    detail: str
    model_version: str | None = None

    def to_record(self, *, now_ms: float) -> dict[str, Any]:
        payload, encoding = encode_payload(self.raw.value)
        return {
            "reason": self.reason,
            "detail": self.detail,
            "payload": payload,
            "payload_encoding": encoding,
            "topic": self.raw.topic,
            "partition": self.raw.partition,
            "offset": self.raw.offset,
            "model_version": self.model_version,
            "ts": int(now_ms),
        }


def encode_payload(value: bytes | None) -> tuple[str | None, str]:
    """The original bytes as text: UTF-8 when they decode, base64 otherwise."""
    if value is None:
        return None, "none"
    try:
        return value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def dumps(doc: dict[str, Any]) -> bytes:
    """Compact JSON bytes (NaN/inf scores become null: JSON has no such numbers)."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str).encode("utf-8")


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or None when it is missing or not finite."""
    if x is None:
        return None
    fx = float(x)
    return fx if math.isfinite(fx) else None
