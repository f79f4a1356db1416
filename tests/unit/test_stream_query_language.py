"""The language a client gives: tags read as the detector's codes, the record's field and
its sidecar-language header, dead letters for what is not a tag, and the batch using the
client's language instead of detecting it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.stream_fakes import FakeEncoder, FakeHolder, FakeLoaded, FakeModel

from sidecar._language_tags import ALIASES, MAX_TAG_CHARS, language_code
from sidecar.errors import DataError
from sidecar.stream import (
    LANGUAGE_HEADER,
    BatchScorer,
    InputPolicy,
    Query,
    Raw,
    Rejected,
    StreamMetrics,
    parse_query,
)
from sidecar.stream import _records as r

POLICY = InputPolicy(kbs=frozenset({"default"}), default_kb="default", max_text_chars=200)


@pytest.mark.parametrize(
    ("tag", "code"),
    [
        ("nl", "nl"),
        ("NL", "nl"),
        ("nl-NL", "nl"),
        ("nl-BE", "nl"),
        ("pt_BR", "pt"),
        ("pt-PT", "pt"),
        ("zh-Hant", "zh"),  # py3langid tells both scripts as "zh"
        ("zh-Hans-CN", "zh"),
        ("yue", "yue"),  # three letters: the detector knows Cantonese as "yue"
        ("en-US-u-ca-gregory", "en"),
        ("nb", "no"),  # the detector says "no" for Bokmål
        ("nb-NO", "no"),
        ("iw", "he"),  # Java's Hebrew before JDK 17
        ("in-ID", "id"),
        ("und", "und"),
    ],
)
def test_a_tag_becomes_the_detectors_code(tag: str, code: str) -> None:
    assert language_code(tag) == code


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "'language' is null"),
        (3, "'language' is a number"),
        (True, "'language' is a boolean"),
        (["nl"], "'language' is an array"),
        ({"code": "nl"}, "'language' is an object"),
        ("", "'language' is empty"),
        ("   ", "'language' is empty"),
        ("n", "'n' is not a language tag"),
        ("dutch!", "is not a language tag"),
        ("nl-NL,nl;q=0.9", "is not a language tag"),  # an Accept-Language list
        ("pt_BR.UTF-8", "is not a language tag"),  # a POSIX locale with its encoding
        ("nl-", "is not a language tag"),
        (" nl", "is not a language tag"),
        ("nl\n", "is not a language tag"),
        ("x-klingon", "is not a language tag"),
        ("nederl", "is not a language tag"),  # a primary subtag of 2-3 letters
        ("nl-toolongsubtag", "is not a language tag"),
        ("ñl", "is not a language tag"),  # ASCII letters only
        ("n" * (MAX_TAG_CHARS + 1), f"has {MAX_TAG_CHARS + 1} characters"),
    ],
)
def test_what_is_not_a_tag_is_refused_with_a_reason(value: object, says: str) -> None:
    with pytest.raises(DataError) as err:
        language_code(value)
    assert says in str(err.value)


TAGS = st.from_regex(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8}){0,3}", fullmatch=True)


@given(st.one_of(st.text(max_size=60), TAGS))
def test_any_string_is_a_code_of_two_or_three_letters_or_a_data_error(value: str) -> None:
    try:
        code = language_code(value)
    except DataError as exc:
        assert str(exc).startswith("'language' ")
    else:
        assert code.isascii() and code.isalpha() and code.islower() and 2 <= len(code) <= 3
        assert value.lower().startswith(code) or code in ALIASES.values()


@given(TAGS)
def test_every_tag_of_the_pattern_is_read(value: str) -> None:
    code = language_code(value)
    primary = value.replace("_", "-").split("-")[0].lower()
    assert code == ALIASES.get(primary, primary)


def raw(fields: dict[str, object], headers: Sequence[tuple[str, bytes | None]] = ()) -> Raw:
    value = json.dumps({"id": "q1", "text": "Zijn jullie open?", **fields}).encode()
    return Raw(value=value, topic="q", partition=0, offset=3, timestamp_ms=1.0, headers=headers)


def test_the_record_says_its_language_in_the_field_or_the_header() -> None:
    def language(fields: dict[str, object], headers: Sequence[tuple[str, bytes | None]] = ()):
        q = parse_query(raw(fields, headers), POLICY)
        assert isinstance(q, Query), q
        return q.language

    assert language({}) is None
    assert language({"language": "nl-NL"}) == "nl"
    assert language({}, [(LANGUAGE_HEADER, b"pt_BR")]) == "pt"
    assert language({"language": None}, [(LANGUAGE_HEADER, b"zh-Hant")]) == "zh"  # null: absent
    # the field wins, as "encoder" does over the sidecar-encoder header
    assert language({"language": "de"}, [(LANGUAGE_HEADER, b"fr")]) == "de"
    assert language({}, [("other", b"fr")]) is None


@pytest.mark.parametrize(
    ("fields", "headers", "says"),
    [
        ({"language": 31}, [], "'language' is a number, expected a language tag"),
        ({"language": ""}, [], "'language' is empty"),
        ({"language": "nl-NL,en;q=0.5"}, [], "'language' 'nl-NL,en;q=0.5' is not a language tag"),
        ({"language": "x" * 500}, [], "'language' has 500 characters"),
        ({}, [(LANGUAGE_HEADER, b"\xff\xfe")], "the sidecar-language header is not UTF-8 text"),
        ({}, [(LANGUAGE_HEADER, None)], "the sidecar-language header is not UTF-8 text"),
        ({}, [(LANGUAGE_HEADER, b"")], "the sidecar-language header is empty"),
        ({}, [(LANGUAGE_HEADER, b"dutch")], "the sidecar-language header 'dutch' is not"),
        # a bad field is refused even where the header would do
        ({"language": 1}, [(LANGUAGE_HEADER, b"nl")], "'language' is a number"),
    ],
)
def test_a_malformed_language_is_a_dead_letter_with_its_reason(
    fields: dict[str, object], headers: list[tuple[str, bytes | None]], says: str
) -> None:
    out = parse_query(raw(fields, headers), POLICY)
    assert isinstance(out, Rejected)
    assert out.reason == r.LANGUAGE_MALFORMED == "language_malformed"
    assert out.reason in r.REASONS
    assert says in out.detail and len(out.detail) < 200
    assert out.kb == "default"


class CountingTeller:
    """Says 'en' for every text, and keeps the texts it was asked about."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def detect(self, texts: Sequence[str]) -> list[str]:
        self.seen.extend(texts)
        return ["en"] * len(texts)


