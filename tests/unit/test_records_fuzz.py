"""Property-based fuzz of the record decoder and the verdict / dead-letter path.

Hostile records (random bytes, invalid UTF-8 and lone surrogates, deep and huge JSON,
numbers where strings belong, duplicate keys, control, RTL and zero-width characters,
1 MB texts, odd keys and headers, and embeddings of every shape with any encoder name
in the record or its header) go through the worker's own batch handler
(:meth:`Runtime.handle`: decode, score, publish, ack) with fakes of the encoder, the
model holder and the producer. Every record must come out as exactly one verdict or one
dead letter, nothing may escape the batch (the worker would halt), and every record
produced must be valid UTF-8 JSON that fits the producer: a dead letter, headers
included, stays under :data:`DLQ_RECORD_BOUND`.

The number of examples comes from the hypothesis profile (``tests/conftest.py``): a
bounded one by default, ``HYPOTHESIS_PROFILE=long`` for 100,000 per test (see
``docs/research/hostile-input.md`` for the long run and its result).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given
from hypothesis import strategies as st
from support.stream_fakes import Event, FakeEncoder, Message, RecordingSend, Sent, holder

from sidecar.settings import load_settings
from sidecar.stream import DeadLetter, Publisher, Raw, Runtime, TopicNames, parse_query
from sidecar.stream import _records as r
from sidecar.stream._embedding import EmbeddingProblem, client_embedding
from sidecar.stream._runtime import _headers

# The worker's producer refuses a record larger than this (faust's
# producer_max_request_size, which create_app leaves at its default; pinned below).
PRODUCER_MAX_REQUEST_SIZE = 1_000_000
# What _records promises of a dead letter whatever was consumed (its payload capped at
# MAX_DLQ_PAYLOAD_BYTES even if every byte becomes a 6-byte escape).
DLQ_RECORD_BOUND = r.MAX_DLQ_RECORD_BYTES
MAX_TEXT_CHARS = 4000
TOPICS = TopicNames(verdicts="verdicts", dlq="dlq", id="id", ood="ood")

# -- strategies ----------------------------------------------------------------------------

# Characters that have broken parsers and log pipelines: controls, NUL, DEL, RTL and
# bidi overrides, zero-width joiners and spaces, BOM, line and paragraph separators,
# lone surrogates (both halves), an astral emoji, a combining mark, JSON's own specials.
ODD_CHARS = (
    "\x00", "\x01", "\x08", "\x1b", "\x1f", "\x7f", "\x85", "\u200b", "\u200c", "\u200d",
    "\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\u2028", "\u2029",
    "\ufeff", "\ufffd", "\ud800", "\udbff", "\udc00", "\udfff", "\U0001f600", "\u0301",
    "\u05d0", "\u0627", '"', "\\", "/", "\n", "\r", "\t", " ", "\u3000", "a", "д", "é",
)  # fmt: skip
# Sizes around the limits: the id cap (256), the text cap (4000), the DLQ payload cap
# (64 KiB), and 1 MB. The large ones are drawn about one time in eight: each costs
# milliseconds to build and to parse.
SMALL_SIZES = (0, 1, 2, 17, 255, 256, 257, 3999, 4000, 4001)
LARGE_SIZES = (65_535, 65_536, 65_537, 1_000_000)
SIZES = SMALL_SIZES * 3 + LARGE_SIZES
SERVED = ("default", "hr")

odd_text = st.text(alphabet=st.sampled_from(ODD_CHARS), max_size=40)
any_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40),
    odd_text,
)


def runs(sizes: Sequence[int]) -> st.SearchStrategy[str]:
    """A run of one character, or of a short odd pattern, ``sizes`` long: a megabyte
    of text without drawing a megabyte of data."""
    return st.builds(
        lambda s, n: (s * n)[:n],
        st.text(st.sampled_from(ODD_CHARS), min_size=1, max_size=3),
        st.sampled_from(sizes),
    )


# Up to 4001 characters anywhere; the query's text may also be 64 KiB or 1 MB.
texts = st.one_of(any_text, runs(SMALL_SIZES))
long_text = runs(SIZES)


@dataclass(frozen=True)
class Tok:
    """JSON source written verbatim (numbers past float range, deep nesting, NaN)."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object as (key, value) pairs: keys may repeat."""

    pairs: tuple[tuple[str, Any], ...]


