"""The micro-batch path with small fakes of the project's own encoder and holder protocols."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from support.stream_fakes import FakeEncoder, FakeHolder, FakeLoaded, FakeModel, holder

from sidecar.stream import BatchScorer, DeadLetter, InputPolicy, Raw, Verdict
from sidecar.stream import _records as r

POLICY = InputPolicy(kbs=frozenset({"default", "hr"}), default_kb="default", max_text_chars=200)


def raws(*docs: object) -> list[Raw]:
    out = []
    for i, d in enumerate(docs):
        value = d if isinstance(d, bytes) else json.dumps(d).encode()
        out.append(Raw(value=value, topic="q", partition=0, offset=i, timestamp_ms=1.0))
    return out


async def test_every_record_gets_exactly_one_decision_in_order() -> None:
    batch = raws(
        {"id": "short", "text": "abc"},  # score 0.3 -> ID
        b"\xff\xfe",
        {"id": "long", "text": "abcdefghij"},  # score 1.0 -> OOD
        {"id": "x", "text": ""},
        {"id": "hr1", "text": "abcdef", "kb": "hr"},  # score 0.6 -> OOD
        {"id": "y", "text": "q", "kb": "nope"},
    )
    out = await BatchScorer(FakeEncoder(), holder(default="v1", hr="h1"), POLICY).score(batch)
    assert out.size == len(batch)
    assert [(v.query.id, v.verdict, v.model_version) for v in out.verdicts] == [
        ("short", "ID", "v1"),
        ("long", "OOD", "v1"),
        ("hr1", "OOD", "h1"),
    ]
    assert [(d.raw.offset, d.reason) for d in out.dead] == [
        (1, r.UNDECODABLE),
        (3, r.EMPTY_TEXT),
        (5, r.UNKNOWN_KB),
    ]
    assert out.verdicts[0].score == pytest.approx(0.3)
    assert out.verdicts[0].threshold == 0.5 and out.verdicts[0].detector == "fake"
    assert set(out.timings) == {"decode", "encode", "detect", "produce"}


async def test_encoder_runs_off_the_event_loop_on_one_thread() -> None:
    enc = FakeEncoder()
    scorer = BatchScorer(enc, holder(default="v1"), POLICY)
    for i in range(5):
        await scorer.score(raws({"id": f"q{i}", "text": "x"}))
    await scorer.score(raws({"id": "p", "text": "POISON"}, {"id": "ok", "text": "y"}))
    # Every call, retries included, on the same thread, and never on the loop's.
    assert len(enc.threads) == 8 and len(set(enc.threads)) == 1
    assert enc.threads[0] != threading.get_ident()


def test_encoder_threads_leave_one_cpu_unless_set() -> None:
    from sidecar.encoders import available_cpus, encoder_threads

    assert available_cpus() >= 1
    assert encoder_threads(3) == 3
    assert encoder_threads(0) == max(1, available_cpus() - 1)


async def test_one_poison_text_is_dead_lettered_and_its_neighbours_scored() -> None:
    enc = FakeEncoder()
    batch = raws(
        {"id": "a", "text": "ok"}, {"id": "p", "text": "POISON"}, {"id": "b", "text": "fine"}
    )
    out = await BatchScorer(enc, holder(default="v1"), POLICY).score(batch)
    assert [v.query.id for v in out.verdicts] == ["a", "b"]
    assert [(d.raw.offset, d.reason, d.model_version) for d in out.dead] == [
        (1, r.SCORING_FAILED, "v1")
    ]
    assert "tokenizer exploded" in out.dead[0].detail
    assert enc.calls == [3, 1, 1, 1]  # the batch, then one by one


async def test_detector_failure_and_nan_go_to_the_dlq() -> None:
    batch = raws(
        {"id": "a", "text": "ok"}, {"id": "boom", "text": "x" * 99}, {"id": "nan", "text": "y" * 77}
    )
    out = await BatchScorer(FakeEncoder(), holder(default="v1"), POLICY).score(batch)
    assert [v.query.id for v in out.verdicts] == ["a"]
    assert {(d.raw.offset, d.reason) for d in out.dead} == {
        (1, r.SCORING_FAILED),
        (2, r.SCORING_FAILED),
    }


@pytest.mark.parametrize(("fail_mode", "expected"), [("closed", "OOD"), ("open", "ID")])
async def test_no_model_uses_fail_mode_with_reason(fail_mode: str, expected: str) -> None:
    enc = FakeEncoder()
    scorer = BatchScorer(enc, holder(hr="h1"), POLICY, fail_mode=fail_mode)  # type: ignore[arg-type]
    out = await scorer.score(raws({"id": "a", "text": "hello"}))
    assert [(v.verdict, v.reason, v.model_version) for v in out.verdicts] == [
        (expected, "no_model", None)
    ]
    assert enc.calls == []  # nothing to embed


async def test_snapshot_read_once_so_a_swap_mid_batch_waits_for_the_next_batch() -> None:
    h = holder(default="v1")

    def swap() -> None:  # a hot swap landing while the batch is being embedded
        h.models["default"] = FakeLoaded("default", "v2", FakeModel())

    scorer = BatchScorer(FakeEncoder(on_encode=swap), h, POLICY)
    first = await scorer.score(raws(*({"id": str(i), "text": "t"} for i in range(5))))
    assert {v.model_version for v in first.verdicts} == {"v1"}
    assert h.snapshots == 1
    second = await scorer.score(raws({"id": "z", "text": "t"}))
    assert {v.model_version for v in second.verdicts} == {"v2"}


async def test_empty_batch() -> None:
    out = await BatchScorer(FakeEncoder(), holder(default="v1"), POLICY).score([])
    assert out.size == 0


async def test_inputs_that_made_the_parser_raise_are_dead_letters_among_verdicts() -> None:
    batch = raws(
        {"id": "a", "text": "ok"},
        b'{"id":"b","text":"x","ts":1' + b"0" * 400 + b"}",  # past float range
        b"[" * 200_000,  # nested past the recursion limit
        b'{"a":' * 100_000,
        b'{"id":"\\ud800","text":"hello"}',  # a lone surrogate
        {"id": "i" * 600_000, "text": "hello"},
        {"id": "z", "text": "fine"},
    )
    out = await BatchScorer(FakeEncoder(), holder(default="v1"), POLICY).score(batch)
    assert [v.query.id for v in out.verdicts] == ["a", "z"]
    assert [(d.raw.offset, d.reason) for d in out.dead] == [
        (1, r.BAD_FIELD),
        (2, r.INVALID_JSON),
        (3, r.INVALID_JSON),
        (4, r.BAD_FIELD),
        (5, r.ID_TOO_LONG),
    ]


class ExplodingKbs(frozenset[str]):
    """A served-KB set whose lookup of "boom" raises: a stand-in for a parser bug."""

    def __contains__(self, kb: object) -> bool:
        if kb == "boom":
            raise RuntimeError("lookup exploded")
        return super().__contains__(kb)


async def test_a_parser_bug_dead_letters_that_record_not_the_batch() -> None:
    policy = InputPolicy(kbs=ExplodingKbs({"default"}), default_kb="default")
    batch = raws(
        {"id": "a", "text": "ok"}, {"id": "b", "text": "x", "kb": "boom"}, {"id": "c", "text": "y"}
    )
    out = await BatchScorer(FakeEncoder(), holder(default="v1"), policy).score(batch)
    assert [v.query.id for v in out.verdicts] == ["a", "c"]
    assert [(d.raw.offset, d.reason, d.model_version) for d in out.dead] == [
        (1, r.PARSE_FAILED, None)
    ]
    assert out.dead[0].detail == "parser raised RuntimeError: lookup exploded"
    assert r.PARSE_FAILED in r.REASONS


def test_types_are_the_public_ones() -> None:
    assert Verdict.__name__ == "Verdict" and DeadLetter.__name__ == "DeadLetter"


@dataclass(frozen=True)
class FakeLanguageModel(FakeModel):
    """A model with a threshold of its own for Dutch."""

    def threshold_for(self, language: str | None) -> float:
        return 0.9 if language == "nl" else self.threshold


class FakeTeller:
    """Says 'nl' for texts starting with 'nl:', 'en' otherwise; fails on 'BOOM'."""

    def detect(self, texts: Sequence[str]) -> list[str]:
        if any("BOOM" in t for t in texts):
            raise RuntimeError("detector exploded")
        return ["nl" if t.startswith("nl:") else "en" for t in texts]


async def test_the_verdict_carries_the_language_and_its_threshold() -> None:
    model = FakeLanguageModel()
    h = FakeHolder({"default": FakeLoaded("default", "v1", model)})
    scorer = BatchScorer(FakeEncoder(), h, POLICY, languages=FakeTeller())
    out = await scorer.score(raws({"id": "a", "text": "nl:abc"}, {"id": "b", "text": "en:abc"}))
    recs = {v.query.id: v.to_record(now_ms=2.0) for v in out.verdicts}
    # both score 0.6: Dutch meets its own 0.9 (ID), English the global 0.5 (OOD)
    assert (recs["a"]["language"], recs["a"]["threshold"], recs["a"]["verdict"]) == (
        "nl",
        0.9,
        "ID",
    )
    assert (recs["b"]["language"], recs["b"]["threshold"], recs["b"]["verdict"]) == (
        "en",
        0.5,
        "OOD",
    )
    # a failing detector costs the language, never the verdicts
    out = await scorer.score(raws({"id": "c", "text": "nl:BOOM"}))
    rec = out.verdicts[0].to_record(now_ms=2.0)
    assert "language" not in rec and rec["threshold"] == 0.5
    # no detector: no language field, the global threshold
    plain = BatchScorer(FakeEncoder(), h, POLICY)
    rec = (await plain.score(raws({"id": "d", "text": "nl:abc"}))).verdicts[0].to_record(now_ms=2)
    assert "language" not in rec and rec["verdict"] == "OOD"
    scorer.encoder_thread.close()
    plain.encoder_thread.close()
