"""Queries that say their language, end to end: real broker, real redis-server and a real
``python -m sidecar worker`` process with its language detector on.

A record's ``language`` field (or its ``sidecar-language`` header) picks the model's
threshold for that language, whatever the detector would have said of the text, and the
verdict says ``language_source: client``; a query without one is detected; a tag that is
not one is a dead letter with reason ``language_malformed``. Waits are on records consumed
from the broker, each with a timeout; nothing sleeps in their place.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.streams import (
    WAIT_S,
    collect,
    kafka_section,
    produce_documents,
    tiny_model,
    web_section,
)

from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess
from sidecar.persistence import model_from_artifact, open_store
from sidecar.settings import load_settings
from sidecar.stream import LANGUAGE_HEADER, ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Thresholds no score of the tiny model reaches, each its own: a verdict's threshold says
# which one its query met.
NL, PT = 1000.0, 2000.0
TEXT = "What are the opening hours of the clinic on Saturday?"  # English to the detector


async def test_the_clients_language_meets_its_threshold_and_a_bad_one_is_dead_lettered(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    s = load_settings(
        kafka=kafka_section(broker),
        redis={"url": redis_server.url},
        store={"backend": "redis", "poll_interval_s": 1.0},
        scoring={"batch_max": 16, "batch_timeout_ms": 20, "detect_language": True},
        web=web_section(),
    )
    artifact = tiny_model(3, language_thresholds={"nl": NL, "pt": PT})
    model = model_from_artifact(artifact)
    store = open_store(s)
    try:
        store.promote("default", store.put(artifact))
    finally:
        store.close()
    await ensure_topics(s)
    k = s.kafka
    good = [
        ({"id": "field", "text": TEXT, "language": "nl-NL"}, []),
        ({"id": "header", "text": TEXT}, [(LANGUAGE_HEADER, b"pt_BR")]),
        # the field wins over the header
        ({"id": "both", "text": TEXT, "language": "NL"}, [(LANGUAGE_HEADER, b"pt")]),
        ({"id": "detected", "text": TEXT}, []),
    ]
    bad = [
        ({"id": "list", "text": TEXT, "language": "nl-NL,nl;q=0.9"}, []),
        ({"id": "number", "text": TEXT, "language": 31}, []),
        ({"id": "empty-header", "text": TEXT}, [(LANGUAGE_HEADER, b"")]),
    ]
    with WorkerProcess(s, log_path=tmp_path / "worker.log") as w:
        await asyncio.to_thread(w.wait_ready, WAIT_S)
        await produce_documents(broker.bootstrap, k.queries_topic, good + bad)
        got = await collect(
            broker.bootstrap,
            [k.verdicts_topic, k.dlq_topic],
            lambda g: len(g[k.verdicts_topic]) >= len(good) and len(g[k.dlq_topic]) >= len(bad),
        )
        _, metrics = w.get("/metrics")

    verdicts = {v["id"]: v for v in (json.loads(r.value) for r in got[k.verdicts_topic])}
    assert sorted(verdicts) == sorted(d["id"] for d, _ in good)  # exactly these, once each
    told = {
        qid: (
            verdicts[qid]["language"],
            verdicts[qid]["language_source"],
            verdicts[qid]["threshold"],
        )
        for qid in ("field", "header", "both")
    }
    assert told == {
        "field": ("nl", "client", NL),
        "header": ("pt", "client", PT),
        "both": ("nl", "client", NL),
    }
    for qid in told:
        assert verdicts[qid]["verdict"] == "ID", verdicts[qid]  # no score reaches NL or PT
    guessed = verdicts["detected"]
    assert guessed["language_source"] == "detected"
    assert guessed["language"] not in ("nl", "pt")  # the detector reads English here
    assert guessed["threshold"] == pytest.approx(model.threshold)
    assert guessed["score"] == pytest.approx(verdicts["field"]["score"])  # same text

    letters = [json.loads(r.value) for r in got[k.dlq_topic]]
    dead = {json.loads(d["payload"])["id"]: d for d in letters}
    assert {qid: d["reason"] for qid, d in dead.items()} == {
        "list": "language_malformed",
        "number": "language_malformed",
        "empty-header": "language_malformed",
    }
    assert "'nl-NL,nl;q=0.9' is not a language tag" in dead["list"]["detail"]
    assert "'language' is a number" in dead["number"]["detail"]
    assert "the sidecar-language header is empty" in dead["empty-header"]["detail"]
    for d in dead.values():
        assert d["model_version"] == guessed["model_version"] and d["topic"] == k.queries_topic

    assert 'sidecar_query_languages_total{source="client"} 3.0' in metrics
    assert 'sidecar_query_languages_total{source="detected"} 1.0' in metrics
    assert 'sidecar_dlq_total{reason="language_malformed"} 3.0' in metrics