tokens = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "-0", "1E+2", "0.0"]),
    st.builds(lambda n: "1" + "0" * n, st.sampled_from([18, 19, 308, 309, 400, 4299, 4300, 5000])),
    st.builds(lambda n: "[" * n + "]" * n, st.sampled_from([1, 100, 900, 1000, 5000, 100_000])),
    st.builds(lambda n: '{"a":' * n + "0" + "}" * n, st.sampled_from([1, 500, 1000, 100_000])),
).map(Tok)

keys = st.one_of(
    st.sampled_from(["id", "text", "kb", "ts", "meta", "ID", "Id", "id ", "\ufeffid", ""]),
    any_text,
    st.builds(
        lambda c, n: c * n, st.sampled_from(["k", "\x00", "\ud800"]), st.sampled_from(SMALL_SIZES)
    ),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    texts,
    tokens,
)


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(st.tuples(keys, inner), max_size=4).map(lambda p: Obj(tuple(p))),
        ),
        max_leaves=8,
    )


json_values = _nested(scalars)
# Values any JSON reader takes: no integer past 4300 digits, no nesting past 1000 deep.
tame_values = _nested(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), texts,
        st.sampled_from(["NaN", "Infinity", "1e999", "-0"]).map(Tok),
    )
)  # fmt: skip

# Values of the fields the parser reads: good ones, near misses, and anything at all.
ids = st.one_of(st.text(min_size=1, max_size=300), odd_text, runs(SMALL_SIZES), json_values)
kbs = st.one_of(st.sampled_from([*SERVED, "nope", "", "DEFAULT", "default "]), texts, json_values)
tss = st.one_of(st.floats(), st.integers(), tokens, st.booleans(), st.text(max_size=5))
metas = st.one_of(
    st.none(),
    st.lists(st.tuples(keys, json_values), max_size=3).map(lambda p: Obj(tuple(p))),
    json_values,
)

# Client embeddings: good ones for the fakes' encoder (4 dims), and near misses (another
# width, zeros, NaN and infinities, numbers past float32, bytes that are not whole floats,
# text that is not base64, anything at all).
FAKE_DIM = 4
good_vectors = st.lists(
    st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=FAKE_DIM, max_size=FAKE_DIM
).filter(any)


def as_base64(xs: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(xs)}f", *xs)).decode()


embeddings = st.one_of(
    good_vectors,
    good_vectors.map(as_base64),
    st.lists(st.floats() | st.integers() | st.booleans() | st.none(), max_size=6),
    st.lists(st.floats(width=32), max_size=6).map(as_base64),
    st.binary(max_size=24).map(lambda b: base64.b64encode(b).decode()),
    st.builds(lambda n: [0.5] * n, st.sampled_from([0, 1, 3, 5, 16_384, 16_385])),
    any_text,
    tokens,
    json_values,
)
encoder_names = st.one_of(
    st.sampled_from(["fake", "fake", "fake ", "FAKE", "all-MiniLM-L6-v2", ""]),
    any_text,
    json_values,
)

ABSENT = object()
# Strategies are built once, here: one built inside a composite is built (and its filters
# analysed) again at every draw, which made the fuzz ten times slower.
maybe = {
    name: st.one_of(st.just(ABSENT), values)
    for name, values in (
        ("id", ids),
        ("text", long_text | json_values),
        ("kb", kbs),
        ("ts", tss),
        ("meta", metas),
        ("embedding", embeddings),
        ("encoder", encoder_names),
    )
}
extra_pairs = st.lists(st.tuples(keys, json_values), max_size=3)


