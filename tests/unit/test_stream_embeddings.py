"""Queries that carry their own embedding: strict decoding, every reason code, and the
batch that scores client vectors without the encoder (pure; fakes of the project's own
encoder and holder protocols)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from support.stream_fakes import (
    Event,
    FakeEncoder,
    FakeHolder,
    FakeLoaded,
    FakeModel,
    Message,
    RecordingSend,
    holder,
)

from sidecar.errors import EncoderUnavailable
from sidecar.settings import load_settings
from sidecar.stream import BatchScorer, InputPolicy, Publisher, Query, Raw, Runtime, TopicNames
from sidecar.stream import _embedding as e
from sidecar.stream import _records as r
from sidecar.stream._metrics import StreamMetrics

POLICY = InputPolicy(kbs=frozenset({"default", "hr"}), default_kb="default", max_text_chars=200)
MODEL = {"name": "fake", "dim": 4}


def b64(*xs: float, fmt: str = "<f") -> str:
    return base64.b64encode(struct.pack(f"<{len(xs)}{fmt[-1]}", *xs)).decode()


def query(embedding: Any, encoder: Any = "fake", headers: Sequence[Any] = ()) -> Query:
    raw = Raw(b"{}", "q", 0, 0, headers=tuple(headers))
    return Query(raw, "a", "text", "default", embedding=embedding, encoder=encoder)


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b64(3.0, 0.0, 0.0, 4.0), [3.0, 0, 0, 4]])
def test_a_vector_decodes_from_base64_or_numbers_scaled_to_unit_length(value: Any) -> None:
    v = e.decode_embedding(value)
    assert isinstance(v, np.ndarray) and v.dtype == np.float32
    assert v.tolist() == pytest.approx([0.6, 0.0, 0.0, 0.8])


def test_base64_is_little_endian_float32() -> None:
    big_endian = base64.b64encode(struct.pack(">4f", 1.0, 2.0, 3.0, 4.0)).decode()
    little = e.decode_embedding(b64(1.0, 2.0, 3.0, 4.0))
    assert isinstance(little, np.ndarray)
    assert little.tolist() == pytest.approx((np.array([1, 2, 3, 4]) / np.sqrt(30)).tolist())
    # the same bytes read the other way round are another vector, not the same one
    other = e.decode_embedding(big_endian)
    assert not (isinstance(other, np.ndarray) and np.allclose(other, little))


@pytest.mark.parametrize(
    ("value", "reason", "said"),
    [
        ("@@@@", r.EMBEDDING_MALFORMED, "not base64"),
        ("AAAAAAA", r.EMBEDDING_MALFORMED, "not base64"),  # bad padding
        ("AAAA AAA=", r.EMBEDDING_MALFORMED, "not base64"),  # whitespace is not base64
        ("AAAAé===", r.EMBEDDING_MALFORMED, "not base64"),  # non-ASCII
        (base64.b64encode(b"\0" * 6).decode(), r.EMBEDDING_MALFORMED, "6 bytes"),
        ("", r.EMBEDDING_MALFORMED, "empty"),
        ([], r.EMBEDDING_MALFORMED, "empty"),
        ([1.0, "2.0", 3.0], r.EMBEDDING_MALFORMED, "component 1 of the embedding is a string"),
        ([1.0, True, 3.0], r.EMBEDDING_MALFORMED, "is a boolean"),
        ([1.0, None], r.EMBEDDING_MALFORMED, "is null"),
        ([[1.0, 2.0]], r.EMBEDDING_MALFORMED, "is an array"),
        ([{"x": 1}], r.EMBEDDING_MALFORMED, "is an object"),
        (3.5, r.EMBEDDING_MALFORMED, "'embedding' is a number"),
        ({"data": [1.0]}, r.EMBEDDING_MALFORMED, "'embedding' is an object"),
        (True, r.EMBEDDING_MALFORMED, "'embedding' is a boolean"),
        ([0, 0.0, -0.0], r.EMBEDDING_MALFORMED, "all zeros"),
        (b64(0.0, 0.0), r.EMBEDDING_MALFORMED, "all zeros"),
        ([1.0, float("nan")], r.EMBEDDING_NOT_FINITE, "component 1 of the embedding is nan"),
        ([float("-inf"), 1.0], r.EMBEDDING_NOT_FINITE, "component 0 of the embedding is -inf"),
        ([1.0, 1e39], r.EMBEDDING_NOT_FINITE, "component 1 of the embedding is past float32"),
        ([1.0, 10**400], r.EMBEDDING_NOT_FINITE, "component 1 of the embedding is past float32"),
        ([1.0, 2**200], r.EMBEDDING_NOT_FINITE, "component 1 of the embedding is past float32"),
        (b64(1.0, float("nan")), r.EMBEDDING_NOT_FINITE, "component 1 of the embedding is nan"),
        (b64(float("inf"), 1.0), r.EMBEDDING_NOT_FINITE, "component 0 of the embedding is inf"),
        ([0.1] * (e.MAX_EMBEDDING_DIM + 1), r.EMBEDDING_DIMENSION, "16385 numbers"),
        ("A" * (e._MAX_BASE64_CHARS + 4), r.EMBEDDING_DIMENSION, "base64 characters"),
    ],
)
def test_every_bad_vector_has_its_reason_code(value: Any, reason: str, said: str) -> None:
    got = e.decode_embedding(value)
    assert isinstance(got, e.EmbeddingProblem), got
    assert got.reason == reason and reason in r.REASONS
    assert said in got.detail, got.detail


def test_the_widest_accepted_vector_decodes() -> None:
    assert isinstance(e.decode_embedding([0.5] * e.MAX_EMBEDDING_DIM), np.ndarray)
    n = e.MAX_EMBEDDING_DIM
    assert isinstance(e.decode_embedding(b64(*([0.5] * n))), np.ndarray)


# -- checked against the model ------------------------------------------------------------


def test_a_query_without_an_embedding_has_none() -> None:
    assert e.client_embedding(query(None), MODEL) is None


def test_the_encoder_comes_from_the_field_or_else_the_header() -> None:
    v = [1.0, 0.0, 0.0, 0.0]
    assert isinstance(e.client_embedding(query(v, "fake"), MODEL), np.ndarray)
    by_header = query(v, None, [("other", b"x"), (e.ENCODER_HEADER, b"fake")])
    assert isinstance(e.client_embedding(by_header, MODEL), np.ndarray)
    # the field wins over the header
    both = query(v, "fake", [(e.ENCODER_HEADER, b"another")])
    assert isinstance(e.client_embedding(both, MODEL), np.ndarray)
    wrong_field = query(v, "another", [(e.ENCODER_HEADER, b"fake")])
    got = e.client_embedding(wrong_field, MODEL)
    assert isinstance(got, e.EmbeddingProblem) and got.reason == r.ENCODER_MISMATCH


@pytest.mark.parametrize(
    ("encoder", "headers", "said"),
    [
        (None, [], "without its encoder"),
        (None, [(e.ENCODER_HEADER, b"\xff\xfe")], "not UTF-8"),
        (None, [(e.ENCODER_HEADER, None)], "not UTF-8"),
        (7, [], "'encoder' is int"),
        ("  ", [], "is not a name"),
        ("\ud800", [], "is not a name"),
    ],
)
def test_an_embedding_without_a_usable_encoder_name_is_encoder_missing(
    encoder: Any, headers: list[Any], said: str
) -> None:
    got = e.client_embedding(query([1.0, 0, 0, 0], encoder, headers), MODEL)
    assert isinstance(got, e.EmbeddingProblem) and got.reason == r.ENCODER_MISSING
    assert said in got.detail


def test_another_encoder_is_refused_whatever_its_vector() -> None:
    got = e.client_embedding(query("not even base64", "text-embedding-3-small"), MODEL)
    assert isinstance(got, e.EmbeddingProblem) and got.reason == r.ENCODER_MISMATCH
    assert "'text-embedding-3-small'" in got.detail and "'fake' (4 dims)" in got.detail


def test_spellings_of_one_packaged_encoder_match() -> None:
    model = {"name": "all-MiniLM-L6-v2", "dim": 4}
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "default"):
        assert isinstance(e.client_embedding(query([1.0, 0, 0, 0], name), model), np.ndarray)
    for name in ("all-minilm-l6-v2", "all-MiniLM-L12-v2", "use-multilingual-v3", "all-MiniLM"):
        got = e.client_embedding(query([1.0, 0, 0, 0], name), model)
        assert isinstance(got, e.EmbeddingProblem) and got.reason == r.ENCODER_MISMATCH
    # a model of a hub encoder records the id's last part (what scoring.encoder gave it)
    bge = {"name": "bge-small-en-v1.5", "dim": 4}
    for name in ("bge-small-en-v1.5", "BAAI/bge-small-en-v1.5"):
        assert isinstance(e.client_embedding(query([1.0, 0, 0, 0], name), bge), np.ndarray)
    got = e.client_embedding(query([1.0, 0, 0, 0], "bge-small-en-v1.5/other"), bge)
    assert isinstance(got, e.EmbeddingProblem) and got.reason == r.ENCODER_MISMATCH


def test_a_vector_of_another_width_is_embedding_dimension() -> None:
    got = e.client_embedding(query([1.0, 0.0, 0.0]), MODEL)
    assert isinstance(got, e.EmbeddingProblem) and got.reason == r.EMBEDDING_DIMENSION
    assert "3 dimensions" in got.detail and "expects 4" in got.detail


def test_the_parser_keeps_the_fields_as_read_and_ignores_an_encoder_without_embedding() -> None:
    value = json.dumps({"id": "a", "text": "t", "embedding": "AAAA", "encoder": "x"}).encode()
    q = r.parse_query(Raw(value, "q", 0, 0), POLICY)
    assert isinstance(q, Query) and (q.embedding, q.encoder) == ("AAAA", "x")
    value = json.dumps({"id": "a", "text": "t", "encoder": 5}).encode()
    q = r.parse_query(Raw(value, "q", 0, 0), POLICY)
    assert isinstance(q, Query) and (q.embedding, q.encoder) == (None, None)
    # "embedding": null is no embedding
    value = json.dumps({"id": "a", "text": "t", "embedding": None}).encode()
    q = r.parse_query(Raw(value, "q", 0, 0), POLICY)
    assert isinstance(q, Query) and q.embedding is None


# -- the batch -----------------------------------------------------------------------------


def raws(*docs: dict[str, Any], headers: Sequence[Any] = ()) -> list[Raw]:
    return [
        Raw(json.dumps(d).encode(), "q", 0, i, timestamp_ms=1.0, headers=tuple(headers))
        for i, d in enumerate(docs)
    ]


def emb(qid: str, vector: Any, text: str = "some text", **more: Any) -> dict[str, Any]:
    return {"id": qid, "text": text, "embedding": vector, "encoder": "fake", **more}


async def test_a_mixed_batch_encodes_only_the_texts_and_keeps_the_order() -> None:
    enc = FakeEncoder()
    batch = raws(
        {"id": "t1", "text": "abc"},  # encoded: 0.3 -> ID
        emb("c1", b64(0.8, 0.6, 0.0, 0.0)),  # its own: 0.8 -> OOD
        {"id": "t2", "text": "abcdefghij"},  # encoded: 1.0 -> OOD
        emb("c2", [0.3, 0.4, 0.0, 0.0], text="x" * 99),  # 0.6; the text would break the model
        emb("c3", [0.1, 0.2, 0.2, 0.0], kb="hr"),  # 1/3 -> ID, the hr model
    )
    scorer = BatchScorer(enc, holder(default="v1", hr="h1"), POLICY)
    out = await scorer.score(batch)
    assert enc.calls == [2]  # one call, with the two texts only
    assert out.dead == []
    got = [
        (v.query.id, v.verdict, v.model_version, v.to_record(now_ms=2.0)["embedding_source"])
        for v in out.verdicts
    ]
    assert got == [
        ("t1", "ID", "v1", "sidecar"),
        ("c1", "OOD", "v1", "client"),
        ("t2", "OOD", "v1", "sidecar"),
        ("c2", "OOD", "v1", "client"),
        ("c3", "ID", "h1", "client"),
    ]
    scores = [v.score for v in out.verdicts]
    assert scores == pytest.approx([0.3, 0.8, 1.0, 0.6, 1 / 3], abs=1e-6)
    assert "embedding_fallback" not in out.verdicts[1].to_record(now_ms=2.0)
    scorer.encoder_thread.close()


async def test_a_batch_of_embedded_queries_never_calls_the_encoder() -> None:
    enc = FakeEncoder()
    scorer = BatchScorer(enc, holder(default="v1"), POLICY)
    out = await scorer.score(raws(*(emb(f"c{i}", [0.1 * i, 1.0, 0, 0]) for i in range(1, 6))))
    assert enc.calls == [] and len(out.verdicts) == 5
    assert {v.extra["embedding_source"] for v in out.verdicts} == {"client"}
    scorer.encoder_thread.close()


BAD = [
    (emb("m", "%%%"), r.EMBEDDING_MALFORMED),
    (emb("n", [1.0, float("nan"), 0, 0]), r.EMBEDDING_NOT_FINITE),
    (emb("d", [1.0, 0.0, 0.0]), r.EMBEDDING_DIMENSION),
    ({"id": "x", "text": "t", "embedding": [1.0, 0, 0, 0]}, r.ENCODER_MISSING),
    (emb("o", [1.0, 0, 0, 0], encoder="text-embedding-3-small"), r.ENCODER_MISMATCH),
]


async def test_each_bad_embedding_is_dead_lettered_with_its_reason_among_verdicts() -> None:
    enc = FakeEncoder()
    batch = raws(
        {"id": "first", "text": "abc"}, *(d for d, _ in BAD), emb("last", [0.2, 1.0, 0, 0])
    )
    scorer = BatchScorer(enc, holder(default="v1"), POLICY)
    out = await scorer.score(batch)
    assert [v.query.id for v in out.verdicts] == ["first", "last"]
    assert [(d.raw.offset, d.reason, d.model_version) for d in out.dead] == [
        (i + 1, reason, "v1") for i, (_, reason) in enumerate(BAD)
    ]
    assert enc.calls == [1]  # only "first": a refused vector is not silently re-embedded
    records = [json.loads(r.dumps(d.to_record(now_ms=1.0))) for d in out.dead]
    assert all(rec["detail"] and rec["payload"] for rec in records)
    scorer.encoder_thread.close()


async def test_the_encode_fallback_embeds_the_texts_of_refused_vectors() -> None:
    enc = FakeEncoder()
    batch = raws(*(d for d, _ in BAD), emb("good", [0.2, 1.0, 0, 0]))
    scorer = BatchScorer(enc, holder(default="v1"), POLICY, embedding_fallback="encode")
    out = await scorer.score(batch)
    assert out.dead == [] and enc.calls == [len(BAD)]
    recs = [v.to_record(now_ms=2.0) for v in out.verdicts]
    assert [(rec["embedding_source"], rec.get("embedding_fallback")) for rec in recs] == [
        *(("sidecar", reason) for _, reason in BAD),
        ("client", None),
    ]
    # the fallback scored the text: FakeEncoder's len/10 for a 9- or 1-character text
    assert recs[0]["score"] == pytest.approx(0.9)
    scorer.encoder_thread.close()


async def test_a_swap_to_a_model_of_another_encoder_never_scores_the_old_vectors() -> None:
    h = holder(default="v1")
    other = FakeModel(encoder={"name": "other", "dim": 4})

    def swap() -> None:  # lands while the batch's texts are being embedded
        h.models["default"] = FakeLoaded("default", "v2", other)

    enc = FakeEncoder(on_encode=swap)
    scorer = BatchScorer(enc, h, POLICY)
    batch = raws({"id": "t", "text": "abc"}, emb("c", [0.2, 1.0, 0, 0]))
    first = await scorer.score(batch)
    # the whole batch, text and vector alike, was scored by the model it was checked for
    assert [(v.query.id, v.model_version) for v in first.verdicts] == [("t", "v1"), ("c", "v1")]
    second = await scorer.score(batch)
    assert [(v.query.id, v.model_version) for v in second.verdicts] == [("t", "v2")]
    assert [(d.reason, d.model_version) for d in second.dead] == [(r.ENCODER_MISMATCH, "v2")]
    assert "'other'" in second.dead[0].detail
    scorer.encoder_thread.close()


class DownEncoder(FakeEncoder):
    """An embedding server that gives no vectors in time."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        self.calls.append(len(texts))
        raise EncoderUnavailable("no answer within the deadline")


