"""Prompts, predicates, voting, retry parsing, request validation and the public surface."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sidecar.explain as ex
from sidecar.errors import ConfigError, DataError
from sidecar.explain._client import AnswerCache, parse_retry_after
from sidecar.explain._evaluate import SubsetEvaluator
from sidecar.explain._prompt import NO_SOURCES, Source, build_messages, load_sources
from sidecar.settings import load_settings
from sidecar.stream._explain_agent import (
    BAD_PREDICATE,
    BAD_REQUEST,
    INVALID_JSON,
    TOO_MANY_SOURCES,
    _Rejected,
    dead_letter,
    parse_request,
)


def test_public_surface_is_pinned() -> None:
    assert sorted(ex.__all__) == sorted(
        [
            "AnswerCache",
            "BlackBox",
            "ChatCompletionsClient",
            "Contains",
            "DualMiner",
            "EvaluatorStats",
            "ExplainRequest",
            "ExplainRun",
            "Explanation",
            "FamilyResult",
            "LocalSmolLM2",
            "Messages",
            "MiningReport",
            "MonoMiner",
            "Predicate",
            "ProgressBar",
            "RULE_TYPES",
            "RuleType",
            "Source",
            "SubsetEvaluator",
            "brute_force_rules",
            "build_messages",
            "explain",
            "full_mask",
            "load_sources",
            "local_model_available",
            "members",
            "parse_predicate",
            "run_explain",
            "sources_from_records",
            "to_mask",
        ]
    )


SOURCES = [Source("a", "alpha text"), Source("b", "beta text"), Source("c", "gamma text")]


def test_prompt_keeps_only_kept_sources_in_order_with_stable_markers() -> None:
    user = build_messages("Q?", SOURCES, 0b101)[1]["content"]
    assert "[S1] alpha text" in user and "[S3] gamma text" in user
    assert "[S2]" not in user and "beta" not in user
    assert user.index("[S1]") < user.index("[S3]")
    assert user.endswith("Question: Q?\nAnswer:")
    empty = build_messages("Q?", SOURCES, 0)
    assert NO_SOURCES in empty[1]["content"] and "[S" not in empty[1]["content"]
    # the system prompt is identical whatever is kept
    assert empty[0] == build_messages("Q?", SOURCES, 0b111)[0]


def test_load_sources_errors_are_data_errors(tmp_path: Path) -> None:
    good = tmp_path / "s.jsonl"
    good.write_text('{"id": "x", "text": "t1"}\n\n{"text": "t2"}\n')
    assert [s.id for s in load_sources(good)] == ["x", "S2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        load_sources(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "x", "text": "1"}\n{"id": "x", "text": "2"}\n')
    with pytest.raises(DataError, match="unique"):
        load_sources(dup)
    with pytest.raises(DataError, match=r"sources file not found: .*missing\.jsonl"):
        load_sources(tmp_path / "missing.jsonl")


def _check(spec: str, answer: str) -> bool:
    return asyncio.run(ex.parse_predicate(spec)(answer))


def test_predicates() -> None:
    assert _check("contains:Paris", "It is  paris, France")
    assert not _check("contains:Paris", "Lyon")
    assert _check("regex:\\b19\\d\\d\\b", "born in 1984.")
    assert _check("equals:The Eiffel Tower", "eiffel tower!")
    assert not _check("equals:Eiffel", "Eiffel Tower")
    assert _check("not:contains:Paris", "Lyon")
    assert ex.parse_predicate("not:equals:x").spec == "not:equals:x"
    # contains: whole words; the gold answer "no" is not in "not", "know" or "cannot"
    assert _check("contains:no", "No, they are not.")
    for answer in ("I cannot tell.", "It is not.", "I don't know"):
        assert not _check("contains:no", answer)
    assert _check("contains:New York", "in new york, 1999")
    assert not _check("contains:York", "Yorkshire")
    # punctuation separates words; scripts without spaces match as text
    for answer in ("Paris's museums", "Paris/Lyon", "Paris\u2014the capital", "Paris\u2019s"):
        assert _check("contains:Paris", answer)
    assert _check("contains:COVID-19", "COVID 19 is a disease")
    assert _check("contains:\u5df4\u9ece", "\u6cd5\u56fd\u7684\u9996\u90fd\u662f\u5df4\u9ece\u3002")
    # equals: beyond ASCII (curly quotes, guillemets, full-width letters, composed forms)
    assert _check("equals:don't", "Don\u2019t")
    assert _check("equals:Paris", "\u00abParis\u00bb\u3002")
    assert _check("equals:ABC", "\uff21\uff22\uff23")
    assert _check("equals:Caf\u00e9", "Cafe\u0301")
    assert _check("equals:strasse", "Stra\u00dfe")


def test_bad_predicate_specs_are_config_errors() -> None:
    bad = ("contains", "contains:", "contains:  ", "contains:A", "contains:?", "equals:the")
    bad += ("nope:x", "regex:(", "similar:x:ref")
    for spec in (*bad, "similar:0.5"):
        with pytest.raises(ConfigError):
            ex.parse_predicate(spec)
    with pytest.raises(ConfigError, match="judge"):
        ex.parse_predicate("judge:is it wrong?")


def test_the_judge_takes_only_a_first_word_yes() -> None:
    class Replies:  # the project's BlackBox protocol, replying from a script
        name = "scripted"

        def __init__(self, reply: str) -> None:
            self.reply = reply

        async def complete(self, messages: Any, *, seed: int) -> str:
            return self.reply

        async def aclose(self) -> None:
            pass

    def judged(reply: str) -> bool:
        pred = ex.parse_predicate("judge:Is it a refusal?", black_box=Replies(reply))
        return asyncio.run(pred("I cannot help with that."))

    assert judged("Yes.") and judged("yes, it is")
    assert not judged("Yesterday it would have been.") and not judged("No")


class _TinyEncoder:
    """A fake of the project's Encoder protocol: bag of two words."""

    name = "tiny"
    dim = 2

    def encode(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        v = np.array([[t.count("paris") + 1e-3, t.count("lyon") + 1e-3] for t in texts])
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def test_similarity_predicate_uses_the_encoder_lazily() -> None:
    built = []

    def factory() -> _TinyEncoder:
        built.append(1)
        return _TinyEncoder()

    pred = ex.parse_predicate("similar:0.9:paris", encoder_factory=factory)
    assert built == []  # parsing loads nothing
    assert asyncio.run(pred("paris paris"))
    assert not asyncio.run(pred("lyon"))
    assert built == [1]


def test_the_reported_answer_is_vote_zeros_whichever_vote_finished_first() -> None:
    class Slow:  # the project's BlackBox protocol: the base seed's answer comes last
        name = "slow"

        async def complete(self, messages: Any, *, seed: int) -> str:
            await asyncio.sleep(0.02 * (3 - seed))
            return f"answer of vote {seed}"

        async def aclose(self) -> None:
            pass

    sources = [ex.Source("a", "alpha"), ex.Source("b", "beta")]
    pred = ex.parse_predicate("contains:answer")
    result = asyncio.run(ex.explain("q", sources, pred, Slow(), votes=3, concurrency=3))
    assert result.to_dict()["answer_all_sources"] == "answer of vote 0"


def test_majority_vote_and_seeded_ties_never_resample_cached_subsets() -> None:
    calls: Counter[tuple[int, int]] = Counter()

    async def sample(mask: int, i: int) -> bool:
        calls[(mask, i)] += 1
        await asyncio.sleep(0)
        return i < mask  # mask 2 with 3 votes: True, True, False

    async def go() -> tuple[dict[int, bool], SubsetEvaluator]:
        ev = SubsetEvaluator(sample, votes=3, concurrency=2)
        first = await ev.evaluate([0, 2, 2, 3])
        again = await ev.evaluate([2, 3, 0])
        assert again == {2: True, 3: True, 0: False}
        return first, ev

    first, ev = asyncio.run(go())
    assert first == {0: False, 2: True, 3: True}
    assert set(calls.values()) == {1}  # every (subset, vote) asked exactly once
    assert ev.stats.calls == 3 and ev.stats.requests == 9 and ev.stats.cache_hits == 4

    async def tie(mask: int, i: int) -> bool:
        return i == 0

    coins = [
        asyncio.run(SubsetEvaluator(tie, votes=2, seed=5).evaluate(range(32))) for _ in range(2)
    ]
    assert coins[0] == coins[1]  # seeded: reruns agree
    assert 0 < sum(coins[0].values()) < 32  # a real coin, not a constant


def test_concurrency_is_bounded() -> None:
    live = peak = 0

    async def sample(mask: int, i: int) -> bool:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.001)
        live -= 1
        return True

    asyncio.run(SubsetEvaluator(sample, concurrency=3).evaluate(range(20)))
    assert peak == 3