@dataclass(frozen=True)
class DutchModel(FakeModel):
    """A model with a threshold of its own for Dutch."""

    def threshold_for(self, language: str | None) -> float:
        return 0.9 if language == "nl" else self.threshold


def raws(*docs: dict[str, object]) -> list[Raw]:
    return [
        Raw(value=json.dumps(d).encode(), topic="q", partition=0, offset=i, timestamp_ms=1.0)
        for i, d in enumerate(docs)
    ]


async def test_the_clients_language_picks_the_threshold_and_skips_the_detector() -> None:
    h = FakeHolder({"default": FakeLoaded("default", "v1", DutchModel())})
    teller = CountingTeller()
    scorer = BatchScorer(FakeEncoder(), h, POLICY, languages=teller)
    out = await scorer.score(
        raws(
            {"id": "told", "text": "abcdef", "language": "nl-NL"},  # 0.6: ID under 0.9
            {"id": "guessed", "text": "ghijkl"},  # 0.6, detected "en": OOD over 0.5
            {"id": "bad", "text": "mnopqr", "language": "Nederlands (België)"},
        )
    )
    recs = {v.query.id: v.to_record(now_ms=2.0) for v in out.verdicts}
    got = {
        k: (v["language"], v["language_source"], v["threshold"], v["verdict"])
        for k, v in recs.items()
    }
    assert got == {
        "told": ("nl", "client", 0.9, "ID"),
        "guessed": ("en", "detected", 0.5, "OOD"),
    }
    assert teller.seen == ["ghijkl"]  # the told query was not detected
    assert [(d.raw.offset, d.reason, d.model_version) for d in out.dead] == [
        (2, r.LANGUAGE_MALFORMED, "v1")
    ]
    assert "is not a language tag" in out.dead[0].detail
    dead = out.dead[0].to_record(now_ms=2.0)
    assert dead["reason"] == "language_malformed" and dead["offset"] == 2

    metrics = StreamMetrics()
    metrics.observe_batch(out, now_ms=2.0)
    text = metrics.render().decode()
    assert 'sidecar_query_languages_total{source="client"} 1.0' in text
    assert 'sidecar_query_languages_total{source="detected"} 1.0' in text
    assert 'sidecar_dlq_total{reason="language_malformed"} 1.0' in text
    scorer.encoder_thread.close()


