"""Queries that carry their embedding, end to end: real broker, real redis-server, a real
``python -m sidecar worker`` process and the real encoder (in the worker, and here for the
client's vectors).

A mix of text-only queries and queries with a base64 or JSON-array embedding (the
encoder named in the record or in its ``sidecar-encoder`` header) all get verdicts that
say whose embedding was scored, and agree with the text path on the same queries; bad
vectors get dead letters with their own reason codes, or, with
``scoring.embedding_fallback=encode``, verdicts from the text that say why. Waits are on
records consumed from the broker, each with a timeout; nothing sleeps in their place.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.streams import WAIT_S, collect, kafka_section, produce_documents, web_section

from sidecar.local import EmbeddedBroker, EmbeddedRedis, WorkerProcess
from sidecar.settings import Settings, load_settings
from sidecar.stream import ENCODER_HEADER, ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENCODER = "all-MiniLM-L6-v2"
N = 12  # demo queries per kind


@pytest.fixture(scope="module")
def store_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as r:
        yield r


@pytest.fixture(scope="module")
def demo_model(local_encoder: Any) -> Any:
    """The demo KB model with the probe embeddings of the encoder that built it."""
    from sidecar.encoders import embed_probes
    from sidecar.local._demo import train_demo_model
    from sidecar.scoring import PROBE_TEXTS

    model = train_demo_model(local_encoder)
    probes = embed_probes(local_encoder.encode)
    return dataclasses.replace(model, encoder_probes=probes, encoder_probe_texts=PROBE_TEXTS)


@pytest.fixture
def make_settings(
    broker: EmbeddedBroker, store_redis: EmbeddedRedis, demo_model: Any
) -> Callable[..., Awaitable[Settings]]:
    from sidecar.local._demo import publish
    from sidecar.persistence import open_store

    async def make(**scoring: Any) -> Settings:
        s = load_settings(
            kafka=kafka_section(broker, partitions=2),
            redis={"url": store_redis.url},
            store={"backend": "redis", "poll_interval_s": 1.0},
            scoring={"batch_max": 32, "batch_timeout_ms": 20, **scoring},
            web=web_section(),
        )
        store = open_store(s)
        try:
            publish(store, demo_model)
        finally:
            store.close()
        await ensure_topics(s)
        return s

    return make


def b64(row: np.ndarray) -> str:
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()


def texts() -> list[str]:
    from sidecar.local._demo import demo_data

    return [text for text, _ in demo_data().labelled()[:N]]


def mixed_records(local_encoder: Any) -> list[tuple[dict[str, Any], list[tuple[str, bytes]]]]:
    """Each demo text three times: text only, base64 with "encoder", JSON array with the
    encoder in the header (scaled by 3: the worker scales client vectors to unit length)."""
    ts = texts()
    E = local_encoder.encode(ts)
    out: list[tuple[dict[str, Any], list[tuple[str, bytes]]]] = []
    for i, (text, row) in enumerate(zip(ts, E, strict=True)):
        out.append(({"id": f"text-{i}", "text": text}, []))
        out.append(
            ({"id": f"b64-{i}", "text": text, "embedding": b64(row), "encoder": ENCODER}, [])
        )
        array = [float(x) for x in 3.0 * row]
        out.append(
            (
                {"id": f"array-{i}", "text": text, "embedding": array},
                [(ENCODER_HEADER, ENCODER.encode())],
            )
        )
    return out


def bad_records(local_encoder: Any) -> list[tuple[dict[str, Any], str]]:
    """One query per way a client vector can be refused, with its reason code."""
    row = local_encoder.encode(["What are the opening hours?"])[0]
    text = "What are the opening hours?"

    def doc(qid: str, **fields: Any) -> dict[str, Any]:
        return {"id": qid, "text": text, **fields}

    nan = row.copy()
    nan[7] = np.nan
    return [
        (doc("bad-b64", embedding="not*base64", encoder=ENCODER), "embedding_malformed"),
        (doc("bad-bytes", embedding="AAAAAAA=", encoder=ENCODER), "embedding_malformed"),
        (doc("bad-nan", embedding=b64(nan), encoder=ENCODER), "embedding_not_finite"),
        (doc("bad-dim", embedding=b64(row[:383]), encoder=ENCODER), "embedding_dimension"),
        (doc("bad-noname", embedding=b64(row)), "encoder_missing"),
        (
            doc("bad-other", embedding=b64(row), encoder="text-embedding-3-small"),
            "encoder_mismatch",
        ),
    ]


def worker(settings: Settings, tmp_path: Path, name: str) -> WorkerProcess:
    return WorkerProcess(settings, log_path=tmp_path / f"{name}.log")


async def test_mixed_text_and_embedded_queries_get_verdicts_and_bad_vectors_dead_letters(
    make_settings: Callable[..., Awaitable[Settings]],
    broker: EmbeddedBroker,
    local_encoder: Any,
    tmp_path: Path,
) -> None:
    import httpx

    s = await make_settings()
    k = s.kafka
    good = mixed_records(local_encoder)
    bad = bad_records(local_encoder)
    records = good[: len(good) // 2] + [(d, []) for d, _ in bad] + good[len(good) // 2 :]
    with worker(s, tmp_path, "w") as w:
        await asyncio.to_thread(w.wait_ready, WAIT_S)
        await produce_documents(broker.bootstrap, k.queries_topic, records)
        got = await collect(
            broker.bootstrap,
            [k.verdicts_topic, k.dlq_topic],
            lambda g: len(g[k.verdicts_topic]) >= len(good) and len(g[k.dlq_topic]) >= len(bad),
        )
        _, metrics = w.get("/metrics")
        sheet_status, sheet = w.get("/encoder/probes")
        probes = local_encoder.encode(sheet["texts"])
        passed = httpx.post(
            w.base_url + "/encoder/probes", json=[b64(r) for r in probes], timeout=10
        )
        rng = np.random.default_rng(0)
        failed = httpx.post(
            w.base_url + "/encoder/probes",
            json={"embeddings": rng.standard_normal(probes.shape).tolist()},
            timeout=10,
        )
        malformed = httpx.post(w.base_url + "/encoder/probes", json=[[1.0]], timeout=10)
        unknown = httpx.get(w.base_url + "/encoder/probes?kb=elsewhere", timeout=10)

    verdicts = {v["id"]: v for v in (json.loads(r.value) for r in got[k.verdicts_topic])}
    assert sorted(verdicts) == sorted(d["id"] for d, _ in good)  # exactly these, once each
    for qid, v in verdicts.items():
        want = "sidecar" if qid.startswith("text-") else "client"
        assert v["embedding_source"] == want, v
        assert "embedding_fallback" not in v
        assert (v["score"] > v["threshold"]) == (v["verdict"] == "OOD")
    # The client's vectors of the same texts, by the same encoder, score as the text path.
    for i in range(N):
        local = verdicts[f"text-{i}"]
        for kind in ("b64", "array"):
            mine = verdicts[f"{kind}-{i}"]
            assert mine["score"] == pytest.approx(local["score"], abs=2e-3), (kind, i)
            if abs(local["score"] - local["threshold"]) > 2e-3:
                assert mine["verdict"] == local["verdict"], (kind, i)

    letters = [json.loads(r.value) for r in got[k.dlq_topic]]
    dead = {json.loads(d["payload"])["id"]: d for d in letters}
    assert {qid: d["reason"] for qid, d in dead.items()} == {d["id"]: why for d, why in bad}
    version = next(iter(verdicts.values()))["model_version"]
    for d in dead.values():
        assert d["model_version"] == version and d["topic"] == k.queries_topic and d["detail"]

    assert f'sidecar_scored_queries_total{{source="client"}} {2.0 * N}' in metrics
    assert f'sidecar_scored_queries_total{{source="sidecar"}} {float(N)}' in metrics
    assert 'sidecar_dlq_total{reason="encoder_mismatch"} 1.0' in metrics

    assert sheet_status == 200 and sheet["encoder"] == ENCODER and sheet["dim"] == 384
    assert sheet["version"] == version and len(sheet["texts"]) == 6
    assert passed.status_code == 200 and passed.json()["ok"] is True, passed.text
    assert passed.json()["worst_cosine"] >= sheet["min_cosine"]
    assert failed.status_code == 200 and failed.json()["ok"] is False
    assert malformed.status_code == 400 and "1 embeddings" in malformed.json()["error"]
    assert unknown.status_code == 404


async def test_the_encode_fallback_scores_refused_vectors_from_their_text(
    make_settings: Callable[..., Awaitable[Settings]],
    broker: EmbeddedBroker,
    local_encoder: Any,
    tmp_path: Path,
) -> None:
    s = await make_settings(embedding_fallback="encode")
    k = s.kafka
    bad = bad_records(local_encoder)
    reference = {"id": "text-only", "text": bad[0][0]["text"]}
    records = [(reference, [])] + [(d, []) for d, _ in bad]
    with worker(s, tmp_path, "w") as w:
        await asyncio.to_thread(w.wait_ready, WAIT_S)
        await produce_documents(broker.bootstrap, k.queries_topic, records)
        got = await collect(
            broker.bootstrap,
            [k.verdicts_topic, k.dlq_topic],
            lambda g: len(g[k.verdicts_topic]) >= len(records),
        )
        _, metrics = w.get("/metrics")

    assert got[k.dlq_topic] == []
    verdicts = {v["id"]: v for v in (json.loads(r.value) for r in got[k.verdicts_topic])}
    assert sorted(verdicts) == sorted(d["id"] for d, _ in records)
    assert "embedding_fallback" not in verdicts["text-only"]
    for d, why in bad:
        v = verdicts[d["id"]]
        assert (v["embedding_source"], v["embedding_fallback"]) == ("sidecar", why)
        # embedded from the same text by the same worker: the text path's score exactly
        assert v["score"] == pytest.approx(verdicts["text-only"]["score"], abs=1e-6)
    assert 'sidecar_embedding_fallbacks_total{reason="embedding_not_finite"} 1.0' in metrics
    assert f'sidecar_scored_queries_total{{source="sidecar"}} {float(len(records))}' in metrics