async def test_embedded_queries_are_scored_while_the_encoder_is_unavailable() -> None:
    enc = DownEncoder()
    scorer = BatchScorer(enc, holder(default="v1"), POLICY, fail_mode="closed")
    out = await scorer.score(raws({"id": "t", "text": "abc"}, emb("c", [0.2, 1.0, 0, 0])))
    assert enc.calls == [1]
    got = [(v.query.id, v.verdict, v.reason, v.model_version) for v in out.verdicts]
    assert got == [("t", "OOD", "encoder_unavailable", None), ("c", "ID", None, "v1")]
    assert "embedding_source" not in out.verdicts[0].to_record(now_ms=1.0)
    scorer.encoder_thread.close()


async def test_no_model_answers_an_embedded_query_by_fail_mode_too() -> None:
    enc = FakeEncoder()
    scorer = BatchScorer(enc, holder(hr="h1"), POLICY, fail_mode="open")
    out = await scorer.score(raws(emb("c", [0.2, 1.0, 0, 0])))
    assert [(v.verdict, v.reason) for v in out.verdicts] == [("ID", "no_model")]
    scorer.encoder_thread.close()


async def test_the_language_is_told_for_embedded_queries_too() -> None:
    class Teller:
        def detect(self, texts: Sequence[str]) -> list[str]:
            return ["nl" if t.startswith("nl:") else "en" for t in texts]

    scorer = BatchScorer(FakeEncoder(), holder(default="v1"), POLICY, languages=Teller())
    batch = raws({"id": "t", "text": "abc"}, emb("c", [0.2, 1.0, 0, 0], text="nl: hallo"))
    out = await scorer.score(batch)
    assert [v.extra["language"] for v in out.verdicts] == ["en", "nl"]
    scorer.encoder_thread.close()