async def test_without_a_detector_the_clients_language_still_counts() -> None:
    h = FakeHolder({"default": FakeLoaded("default", "v1", DutchModel())})
    scorer = BatchScorer(FakeEncoder(), h, POLICY)  # scoring.detect_language=false
    out = await scorer.score(
        raws({"id": "told", "text": "abcdef", "language": "NL"}, {"id": "plain", "text": "ghijkl"})
    )
    recs = {v.query.id: v.to_record(now_ms=2.0) for v in out.verdicts}
    assert (recs["told"]["language"], recs["told"]["language_source"]) == ("nl", "client")
    assert recs["told"]["verdict"] == "ID" and recs["told"]["threshold"] == 0.9
    assert "language" not in recs["plain"] and "language_source" not in recs["plain"]
    assert recs["plain"]["threshold"] == 0.5
    scorer.encoder_thread.close()


class FailingTeller:
    def detect(self, texts: Sequence[str]) -> list[str]:
        raise RuntimeError("detector exploded")


async def test_a_failing_detector_keeps_the_clients_languages() -> None:
    h = FakeHolder({"default": FakeLoaded("default", "v1", DutchModel())})
    scorer = BatchScorer(FakeEncoder(), h, POLICY, languages=FailingTeller())
    out = await scorer.score(
        raws({"id": "told", "text": "abcdef", "language": "nl"}, {"id": "plain", "text": "ghijkl"})
    )
    recs = {v.query.id: v.to_record(now_ms=2.0) for v in out.verdicts}
    assert recs["told"]["language_source"] == "client" and recs["told"]["threshold"] == 0.9
    assert "language" not in recs["plain"] and recs["plain"]["verdict"] == "OOD"
    scorer.encoder_thread.close()


@dataclass(frozen=True)
class CentredDutchModel(DutchModel):
    """A Dutch-threshold model centred by language: it keeps the languages it is given."""

    centering: object = True
    given: list[list[str | None]] = field(default_factory=list)

    def score(self, E: np.ndarray, languages: Sequence[str | None] | None = None) -> np.ndarray:
        self.given.append(list(languages) if languages is not None else [])
        return super().score(E)


async def test_a_centred_model_is_given_each_querys_language_whoever_told_it() -> None:
    model = CentredDutchModel()
    h = FakeHolder({"default": FakeLoaded("default", "v1", model)})
    scorer = BatchScorer(FakeEncoder(), h, POLICY, languages=CountingTeller())
    out = await scorer.score(
        raws({"id": "told", "text": "abcdef", "language": "nl"}, {"id": "plain", "text": "ghijkl"})
    )
    recs = {v.query.id: v.to_record(now_ms=2.0) for v in out.verdicts}
    assert model.given == [["nl", "en"]]
    assert (recs["told"]["language_source"], recs["told"]["threshold"]) == ("client", 0.9)
    assert recs["plain"]["language_source"] == "detected"
    scorer.encoder_thread.close()
