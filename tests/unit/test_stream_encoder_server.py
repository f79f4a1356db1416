"""A worker whose encoder is an embedding server, without the server: the batch follows
fail_mode when it gives no vectors in time, the watcher checks the server's probe vectors
before every install, and the runtime suspends a server whose vectors stop matching.

The server is replaced by httpx's in-memory transport behind the real
:class:`~sidecar.encoders.HttpEncoder`; the integration tests run a real one.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from model_store import AsyncDirectoryStore, DirectoryStore, build_artifact
from sidecar.encoders import HttpEncoder
from sidecar.errors import EncoderInputRejected, EncoderMismatch, EncoderUnavailable
from sidecar.hotswap import LoadedModel, ModelHolder, ModelWatcher
from sidecar.scoring import PROBE_TEXTS, probe_mismatch
from sidecar.settings import load_settings
from sidecar.stream import BatchScorer, DeadLetter, InputPolicy, Raw, Verdict
from sidecar.stream._runtime import Runtime

D = 8
POLICY = InputPolicy(kbs=frozenset({"kb1"}), default_kb="kb1", max_text_chars=200)


def vectors(texts: list[str], tilt: float) -> np.ndarray:
    """A fixed pseudo-random unit vector per text; ``tilt`` turns them all one way, as
    other weights would."""
    rows = []
    for t in texts:
        v = np.random.default_rng([ord(c) for c in t]).normal(size=D)
        v[0] += tilt * np.linalg.norm(v)
        rows.append(v / np.linalg.norm(v))
    return np.asarray(rows, dtype=np.float32)


@dataclass
class Server:
    """What the in-memory server does: embed (with ``tilt``), or answer ``status``."""

    tilt: float = 0.0
    status: int = 200
    calls: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        texts = json.loads(request.content)["input"]
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "injected"}})
        if any("REFUSE" in t for t in texts):
            return httpx.Response(400, json={"error": {"message": "input too long"}})
        data = [
            {"index": i, "embedding": row.tolist()}
            for i, row in enumerate(vectors(texts, self.tilt))
        ]
        return httpx.Response(200, json={"data": data, "model": "fake"})


def encoder(server: Server) -> HttpEncoder:
    return HttpEncoder(
        "fake",
        base_url="http://emb.test/v1",
        transport=httpx.MockTransport(server),
        deadline_s=5.0,
        max_retries=2,
        backoff_s=0.01,
        backoff_max_s=0.02,
    )


@dataclass(frozen=True)
class ProbedModel:
    """A model that recorded the probe embeddings of the weights it was trained with."""

    probes: np.ndarray = field(repr=False)
    threshold: float = 0.5
    detector_name: str = "fake"

    def score(self, E: np.ndarray) -> np.ndarray:
        return np.asarray(E[:, 0], dtype=np.float64)

    def predict(self, E: np.ndarray) -> np.ndarray:
        return self.score(E) > self.threshold

    def check_encoder(self, name: str, dim: int, probes: np.ndarray | None = None) -> None:
        why = probe_mismatch(self.probes, PROBE_TEXTS, probes)
        if why is not None:
            raise EncoderMismatch(why)


def raws(*texts: str) -> list[Raw]:
    docs = [json.dumps({"id": f"q{i}", "text": t}).encode() for i, t in enumerate(texts)]
    return [Raw(value=v, topic="q", partition=0, offset=i) for i, v in enumerate(docs)]


def holder_with(model: ProbedModel) -> ModelHolder:
    holder = ModelHolder(["kb1"])
    holder.install(LoadedModel("kb1", "v1", model, 0.0))
    return holder


# -- the batch --------------------------------------------------------------------------------


@pytest.mark.parametrize(("fail_mode", "verdict"), [("closed", "OOD"), ("open", "ID")])
async def test_a_batch_the_server_misses_follows_fail_mode(fail_mode: str, verdict: str) -> None:
    server = Server(status=503)
    model = ProbedModel(vectors(list(PROBE_TEXTS), 0.0))
    scorer = BatchScorer(encoder(server), holder_with(model), POLICY, fail_mode=fail_mode)  # type: ignore[arg-type]
    out = await scorer.score([*raws("one", "two", "three"), Raw(b"{nope", "q", 0, 9)])
    try:
        assert [(v.verdict, v.reason, v.score) for v in out.verdicts] == [
            (verdict, "encoder_unavailable", None)
        ] * 3
        assert [d.reason for d in out.dead] == ["invalid_json"]  # bad input stays bad input
        # One request and its two retries, not then again text by text.
        assert server.calls == 3 and all(isinstance(v, Verdict) for v in out.verdicts)
    finally:
        scorer.encoder_thread.close()


async def test_a_text_the_server_refuses_is_dead_lettered_alone() -> None:
    model = ProbedModel(vectors(list(PROBE_TEXTS), 0.0))
    scorer = BatchScorer(encoder(Server()), holder_with(model), POLICY)  # type: ignore[arg-type]
    try:
        out = await scorer.score(raws("fine", "REFUSE me", "also fine"))
    finally:
        scorer.encoder_thread.close()
    assert [v.query.id for v in out.verdicts] == ["q0", "q2"]
    assert all(v.reason is None for v in out.verdicts)
    [dead] = out.dead
    assert isinstance(dead, DeadLetter) and dead.reason == "scoring_failed"
    assert "EncoderInputRejected" in dead.detail and "input too long" in dead.detail


# -- the watcher --------------------------------------------------------------------------------


def put_model(store: DirectoryStore, tilt: float, tag: str) -> str:
    """A version (named by ``tag``) whose recorded probes are those of weights ``tilt``."""
    probes = vectors(list(PROBE_TEXTS), tilt)
    artifact = build_artifact(
        kb="kb1",
        encoder={"name": "fake", "dim": D},
        model={"tilt": tilt, "tag": tag},
        arrays={"probes": probes},
    )
    version = store.put(artifact)
    store.promote("kb1", version)
    return version


def load(artifact: Any) -> ProbedModel:
    return ProbedModel(np.asarray(artifact.arrays["probes"]))


async def test_the_watcher_asks_the_server_before_every_install(tmp_path: Path) -> None:
    server = Server(status=503)
    enc = encoder(server)
    store = DirectoryStore(tmp_path)
    holder = ModelHolder(["kb1"])

    async def probe() -> np.ndarray:
        return await asyncio.to_thread(enc.probe)

    watcher = ModelWatcher(
        AsyncDirectoryStore(store),
        holder,
        encoder={"name": "fake", "dim": 0},  # the width comes with the probes
        probe_encoder=probe,
        loader=load,
        warmup=False,
    )
    good = put_model(store, 0.0, "first")
    await watcher.sync()  # the server does not answer: the install waits, not refused
    assert holder.get("kb1") is None
    assert "EncoderUnavailable" in holder.status()["kb1"]["last_error"]
    server.status = 200
    await watcher.sync()
    assert holder.get("kb1").version == good  # type: ignore[union-attr]
    assert watcher.encoder == {"name": "fake", "dim": D}

    server.tilt = 1.0  # other weights behind the same URL: the next version is refused
    other = put_model(store, 0.0, "second")
    await watcher.sync()
    assert holder.get("kb1").version == good  # type: ignore[union-attr]
    assert "EncoderMismatch" in holder.status()["kb1"]["last_error"]
    await watcher.sync()  # refused once, not fetched again
    server.tilt = 0.0
    await watcher.recheck()  # the server changed back: refused versions are tried again
    assert holder.get("kb1").version == other  # type: ignore[union-attr]

    # A rollback to the previous model checks the server's vectors too.
    server.tilt = 1.0
    store.promote("kb1", good)
    await watcher.sync()
    assert holder.get("kb1").version == other  # type: ignore[union-attr]
    server.tilt = 0.0
    await watcher.recheck()
    assert holder.get("kb1").version == good  # type: ignore[union-attr]


# -- the runtime ---------------------------------------------------------------------------------


class Recheck:
    def __init__(self) -> None:
        self.calls = 0

    async def recheck(self) -> None:
        self.calls += 1


async def test_the_runtime_suspends_a_server_whose_vectors_stop_matching() -> None:
    server = Server()
    enc = encoder(server)
    model = ProbedModel(vectors(list(PROBE_TEXTS), 0.0))
    watcher = Recheck()
    settings = load_settings(scoring={"kbs": ["kb1"], "default_kb": "kb1"})
    rt = Runtime(settings, encoder=enc, holder=holder_with(model), store=None, watcher=watcher)
    try:
        assert rt.remote_encoder and not rt.encoder_check()["ok"]  # not answered yet
        await rt._encoder_answered(enc.probe(), back=False)
        assert rt.encoder_ready.is_set() and watcher.calls == 0  # the first answer
        await rt.warm_up()  # waits for that answer only
        check = rt.encoder_check()
        assert check["ok"] and check["server"]["url"] == "http://emb.test/v1/embeddings"

        server.tilt = 1.0
        await rt._encoder_answered(enc.probe(), back=False)
        check = rt.encoder_check()
        assert not check["ok"] and "no longer match version v1" in check["server"]["suspended"]
        with pytest.raises(EncoderUnavailable, match="no longer match"):
            enc.encode(["a query"])
        assert watcher.calls == 1  # the vectors changed: held-back versions are retried

        server.tilt = 0.0
        await rt._encoder_answered(enc.probe(), back=False)
        assert rt.encoder_check()["ok"] and enc.encode(["a query"]).shape == (1, D)

        server.status = 503
        with pytest.raises(EncoderUnavailable):
            enc.encode(["a query"])
        assert not rt.encoder_check()["ok"]
        assert "HTTP 503" in rt.encoder_check()["server"]["error"]
        server.status = 200
        await rt._encoder_answered(enc.probe(), back=True)
        assert rt.encoder_check()["ok"] and watcher.calls == 3  # changed, then back
    finally:
        rt.scorer.encoder_thread.close()
        enc.close()


def test_a_refused_input_is_not_an_outage() -> None:
    enc = encoder(Server())
    with pytest.raises(EncoderInputRejected):
        enc.encode(["REFUSE"])
    assert enc.state().reachable is True


def test_a_worker_with_an_embedding_server_loads_no_language_model() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from sidecar.settings import load_settings\n"
        "from sidecar.stream import create_app\n"
        "s = load_settings(scoring={'encoder_backend': 'http'},\n"
        "                  embedding_server={'base_url': 'http://127.0.0.1:9/v1'})\n"
        "create_app(s)\n"
        "heavy = ('torch', 'onnxruntime', 'transformers', 'sentence_transformers')\n"
        "print(' '.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