@st.composite
def documents(draw: st.DrawFn) -> Obj:
    """A query-shaped object: each field absent, well-typed, or anything; extra keys,
    repeated keys, and the fields in any order."""
    pairs: list[tuple[str, Any]] = []
    for name, values in maybe.items():
        v = draw(values)
        if v is not ABSENT:
            pairs.append((name, v))
    pairs += draw(extra_pairs)
    if pairs and draw(st.booleans()):  # a repeated key: JSON keeps the last one
        name, _ = draw(st.sampled_from(pairs))
        pairs.append((name, draw(json_values)))
    return Obj(tuple(draw(st.permutations(pairs))))


def to_json(v: Any, ascii_only: bool) -> str:
    """JSON source of ``v`` (Tok verbatim, Obj with its repeated keys, NaN allowed)."""
    if isinstance(v, Tok):
        return v.text
    if isinstance(v, Obj):
        body = ",".join(
            json.dumps(k, ensure_ascii=ascii_only) + ":" + to_json(x, ascii_only)
            for k, x in v.pairs
        )
        return "{" + body + "}"
    if isinstance(v, list):
        return "[" + ",".join(to_json(x, ascii_only) for x in v) + "]"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)  # past 4300 digits only as a Tok: str() itself refuses
    return json.dumps(v, ensure_ascii=ascii_only)


prefixes = st.sampled_from([b"", b"", b" \n\t", b"\xef\xbb\xbf", b"\x00"])
suffixes = st.sampled_from([b"", b"", b" ", b"\n", b"x", b"\x00", b"}", b"\xff"])


@st.composite
def encoded(draw: st.DrawFn, doc: st.SearchStrategy[Any]) -> bytes:
    """``doc`` as bytes: \\u escapes or raw UTF-8 (lone surrogates as the invalid bytes
    CESU-8 would write), maybe after a BOM or spaces, maybe with trailing bytes."""
    source = to_json(draw(doc), ascii_only=draw(st.booleans()))
    value = source.encode("utf-8", errors="surrogatepass")
    return draw(prefixes) + value + draw(suffixes)


hostile_values = st.one_of(
    st.none(),  # a tombstone
    st.binary(max_size=300),
    st.builds(lambda b, n: (b * n)[:n], st.binary(min_size=1, max_size=4), st.sampled_from(SIZES)),
    encoded(documents()),
    encoded(json_values),
)


valid_texts = st.one_of(
    any_text,
    st.builds(
        lambda s, n: (s * n)[:n],
        st.text(st.sampled_from(ODD_CHARS), min_size=1, max_size=3),
        st.sampled_from([n for n in SMALL_SIZES if n <= MAX_TEXT_CHARS]),
    ),
).filter(lambda t: t.strip() != "" and r.utf8_encodable(t))


valid_ids = st.text(min_size=1, max_size=r.MAX_ID_CHARS).filter(r.utf8_encodable)
valid_kbs = st.sampled_from([ABSENT, None, *SERVED])
valid_tss = st.one_of(
    st.just(ABSENT),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**63), 2**63),
)
KNOWN = frozenset({"id", "text", "kb", "ts", "meta", "embedding", "encoder"})
tame_objects = st.lists(st.tuples(keys, tame_values), max_size=3).map(lambda p: Obj(tuple(p)))
tame_extra_pairs = st.lists(
    st.tuples(keys.filter(lambda k: k not in KNOWN), tame_values), max_size=3
)


@st.composite
def valid_documents(draw: st.DrawFn) -> Obj:
    """A query the parser must accept: served kb (or none), a usable id and text, odd
    characters and extra keys allowed. Only scoring may still fail on it."""
    pairs: list[tuple[str, Any]] = [("id", draw(valid_ids)), ("text", draw(valid_texts))]
    for name, values in (("kb", valid_kbs), ("ts", valid_tss)):
        v = draw(values)
        if v is not ABSENT:
            pairs.append((name, v))
    if draw(st.booleans()):
        pairs.append(("meta", draw(tame_objects)))
    pairs += draw(tame_extra_pairs)
    return Obj(tuple(draw(st.permutations(pairs))))


