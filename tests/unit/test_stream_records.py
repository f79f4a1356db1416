"""Input parsing and the verdict / dead-letter record shapes (pure, no I/O)."""

from __future__ import annotations

import base64
import json

import pytest

from sidecar.stream import DeadLetter, InputPolicy, Query, Raw, Rejected, Verdict, parse_query
from sidecar.stream import _records as r

POLICY = InputPolicy(kbs=frozenset({"default", "hr"}), default_kb="default", max_text_chars=10)


def raw(value: bytes | None, offset: int = 7) -> Raw:
    return Raw(value=value, topic="q", partition=2, offset=offset, timestamp_ms=1000.0)


def doc(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_valid_query_defaults_to_default_kb() -> None:
    q = parse_query(raw(doc(id="a", text="hello", ts=5, meta={"u": 1})), POLICY)
    assert isinstance(q, Query)
    assert (q.id, q.text, q.kb, q.ts, q.meta, q.truncated) == (
        "a",
        "hello",
        "default",
        5,
        {"u": 1},
        False,
    )


def test_explicit_kb_is_kept() -> None:
    q = parse_query(raw(doc(id="a", text="hello", kb="hr")), POLICY)
    assert isinstance(q, Query) and q.kb == "hr"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe\x00bad", r.UNDECODABLE),
        (b"{not json", r.INVALID_JSON),
        (b"[1, 2]", r.INVALID_JSON),
        (None, r.INVALID_JSON),
        (doc(text="no id"), r.MISSING_ID),
        (doc(id=5, text="int id"), r.MISSING_ID),
        (doc(id="a"), r.MISSING_TEXT),
        (doc(id="a", text="   "), r.EMPTY_TEXT),
        (doc(id="a", text=""), r.EMPTY_TEXT),
        (doc(id="a", text=["x"]), r.BAD_TEXT_TYPE),
        (doc(id="a", text=None), r.BAD_TEXT_TYPE),
        (doc(id="a", text="x", kb=3), r.BAD_FIELD),
        (doc(id="a", text="x", ts="yesterday"), r.BAD_FIELD),
        (doc(id="a", text="x", meta=[1]), r.BAD_FIELD),
        (doc(id="a", text="x", kb="finance"), r.UNKNOWN_KB),
        (doc(id="a", text="x" * 11), r.TOO_LONG),
    ],
)
def test_each_bad_input_class_has_its_reason(value: bytes | None, reason: str) -> None:
    out = parse_query(raw(value), POLICY)
    assert isinstance(out, Rejected)
    assert out.reason == reason
    assert out.reason in r.REASONS
    assert out.detail


def test_overlong_truncate_scores_the_prefix_and_marks_it() -> None:
    policy = InputPolicy(
        kbs={"default"}, default_kb="default", max_text_chars=4, overlong="truncate"
    )
    q = parse_query(raw(doc(id="a", text="abcdefgh")), policy)
    assert isinstance(q, Query)
    assert q.text == "abcd" and q.truncated
    rec = Verdict(q, "ID", 0.1, 0.5, "d", "v1").to_record(now_ms=1500.0)
    assert rec["truncated"] is True


def test_verdict_record_fields_and_latency() -> None:
    q = parse_query(raw(doc(id="a", text="hi")), POLICY)
    assert isinstance(q, Query)
    rec = Verdict(q, "OOD", 2.5, 1.0, "combined", "v9").to_record(now_ms=1012.5)
    assert rec == {
        "id": "a",
        "kb": "default",
        "verdict": "OOD",
        "score": 2.5,
        "threshold": 1.0,
        "detector": "combined",
        "model_version": "v9",
        "latency_ms": 12.5,
        "ts": 1012,
    }


def test_fail_mode_verdict_carries_its_reason() -> None:
    q = parse_query(raw(doc(id="a", text="hi")), POLICY)
    assert isinstance(q, Query)
    rec = Verdict(q, "OOD", None, None, None, None, reason=r.NO_MODEL).to_record(now_ms=2000)
    assert rec["reason"] == "no_model" and rec["model_version"] is None


def test_dead_letter_keeps_utf8_payload_and_position() -> None:
    d = DeadLetter(raw(b'{"id": 1}', offset=42), r.MISSING_ID, "detail", "v1")
    rec = d.to_record(now_ms=5000)
    assert rec["payload"] == '{"id": 1}' and rec["payload_encoding"] == "utf-8"
    assert (rec["topic"], rec["partition"], rec["offset"]) == ("q", 2, 42)
    assert (rec["reason"], rec["model_version"], rec["ts"]) == ("missing_id", "v1", 5000)


def test_dead_letter_base64_for_binary_payload() -> None:
    payload = b"\xff\x00\x80"
    rec = DeadLetter(raw(payload), r.UNDECODABLE, "x").to_record(now_ms=0)
    assert rec["payload_encoding"] == "base64"
    assert base64.b64decode(rec["payload"]) == payload


def test_dumps_turns_non_finite_into_error_not_invalid_json() -> None:
    assert json.loads(r.dumps({"a": 1.5})) == {"a": 1.5}
    assert r.finite_or_none(float("inf")) is None
    assert r.finite_or_none(2) == 2.0
