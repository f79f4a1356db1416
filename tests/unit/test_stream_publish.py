"""Publisher: routing, headers, the single DLQ handler, and delivery failures."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from sidecar.errors import BrokerError
from sidecar.stream import (
    BatchOutcome,
    DeadLetter,
    InputPolicy,
    Publisher,
    Query,
    Raw,
    Rejected,
    StreamMetrics,
    TopicNames,
    Verdict,
    parse_query,
)

# aiokafka's default max_request_size: a larger record makes send() itself raise.
MAX_REQUEST_SIZE = 1_000_000


class TooLarge(Exception):
    """What the fake producer raises, like aiokafka's MessageSizeTooLargeError."""


class FakeSend:
    """Records what is sent; deliveries resolve (or fail for one topic) like a producer's."""

    def __init__(self, fail_topic: str | None = None) -> None:
        self.sent: list[tuple[str, bytes | None, dict[str, Any], dict[str, bytes]]] = []
        self.sizes: list[int] = []
        self.fail_topic = fail_topic

    async def __call__(self, topic: str, key: bytes | None, value: bytes, headers: Any) -> Any:
        size = len(key or b"") + len(value)
        if size > MAX_REQUEST_SIZE:
            raise TooLarge(f"{size} bytes")
        self.sizes.append(size)
        self.sent.append((topic, key, json.loads(value), dict(headers)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if topic == self.fail_topic:
            fut.set_exception(OSError("broker gone"))
        else:
            fut.set_result(None)
        return fut


RAW = Raw(value=b'{"id":"a","text":"t"}', topic="q", partition=1, offset=3, timestamp_ms=100.0)
TOPICS = TopicNames(verdicts="v", dlq="dlq", id="id", ood="ood")


def outcome() -> BatchOutcome:
    qa = Query(RAW, "a", "t", "default")
    qb = Query(RAW, "b", "t", "default")
    return BatchOutcome(
        verdicts=[Verdict(qa, "ID", 0.1, 0.5, "d", "v1"), Verdict(qb, "OOD", 0.9, 0.5, "d", "v1")],
        dead=[DeadLetter(RAW, "empty_text", "'text' is empty", "v1")],
    )


async def test_verdicts_routed_and_dead_letters_sent() -> None:
    send = FakeSend()
    await Publisher(send, TOPICS, clock=lambda: 0.2).publish(outcome())
    assert [(t, k) for t, k, _, _ in send.sent] == [
        ("v", b"a"),
        ("id", b"a"),
        ("v", b"b"),
        ("ood", b"b"),
        ("dlq", None),
    ]
    _, _, verdict, headers = send.sent[0]
    assert verdict["latency_ms"] == 100.0 and headers["model_version"] == b"v1"
    _, _, dl, dl_headers = send.sent[-1]
    assert (dl["reason"], dl["offset"], dl["partition"], dl["topic"]) == ("empty_text", 3, 1, "q")
    assert dl_headers["reason"] == b"empty_text"


async def test_no_routing_copies_when_routing_is_off() -> None:
    send = FakeSend()
    await Publisher(send, TopicNames(verdicts="v", dlq="dlq")).publish(outcome())
    assert [t for t, *_ in send.sent] == ["v", "v", "dlq"]


async def test_failed_delivery_raises_so_the_batch_is_not_acked() -> None:
    with pytest.raises(BrokerError, match="not delivered"):
        await Publisher(FakeSend(fail_topic="dlq"), TOPICS).publish(outcome())


def test_metrics_count_a_batch() -> None:
    m = StreamMetrics()
    out = outcome()
    out.timings["encode"] = 0.02
    m.observe_batch(out, now_ms=150.0)
    m.refresh({"default": ("v1", "d")}, {"default": {"load_failures": 2}}, {("q", 1): 5})
    text = m.render().decode()
    assert 'sidecar_verdicts_total{kb="default",verdict="OOD"} 1.0' in text
    assert 'sidecar_dlq_total{reason="empty_text"} 1.0' in text
    assert "sidecar_records_total 3.0" in text
    assert 'sidecar_model_info{detector="d",kb="default",version="v1"} 1.0' in text
    assert 'sidecar_model_load_failures{kb="default"} 2.0' in text
    assert 'sidecar_consumer_lag{partition="1",topic="q"} 5.0' in text
    assert 'sidecar_stage_seconds_sum{stage="encode"} 0.02' in text
    assert "sidecar_latency_seconds_count 2.0" in text


def test_metrics_show_the_store_active_version_each_replica_read() -> None:
    m = StreamMetrics()

    def active() -> dict[str, str]:
        return {
            s.labels["kb"]: s.labels["version"]
            for family in m.registry.collect()
            if family.name == "sidecar_store_active_info"
            for s in family.samples
            if s.value == 1
        }

    status = {"a": {"store_active": "v2", "load_failures": 1}, "b": {"store_active": None}}
    m.refresh({"a": ("v1", "d")}, status, {})
    assert active() == {"a": "v2"}  # b: no pointer read yet; a: serves v1, behind
    m.refresh({"a": ("v2", "d")}, {"a": {"store_active": "v3"}}, {})
    assert active() == {"a": "v3"}  # the old label set is gone


def test_metrics_mirror_readiness_and_each_check() -> None:
    m = StreamMetrics()

    def samples(name: str) -> dict[str, float]:
        return {
            s.labels.get("check", ""): s.value
            for family in m.registry.collect()
            if family.name == name
            for s in family.samples
        }

    checks = {"partitions": {"ok": True}, "store": {"ok": False, "error": "down"}}
    m.refresh_readiness({"ready": False, "checks": checks})
    assert samples("sidecar_ready") == {"": 0.0}
    assert samples("sidecar_ready_check") == {"partitions": 1.0, "store": 0.0}
    m.refresh_readiness({"ready": True, "checks": {"partitions": {"ok": True}}})
    assert samples("sidecar_ready") == {"": 1.0}
    assert samples("sidecar_ready_check") == {"partitions": 1.0}  # "store" is gone


POLICY = InputPolicy(kbs={"default"}, default_kb="default", max_text_chars=4000)


def decided(*values: bytes) -> BatchOutcome:
    """Parse ``values``: a verdict for each query, a dead letter for each rejection."""
    out = BatchOutcome()
    for i, value in enumerate(values):
        p = parse_query(Raw(value, "q", 0, i, timestamp_ms=1.0), POLICY)
        if isinstance(p, Rejected):
            out.dead.append(DeadLetter(p.raw, p.reason, p.detail, "v1"))
        else:
            out.verdicts.append(Verdict(p, "ID", 0.1, 0.5, "d", "v1"))
    return out


async def test_records_that_used_to_fail_at_publish_are_dead_lettered_and_the_batch_goes() -> None:
    cyrillic = json.dumps({"id": "big", "text": "я" * 250_000}, ensure_ascii=False).encode()
    send = FakeSend()
    await Publisher(send, TopicNames(verdicts="v", dlq="dlq")).publish(
        decided(
            b'{"id":"ok","text":"hello"}',
            b'{"id":"\\ud800","text":"hello"}',  # a lone surrogate: no UTF-8 key exists
            json.dumps({"id": "i" * 600_000, "text": "hello"}).encode(),
            cyrillic,  # too_long, 500 KB of two-byte letters
        )
    )
    assert [(t, k) for t, k, _, _ in send.sent] == [("v", b"ok")] + [("dlq", None)] * 3
    reasons = [(dl["offset"], dl["reason"]) for _, _, dl, _ in send.sent[1:]]
    assert reasons == [(1, "bad_field"), (2, "id_too_long"), (3, "too_long")]
    assert max(send.sizes) < MAX_REQUEST_SIZE // 2
    big = send.sent[-1][2]
    assert big["payload_truncated"] is True and big["payload_size"] == len(cyrillic)


async def test_dead_letter_log_line_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    out = decided(json.dumps({"id": "a", "text": "t", "kb": "k" * 200_000}).encode())
    assert out.dead[0].reason == "unknown_kb"
    with caplog.at_level(logging.INFO, logger="sidecar.stream._publish"):
        await Publisher(FakeSend(), TOPICS).publish(out)
    [line] = [rec.getMessage() for rec in caplog.records if rec.name == "sidecar.stream._publish"]
    assert "unknown_kb" in line and len(line) < 300


async def test_a_long_detail_is_capped_in_record_and_log(caplog: pytest.LogCaptureFixture) -> None:
    send = FakeSend()
    d = DeadLetter(RAW, "scoring_failed", "encoder: " + "x" * 100_000, "v1")
    with caplog.at_level(logging.INFO, logger="sidecar.stream._publish"):
        await Publisher(send, TOPICS).publish(BatchOutcome(dead=[d]))
    detail = send.sent[0][2]["detail"]
    assert detail.startswith("encoder: xxx") and len(detail) < 1100
    assert detail in caplog.records[0].getMessage()
