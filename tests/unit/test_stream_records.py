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
        # A JSON integer has no size limit; this one is beyond float range.
        (b'{"id":"a","text":"x","ts":1' + b"0" * 400 + b"}", r.BAD_FIELD),
        (b"[" * 200_000, r.INVALID_JSON),
        (b'{"a":' * 100_000, r.INVALID_JSON),
        # \ud800 escapes decode to lone surrogates, which cannot be encoded as UTF-8.
        (b'{"id":"\\ud800","text":"hello"}', r.BAD_FIELD),
        (b'{"id":"a","kb":"hr\\udfff","text":"hello"}', r.BAD_FIELD),
        (b'{"id":"a","text":"hel\\ud83dlo"}', r.BAD_FIELD),
        (doc(id="i" * (r.MAX_ID_CHARS + 1), text="x"), r.ID_TOO_LONG),
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


def test_lone_surrogate_details_name_the_field() -> None:
    for value, field in [
        (b'{"id":"\\ud800","text":"hello"}', "'id'"),
        (b'{"id":"a","kb":"\\udfff","text":"hello"}', "'kb'"),
        (b'{"id":"a","text":"\\ud800"}', "'text'"),
    ]:
        out = parse_query(raw(value), POLICY)
        assert isinstance(out, Rejected)
        assert out.detail.startswith(field) and "not valid UTF-8" in out.detail


def test_a_surrogate_pair_escape_is_a_valid_character() -> None:
    q = parse_query(raw(b'{"id":"\\ud83d\\ude00","text":"hi \\ud83d\\ude00"}'), POLICY)
    assert isinstance(q, Query) and q.id == "\N{GRINNING FACE}"


def test_id_length_limit_is_inclusive_and_follows_the_policy() -> None:
    ok = parse_query(raw(doc(id="i" * r.MAX_ID_CHARS, text="x")), POLICY)
    assert isinstance(ok, Query)
    tight = InputPolicy(kbs={"default"}, default_kb="default", max_id_chars=3)
    out = parse_query(raw(doc(id="abcd", text="x")), tight)
    assert isinstance(out, Rejected) and out.reason == r.ID_TOO_LONG
    assert out.detail == "'id' has 4 chars, limit 3"


def test_large_but_float_sized_ts_is_kept() -> None:
    q = parse_query(raw(b'{"id":"a","text":"x","ts":1' + b"0" * 300 + b"}"), POLICY)
    assert isinstance(q, Query) and q.ts == 10**300


def test_unknown_kb_detail_quotes_at_most_a_prefix() -> None:
    out = parse_query(raw(doc(id="a", text="x", kb="k" * 100_000)), POLICY)
    assert isinstance(out, Rejected) and out.reason == r.UNKNOWN_KB
    assert len(out.detail) < 150
    assert "'kkkk" in out.detail and "(100000 chars)" in out.detail
    short = parse_query(raw(doc(id="a", text="x", kb="finance")), POLICY)
    assert isinstance(short, Rejected) and short.detail == "kb 'finance' is not served here"


def test_dead_letter_of_a_huge_non_ascii_query_fits_the_producer() -> None:
    text = "д" * 250_000  # 500 KB of UTF-8
    value = json.dumps({"id": "a", "text": text}, ensure_ascii=False).encode()
    out = parse_query(raw(value), POLICY)
    assert isinstance(out, Rejected) and out.reason == r.TOO_LONG
    rec = DeadLetter(out.raw, out.reason, out.detail).to_record(now_ms=0)
    wire = r.dumps(rec)
    assert len(wire) < 1_000_000  # aiokafka's default max_request_size
    assert rec["payload_truncated"] is True and rec["payload_size"] == len(value)
    assert rec["payload_encoding"] == "utf-8"
    kept = rec["payload"].encode()
    # 21 ASCII bytes, then two-byte letters: the cut at 64 KiB falls inside a letter, whose
    # first half is dropped rather than the payload turning into base64.
    assert value.startswith(kept) and len(kept) == r.MAX_DLQ_PAYLOAD_BYTES - 1
    assert "д" in wire.decode()  # UTF-8 on the wire, not \u escapes


def test_capped_binary_payload_is_still_base64_of_a_prefix() -> None:
    value = b"\xff" + bytes(range(256)) * 1000
    rec = DeadLetter(raw(value), r.UNDECODABLE, "x").to_record(now_ms=0)
    assert rec["payload_encoding"] == "base64" and rec["payload_truncated"] is True
    assert base64.b64decode(rec["payload"]) == value[: r.MAX_DLQ_PAYLOAD_BYTES]
    assert rec["payload_size"] == len(value)


def test_small_payload_is_whole_and_marked_so() -> None:
    rec = DeadLetter(raw(b"{not json"), r.INVALID_JSON, "x").to_record(now_ms=0)
    assert (rec["payload"], rec["payload_size"], rec["payload_truncated"]) == (
        "{not json",
        9,
        False,
    )
    none = DeadLetter(raw(None), r.INVALID_JSON, "x").to_record(now_ms=0)
    assert (none["payload"], none["payload_encoding"], none["payload_size"]) == (
        None,
        "none",
        None,
    )
    assert none["payload_truncated"] is False


def test_incomplete_utf8_at_the_end_of_an_uncut_value_is_base64() -> None:
    value = "д".encode()[:1]  # not cut by the cap: the value itself is broken
    rec = DeadLetter(raw(value), r.UNDECODABLE, "x").to_record(now_ms=0)
    assert rec["payload_encoding"] == "base64"
    assert base64.b64decode(rec["payload"]) == value


def test_dead_letter_detail_is_capped() -> None:
    rec = DeadLetter(raw(b"x"), r.SCORING_FAILED, "e" * 50_000).to_record(now_ms=0)
    assert len(rec["detail"]) <= r.MAX_DETAIL_CHARS + 30
    assert rec["detail"].endswith("(50000 chars)")


def test_dumps_survives_a_lone_surrogate_and_keeps_it_as_an_escape() -> None:
    wire = r.dumps({"detail": "bad \ud800 here", "kb": "знание"})
    assert json.loads(wire) == {"detail": "bad \ud800 here", "kb": "знание"}
    assert "знание".encode() in wire