def test_metrics_count_scored_queries_by_embedding_source_and_fallbacks() -> None:
    from sidecar.stream import BatchOutcome, Verdict

    q = Query(Raw(b"{}", "q", 0, 0), "a", "t", "default")
    outcome = BatchOutcome(
        verdicts=[
            Verdict(q, "ID", 0.1, 0.5, "fake", "v1", extra={"embedding_source": "client"}),
            Verdict(q, "ID", 0.1, 0.5, "fake", "v1", extra={"embedding_source": "sidecar"}),
            Verdict(
                q,
                "ID",
                0.1,
                0.5,
                "fake",
                "v1",
                extra={"embedding_source": "sidecar", "embedding_fallback": "encoder_mismatch"},
            ),
            Verdict(q, "OOD", None, None, None, None, reason="no_model"),
        ]
    )
    m = StreamMetrics()
    text = m.render().decode()
    assert 'sidecar_scored_queries_total{source="client"} 0.0' in text  # from the start
    m.observe_batch(outcome, now_ms=2.0)
    text = m.render().decode()
    assert 'sidecar_scored_queries_total{source="client"} 1.0' in text
    assert 'sidecar_scored_queries_total{source="sidecar"} 2.0' in text
    assert 'sidecar_embedding_fallbacks_total{reason="encoder_mismatch"} 1.0' in text