def test_retry_after_parsing() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < (parse_retry_after(later) or 0) <= 31


def test_answer_cache_keys_cover_model_params_prompt_and_seed(tmp_path: Path) -> None:
    cache = AnswerCache(tmp_path)
    msgs = [{"role": "user", "content": "hi"}]
    k = AnswerCache.key("m", {"temperature": 0.0}, msgs, 0)
    others = {
        AnswerCache.key("m2", {"temperature": 0.0}, msgs, 0),
        AnswerCache.key("m", {"temperature": 0.5}, msgs, 0),
        AnswerCache.key("m", {"temperature": 0.0}, [{"role": "user", "content": "ho"}], 0),
        AnswerCache.key("m", {"temperature": 0.0}, msgs, 1),
    }
    assert k not in others and len(others) == 4
    assert cache.get(k) is None
    cache.put(k, "hello", {"model": "m"})
    assert cache.get(k) == "hello"
    (tmp_path / f"{k}.json").write_text("{broken")
    assert cache.get(k) is None


def _req(**kw: object) -> bytes:
    doc = {
        "request_id": "r1",
        "query": "q?",
        "sources": [{"id": "a", "text": "t"}],
        "predicate": "contains:x",
        **kw,
    }
    return json.dumps(doc).encode()


def test_request_validation_reason_codes() -> None:
    settings = load_settings(explain={"max_sources": 3})
    ok = parse_request(_req(), settings)
    assert ok.rules == ("retention", "omission") and ok.miner == "dual" and ok.votes == 1
    cases = {
        b"\xff\xfe": INVALID_JSON,
        b"[1, 2]": INVALID_JSON,
        _req(request_id=""): BAD_REQUEST,
        _req(query=7): BAD_REQUEST,
        _req(sources=[]): BAD_REQUEST,
        _req(sources=[{"id": "a"}]): BAD_REQUEST,
        _req(sources=[{"text": str(i)} for i in range(4)]): TOO_MANY_SOURCES,
        _req(rules=["both"]): BAD_REQUEST,
        _req(miner="tri"): BAD_REQUEST,
        _req(votes=0): BAD_REQUEST,
        _req(predicate=None): BAD_PREDICATE,
        # Bad input, not a failure of the miner (they were explain_failed, with a traceback)
        b'{"request_id": "r", "votes": ' + b"9" * 5000 + b"}": INVALID_JSON,
        _req(query="q\ud800"): BAD_REQUEST,
        _req(predicate="contains:\ud800"): BAD_REQUEST,
        _req(sources=[{"id": "a", "text": "Paris \udfff"}]): BAD_REQUEST,
        _req(sources=[{"id": "\ud800", "text": "Paris"}]): BAD_REQUEST,
        # UTF-16 JSON, which json.loads of bytes would take, is refused as the queries are
        json.dumps({"request_id": "r", "query": "q"}).encode("utf-16"): INVALID_JSON,
    }
    for value, reason in cases.items():
        with pytest.raises(_Rejected) as info:
            parse_request(value, settings)
        assert info.value.reason == reason, value
    rec = dead_letter(b"\xff", "t", 2, 9, INVALID_JSON, "x")
    assert set(rec) == {
        "reason", "detail", "payload", "payload_encoding", "payload_size", "payload_truncated",
        "topic", "partition", "offset", "model_version", "ts",
    }  # fmt: skip
    assert rec["payload_encoding"] == "base64" and rec["offset"] == 9