def _valid_utf8(doc: Obj, ascii_only: bool, pad: bytes) -> bytes:
    """``doc`` as UTF-8 JSON: raw UTF-8 unless a key or value of it holds a lone
    surrogate, which only a \\u escape can carry."""
    try:
        source = to_json(doc, ascii_only).encode("utf-8")
    except UnicodeEncodeError:
        source = to_json(doc, True).encode("ascii")
    return pad + source + pad


valid_values = st.builds(
    _valid_utf8, valid_documents(), st.booleans(), st.sampled_from([b"", b" ", b"\n\t "])
)
# Which kind of value each field gets, drawn first so that the kinds come in these
# shares (one_of flattens nested one_ofs and spreads its draws over all their branches):
# about a third of these queries bring a vector the model takes, the rest spread over
# every reason code.
EMBEDDING_KINDS = {
    "good": good_vectors,
    "good base64": good_vectors.map(as_base64),
    "one number off": st.builds(
        lambda v, i, x: [*v[:i], x, *v[i + 1 :]],
        good_vectors,
        st.integers(0, FAKE_DIM - 1),
        st.sampled_from([math.nan, math.inf, -math.inf, 1e39, 10**400, True, None, "1.0"]),
    ),
    "one float off, base64": st.builds(
        lambda v, i, x: as_base64([*v[:i], x, *v[i + 1 :]]),
        good_vectors,
        st.integers(0, FAKE_DIM - 1),
        st.sampled_from([math.nan, math.inf, -math.inf]),
    ),
    "anything": embeddings,
    "absent": st.just(ABSENT),
}
ENCODER_KINDS = {
    "the model's": st.just("fake"),
    "anything": encoder_names,
    "absent": st.just(ABSENT),
}
embedding_kinds = st.sampled_from(
    ["good", "good", "good base64", "one number off", "one float off, base64", "anything", "absent"]
)
encoder_kinds = st.sampled_from(["the model's", "the model's", "anything", "absent"])


@st.composite
def embedded_documents(draw: st.DrawFn) -> Obj:
    """A query the parser accepts, with an embedding (often a good one) and an encoder
    name (often the model's), either of them possibly absent or anything at all."""
    doc = draw(valid_documents())
    pairs = list(doc.pairs)
    fields = (
        ("embedding", EMBEDDING_KINDS, embedding_kinds),
        ("encoder", ENCODER_KINDS, encoder_kinds),
    )
    for name, kinds, kind in fields:
        v = draw(kinds[draw(kind)])
        if v is not ABSENT:
            pairs.append((name, v))
    return Obj(tuple(draw(st.permutations(pairs))))


embedded_values = st.builds(
    _valid_utf8, embedded_documents(), st.booleans(), st.sampled_from([b"", b"\n"])
)

# Kafka topic names: [a-zA-Z0-9._-], at most 249 characters.
topics = st.from_regex(r"\A[a-zA-Z0-9._-]{1,249}\Z")
headers = st.lists(
    st.tuples(
        st.one_of(
            any_text,
            st.sampled_from(["reason", "model_version", "id", "", "sidecar-encoder"]),
        ),
        st.one_of(
            st.binary(max_size=64),
            st.builds(lambda n: b"\xff" * n, st.sampled_from(SMALL_SIZES)),
            st.sampled_from([b"fake", b"other", b"\xff", b""]),
        ),
    ),
    max_size=4,
)
record_keys = st.one_of(
    st.none(), st.binary(max_size=64), st.builds(lambda n: b"\x00" * n, st.sampled_from(SIZES))
)
timestamps = st.one_of(st.none(), st.just(0.0), st.floats(min_value=-1.0, max_value=9.2e15))


batch_sizes = st.integers(min_value=1, max_value=5)
partitions = st.integers(min_value=0, max_value=3)


