"""The explanation agent end to end: real embedded broker, real HTTP LLM, a faust app.

Requests go onto the audit topic with aiokafka; the agent (in a minimal faust app built
here, the way the stream's app factory registers it) mines rules through the
chat-completions client against :class:`FakeChatLLM` and writes results and dead letters.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from typing import Any

import pytest
from support.fake_llm import FakeChatLLM

from sidecar.explain import brute_force_rules
from sidecar.local import EmbeddedBroker
from sidecar.settings import Settings, load_settings
from sidecar.stream import register_explain_agent
from sidecar.stream._explain_agent import BAD_PREDICATE, INVALID_JSON, TOO_MANY_SOURCES

pytestmark = pytest.mark.integration

SOURCES = [
    {"id": "kb-veltria", "text": "Veltria's capital is Morvane, a port on the Amber Sea."},
    {"id": "kb-cats", "text": "Cats sleep for most of the day."},
    {"id": "kb-travel", "text": "Travellers to Veltria land in its capital."},
    {"id": "kb-morvane", "text": "Morvane is the largest city of its country."},
]


def truth(kept: int) -> bool:
    return bool(kept & 0b0001) or kept & 0b1100 == 0b1100


def _settings(broker: EmbeddedBroker, llm: FakeChatLLM) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        kafka={
            "brokers": broker.url,
            "app_id": f"explain-test-{tag}",
            "audit_topic": f"audit-{tag}",
            "explanations_topic": f"explanations-{tag}",
            "dlq_topic": f"dlq-{tag}",
            "partitions": 1,
            "session_timeout_s": 6.0,
            "fetch_max_wait_ms": EmbeddedBroker.FETCH_MAX_WAIT_MS,
        },
        explain={"enabled": True, "base_url": llm.base_url, "model": "fake", "max_sources": 6},
    )


def _app(settings: Settings) -> Any:
    import faust

    k = settings.kafka
    return faust.App(
        k.app_id,
        broker=k.brokers,
        autodiscover=False,
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="faust-explain-"),
        web_enabled=False,
        broker_session_timeout=k.session_timeout_s,
        broker_heartbeat_interval=1.0,
        consumer_auto_offset_reset="earliest",
        topic_partitions=1,
        topic_allow_declare=True,
    )


async def _collect(broker: EmbeddedBroker, topics: list[str], want: int) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        *topics, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
        group_id=None,
    )  # fmt: skip
    await consumer.start()
    got = []
    try:
        while len(got) < want:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                got.extend(records)
    finally:
        await consumer.stop()
    return got


async def test_agent_explains_requests_and_dead_letters_bad_ones(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaProducer

    with FakeChatLLM(truth) as llm:
        settings = _settings(broker, llm)
        k = settings.kafka
        app = _app(settings)
        register_explain_agent(app, settings)
        requests = [
            json.dumps(
                {
                    "request_id": "good-1",
                    "query": "What is the capital of Veltria?",
                    "sources": SOURCES,
                    "predicate": "contains:Morvane",
                }
            ).encode(),
            b"{not json",
            json.dumps(
                {"request_id": "r2", "query": "q", "sources": SOURCES, "predicate": "x"}
            ).encode(),
            json.dumps(
                {
                    "request_id": "r3",
                    "query": "q",
                    "sources": [{"text": str(i)} for i in range(7)],
                    "predicate": "contains:x",
                }
            ).encode(),
        ]
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for value in requests:
                await producer.send_and_wait(k.audit_topic, value, partition=0)
        finally:
            await producer.stop()
        await app.start()
        try:
            records = await asyncio.wait_for(
                _collect(broker, [k.explanations_topic, k.dlq_topic], want=4), timeout=90
            )
        finally:
            await app.stop()
    results = [json.loads(r.value) for r in records if r.topic == k.explanations_topic]
    dlq = [json.loads(r.value) for r in records if r.topic == k.dlq_topic]
    assert len(results) == 1 and len(dlq) == 3
    res = results[0]
    table = {t: truth(t) for t in range(16)}
    want = [[SOURCES[i]["id"] for i in range(4) if m >> i & 1]
            for m in brute_force_rules("retention", 4, table)]  # fmt: skip
    assert res["request_id"] == "good-1"
    assert res["rules"]["retention"] == want == [["kb-veltria"], ["kb-travel", "kb-morvane"]]
    assert res["rules"]["omission"] == []
    assert res["stats"]["black_box_calls"] == len({r.kept for r in llm.answered()})
    assert sorted(d["reason"] for d in dlq) == sorted(
        [INVALID_JSON, BAD_PREDICATE, TOO_MANY_SOURCES]
    )
    bad_json = next(d for d in dlq if d["reason"] == INVALID_JSON)
    assert bad_json["payload"] == "{not json" and bad_json["topic"] == k.audit_topic
    assert bad_json["offset"] == 1 and bad_json["partition"] == 0