def test_requests_that_break_the_parsers_are_dead_letters_not_crashes() -> None:
    from sidecar.stream._explain_agent import BAD_PREDICATE, INVALID_JSON, ExplainHandler

    settings = load_settings()
    k = settings.kafka
    handler = ExplainHandler(settings, _TableBlackBox())
    deep_regex = _req(sources=[{"id": "a", "text": "t"}], predicate="regex:" + "(" * 5000)
    for value, reason in ((b"[" * 200_000, INVALID_JSON), (deep_regex, BAD_PREDICATE)):
        topic, key, out = asyncio.run(handler.handle(value, "t", 0, 3))
        assert (topic, key) == (k.dlq_topic, None) and json.loads(out)["reason"] == reason


def test_request_ids_must_be_keys_and_dead_letters_stay_small() -> None:
    from sidecar.stream._records import MAX_DLQ_PAYLOAD_BYTES, dumps

    settings = load_settings()
    for rid in ("\ud800", "r" * 257):  # a lone surrogate cannot be a key; nor can 257 chars
        value = json.dumps({"request_id": rid, "query": "q", "sources": [], "predicate": "x"})
        with pytest.raises(_Rejected, match="request_id") as info:
            parse_request(value.encode(), settings)
        assert info.value.reason == BAD_REQUEST
    big = json.dumps({"request_id": "r", "query": "ж" * 400_000}).encode()  # 800 KB of UTF-8
    rec = dead_letter(big, "t", 0, 1, BAD_REQUEST, "d" * 10_000)
    assert rec["payload_truncated"] and rec["payload_size"] == len(big)
    assert len(rec["payload"].encode()) <= MAX_DLQ_PAYLOAD_BYTES
    assert len(dumps(rec)) < 100_000 and len(rec["detail"]) < 1100  # cut, with a note