async def test_the_worker_reads_the_encoder_from_a_record_header() -> None:
    """Through the worker's own batch handler: faust messages, headers as consumed."""
    settings = load_settings(scoring={"kbs": ["default"]})
    rt = Runtime(
        settings, encoder=FakeEncoder(), holder=holder(default="v1"), store=None, watcher=None
    )
    send = RecordingSend()
    topics = TopicNames(verdicts="v", dlq="dlq", id=None, ood=None)
    rt.publisher = Publisher(send, topics, clock=lambda: 1.0)
    value = json.dumps({"id": "c", "text": "t", "embedding": b64(0.2, 1.0, 0, 0)}).encode()
    events = [
        Event(Message(value, 0, headers=[(e.ENCODER_HEADER, b"fake")])),
        Event(Message(value, 1, headers=[])),
    ]
    await rt.handle(events)
    await rt.drain()
    by_topic = {s.topic: json.loads(s.value) for s in send.sent}
    assert by_topic["v"]["embedding_source"] == "client" and by_topic["v"]["verdict"] == "ID"
    assert by_topic["dlq"]["reason"] == r.ENCODER_MISSING and by_topic["dlq"]["offset"] == 1
    rt.scorer.encoder_thread.close()


async def test_a_model_the_check_fails_on_dead_letters_its_vectors_not_the_batch() -> None:
    """A model without an encoder record (a bug, not bad input): parse_failed for the
    query with a vector, verdicts for its neighbours."""

    class NoRecord:
        threshold, detector_name = 0.5, "fake"

        def score(self, E: np.ndarray) -> np.ndarray:
            return np.asarray(E[:, 0], dtype=np.float64)

    h = FakeHolder({"default": FakeLoaded("default", "v1", NoRecord())})  # type: ignore[arg-type]
    scorer = BatchScorer(FakeEncoder(), h, POLICY)
    out = await scorer.score(raws({"id": "t", "text": "abc"}, emb("c", [0.2, 1.0, 0, 0])))
    assert [v.query.id for v in out.verdicts] == ["t"]
    assert [(d.reason, d.model_version) for d in out.dead] == [(r.PARSE_FAILED, "v1")]
    assert "embedding check raised AttributeError" in out.dead[0].detail
    scorer.encoder_thread.close()