@st.composite
def batches(draw: st.DrawFn, values: st.SearchStrategy[bytes | None]) -> list[Event]:
    """One to five consumed records, in offset order per partition."""
    n = draw(batch_sizes)
    topic = draw(topics)
    out = []
    for offset in range(n):
        msg = Message(
            value=draw(values),
            offset=offset,
            topic=topic,
            partition=draw(partitions),
            timestamp=draw(timestamps),
            key=draw(record_keys),
            headers=draw(headers),
        )
        out.append(Event(msg))
    return out


# -- the worker's batch handler, with fakes -----------------------------------------------


@dataclass
class Worker:
    runtime: Runtime
    send: RecordingSend
    outcomes: list[Any]


_WORKERS: dict[tuple[str, str], Worker] = {}


def worker(overlong: str, fallback: str = "dead_letter") -> Worker:
    """One runtime per input policy for the whole session (one encoder thread each)."""
    key = (overlong, fallback)
    if key not in _WORKERS:
        settings = load_settings(
            scoring={
                "kbs": list(SERVED),
                "max_text_chars": MAX_TEXT_CHARS,
                "overlong": overlong,
                "embedding_fallback": fallback,
            }
        )
        rt = Runtime(
            settings,
            encoder=FakeEncoder(),
            holder=holder(default="v1", hr="h1"),
            store=None,
            watcher=None,
        )
        send = RecordingSend()
        rt.publisher = Publisher(send, TOPICS, clock=lambda: 1_700_000_000.0)
        w = Worker(rt, send, [])
        score = rt.scorer.score

        async def keep(raws: Sequence[Raw]) -> Any:
            out = await score(raws)
            w.outcomes.append(out)
            return out

        rt.scorer.score = keep  # type: ignore[method-assign]
        _WORKERS[key] = w
    w = _WORKERS[key]
    w.send.sent.clear()
    w.outcomes.clear()
    return w


async def _handle(rt: Runtime, events: list[Event]) -> None:
    await rt.handle(events)
    await rt.drain()


def run_batch(
    events: list[Event], overlong: str, fallback: str = "dead_letter"
) -> tuple[Any, list[Sent]]:
    """Hand ``events`` to the worker's batch handler; (outcome, records produced)."""
    w = worker(overlong, fallback)
    asyncio.run(_handle(w.runtime, events))
    assert w.runtime.halted is None, w.runtime.halted
    assert len(w.outcomes) == 1
    return w.outcomes[0], list(w.send.sent)