def test_local_model_absence_is_a_clear_error() -> None:
    if ex.local_model_available():
        pytest.skip("the local model is installed here")
    with pytest.raises(ConfigError, match="pip install"):
        ex.LocalSmolLM2()


class _TableBlackBox:
    """A fake of the project's BlackBox protocol: answers from the kept markers."""

    name = "table"

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail

    async def complete(self, messages: list[dict[str, str]], *, seed: int) -> str:
        if self.fail is not None:
            raise self.fail
        return "Morvane" if "[S1]" in messages[-1]["content"] else "no idea"

    async def aclose(self) -> None:
        return None


def test_handler_results_and_dead_letters_without_kafka() -> None:
    from sidecar.errors import BlackBoxError
    from sidecar.stream._explain_agent import BLACK_BOX_FAILED, EXPLAIN_FAILED, ExplainHandler

    settings = load_settings()
    k = settings.kafka
    req = _req(sources=[{"id": "a", "text": "t"}, {"id": "b", "text": "u"}],
               predicate="contains:Morvane")  # fmt: skip
    topic, key, value = asyncio.run(
        ExplainHandler(settings, _TableBlackBox()).handle(req, "t", 0, 5)
    )
    doc = json.loads(value)
    assert (topic, key) == (k.explanations_topic, b"r1")
    assert doc["request_id"] == "r1" and doc["rules"]["retention"] == [["a"]]
    for exc, reason in ((BlackBoxError("down"), BLACK_BOX_FAILED), (KeyError("x"), EXPLAIN_FAILED)):
        handler = ExplainHandler(settings, _TableBlackBox(fail=exc))
        topic, key, value = asyncio.run(handler.handle(req, "t", 0, 6))
        assert topic == k.dlq_topic and key is None
        assert json.loads(value)["reason"] == reason