def record_size(s: Sent) -> int:
    """What the producer weighs against its max request size (aiokafka's own estimate)."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(s.key, s.value, s.headers))


def check_batch(events: list[Event], outcome: Any, sent: list[Sent]) -> None:
    """Exactly one decision per record, every one produced, every record well-formed."""
    offsets = [(e.message.partition, e.message.offset) for e in events]
    decided = [(v.query.raw.partition, v.query.raw.offset) for v in outcome.verdicts]
    decided += [(d.raw.partition, d.raw.offset) for d in outcome.dead]
    assert sorted(decided) == sorted(offsets)  # each record once, none dropped or doubled
    assert all(e.acks == 1 for e in events)  # and the batch was acked: nothing halted
    assert not any(d.reason == r.PARSE_FAILED for d in outcome.dead), [
        d.detail for d in outcome.dead
    ]  # the parser itself never raised (PARSE_FAILED is its safety net, a bug)

    verdicts = [s for s in sent if s.topic == TOPICS.verdicts]
    routed = [s for s in sent if s.topic in (TOPICS.id, TOPICS.ood)]
    dead = [s for s in sent if s.topic == TOPICS.dlq]
    assert len(verdicts) == len(routed) == len(outcome.verdicts)
    assert len(dead) == len(outcome.dead)
    for s in sent:
        doc = json.loads(s.value.decode("utf-8"))  # strict: valid UTF-8, valid JSON
        assert record_size(s) < PRODUCER_MAX_REQUEST_SIZE
        if s.topic == TOPICS.dlq:
            check_dead_letter(s, doc)
        else:
            assert s.key == doc["id"].encode("utf-8")
            assert doc["verdict"] in ("ID", "OOD") and doc["kb"] in SERVED
            assert s.headers == [("model_version", (doc["model_version"] or "").encode())]
            for k in ("score", "threshold", "latency_ms"):
                assert doc[k] is None or math.isfinite(doc[k])
    by_offset = {(e.message.partition, e.message.offset): e.message.value for e in events}
    for d, s in zip(outcome.dead, dead, strict=True):
        doc = json.loads(s.value)
        assert (doc["partition"], doc["offset"]) == (d.raw.partition, d.raw.offset)
        check_payload(doc, by_offset[(d.raw.partition, d.raw.offset)])


def check_dead_letter(s: Sent, doc: dict[str, Any]) -> None:
    assert s.key is None  # a consumed key, however large, is not carried over
    assert [k for k, _ in s.headers] == ["reason", "model_version"]  # nor its headers
    assert doc["reason"] in r.REASONS and doc["reason"].encode() == s.headers[0][1]
    assert len(doc["detail"]) <= r.MAX_DETAIL_CHARS + 30
    assert record_size(s) < DLQ_RECORD_BOUND


def check_payload(doc: dict[str, Any], value: bytes | None) -> None:
    """The dead letter keeps a decodable prefix of the consumed value, and says so."""
    if value is None:
        assert (doc["payload"], doc["payload_encoding"], doc["payload_size"]) == (
            None,
            "none",
            None,
        )
        return
    assert doc["payload_size"] == len(value)
    assert doc["payload_truncated"] == (len(value) > r.MAX_DLQ_PAYLOAD_BYTES)
    if doc["payload_encoding"] == "base64":
        kept = base64.b64decode(doc["payload"], validate=True)
    else:
        assert doc["payload_encoding"] == "utf-8"
        kept = doc["payload"].encode("utf-8")
    assert value.startswith(kept)
    assert len(kept) >= min(len(value), r.MAX_DLQ_PAYLOAD_BYTES) - 3  # at most a split char


# -- the properties ------------------------------------------------------------------------


@given(batches(hostile_values), st.sampled_from(["reject", "truncate"]))
def test_every_hostile_record_gets_one_verdict_or_one_bounded_dead_letter(
    events: list[Event], overlong: str
) -> None:
    outcome, sent = run_batch(events, overlong)
    check_batch(events, outcome, sent)


@given(batches(valid_values | hostile_values), st.sampled_from(["reject", "truncate"]))
def test_well_formed_queries_are_scored_whatever_surrounds_them(
    events: list[Event], overlong: str
) -> None:
    outcome, sent = run_batch(events, overlong)
    check_batch(events, outcome, sent)
    for ev in events:
        raw = Raw(ev.message.value, ev.message.topic, ev.message.partition, ev.message.offset)
        policy = worker(overlong).runtime.scorer.policy
        parsed = parse_query(raw, policy)
        if isinstance(parsed, r.Rejected):
            continue
        # Accepted by the parser: a verdict, or a dead letter only for the fakes' scoring
        # failures (POISON texts, 77 or 99 characters).
        where = (ev.message.partition, ev.message.offset)
        mine = [d for d in outcome.dead if (d.raw.partition, d.raw.offset) == where]
        assert all(d.reason == r.SCORING_FAILED for d in mine), mine


FAKE_MODEL_ENCODER = {"name": "fake", "dim": FAKE_DIM}


@given(
    batches(embedded_values | valid_values | hostile_values),
    st.sampled_from(["dead_letter", "encode"]),
)
def test_any_embedding_gets_the_one_decision_its_vector_earns(
    events: list[Event], fallback: str
) -> None:
    """Whatever a record's embedding, encoder name and headers: one verdict or one
    dead letter, scored from the client's vector exactly when the vector is usable, and
    otherwise dead-lettered with the vector's own reason code (or, with the encode
    fallback, scored from the text and saying why)."""
    outcome, sent = run_batch(events, "reject", fallback)
    check_batch(events, outcome, sent)
    policy = worker("reject", fallback).runtime.scorer.policy
    verdicts = {(v.query.raw.partition, v.query.raw.offset): v for v in outcome.verdicts}
    dead = {(d.raw.partition, d.raw.offset): d for d in outcome.dead}
    for ev in events:
        m = ev.message
        raw = Raw(m.value, m.topic, m.partition, m.offset, headers=_headers(m.headers))
        parsed = parse_query(raw, policy)
        if isinstance(parsed, r.Rejected):
            continue
        where = (m.partition, m.offset)
        got = client_embedding(parsed, FAKE_MODEL_ENCODER)
        if isinstance(got, EmbeddingProblem) and fallback == "dead_letter":
            assert where in dead and dead[where].reason == got.reason, (got, dead.get(where))
            continue
        if where in dead:  # only the fakes' scoring failures, and only for encoded texts
            assert dead[where].reason == r.SCORING_FAILED and not isinstance(got, np.ndarray)
            continue
        rec = verdicts[where].to_record(now_ms=1.0)
        if isinstance(got, np.ndarray):
            assert rec["embedding_source"] == "client"
            assert rec["score"] == pytest.approx(float(got[0]), abs=1e-6)
        else:
            assert rec["embedding_source"] == "sidecar"
            fell_back = got.reason if isinstance(got, EmbeddingProblem) else None
            assert rec.get("embedding_fallback") == fell_back


@given(valid_values)
def test_the_parser_accepts_every_well_formed_query(value: bytes) -> None:
    policy = r.InputPolicy(
        kbs=frozenset(SERVED), default_kb="default", max_text_chars=MAX_TEXT_CHARS
    )
    out = parse_query(Raw(value, "q", 0, 0), policy)
    assert isinstance(out, r.Query), out
    assert r.utf8_encodable(out.id) and out.kb in SERVED and out.text.strip()


@given(
    st.one_of(st.none(), hostile_values),
    topics,
    st.sampled_from(r.REASONS),
    st.one_of(any_text, long_text),
    st.one_of(st.none(), st.text(max_size=300)),
)
def test_any_dead_letter_is_valid_json_under_the_bound(
    value: bytes | None, topic: str, reason: str, detail: str, version: str | None
) -> None:
    """The single DLQ handler, for any consumed value and any detail (exception texts
    with lone surrogates or a megabyte of control characters included)."""
    send = RecordingSend()

    async def go() -> None:
        d = DeadLetter(Raw(value, topic, 2**31 - 1, 2**63 - 1), reason, detail, version)
        await (await Publisher(send, TOPICS).dead_letter(d, now_ms=1.0))

    asyncio.run(go())
    (s,) = send.sent
    doc = json.loads(s.value.decode("utf-8"))
    check_dead_letter(s, doc)
    check_payload(doc, value)


def test_the_worst_dead_letter_is_still_under_the_bound() -> None:
    """64 KiB of control characters (6-byte escapes each), a detail of them and the
    longest topic name: the largest dead letter there is, deterministically, not only
    when the fuzz happens to draw it."""
    send = RecordingSend()
    value = b"\x01" * 2_000_000
    detail = "\x01" * 1_000_000
    version = "20250101T000000Z-0123456789abcdef"

    async def go() -> None:
        d = DeadLetter(Raw(value, "t" * 249, 2**31 - 1, 2**63 - 1), r.INVALID_JSON, detail, version)
        await (await Publisher(send, TOPICS).dead_letter(d, now_ms=1.0))

    asyncio.run(go())
    (s,) = send.sent
    assert DLQ_RECORD_BOUND * 0.95 < record_size(s) < DLQ_RECORD_BOUND
    check_dead_letter(s, json.loads(s.value))


def test_the_bound_is_the_workers_producer_limit() -> None:
    """PRODUCER_MAX_REQUEST_SIZE above is what the worker's faust app configures."""
    pytest.importorskip("faust")
    from sidecar.stream._app import _faust_app

    app = _faust_app(load_settings())
    assert app.conf.producer_max_request_size == PRODUCER_MAX_REQUEST_SIZE
