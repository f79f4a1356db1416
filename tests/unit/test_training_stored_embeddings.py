"""Inputs that carry their embeddings are not encoded again: only a sample, as proof that
the model's encoder made them (a counting encoder of our own protocol shows which texts
were encoded; the embedding cache is never opened)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.scoring import PROBE_TEXTS
from sidecar.settings import load_settings
from sidecar.training import InputSources, load_inputs
from sidecar.training._jsonl import DEMO_KB, demo_path

DIM = 16


class CountingEncoder:
    """Texts to unit vectors seeded by their hash; remembers every text it encoded."""

    name = "counting-encoder"
    dim = DIM

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        self.encoded.extend(texts)
        return np.stack([embed(t) for t in texts]) if texts else np.empty((0, DIM), np.float32)


def embed(text: str, dim: int = DIM) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).normal(size=dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


def write_set(path: Path, texts: list[str], *, kb: bool, vectors: np.ndarray | None = None) -> Path:
    """A Parquet input: id (KB), text and, given ``vectors``, embedding."""
    cols: dict[str, object] = {"text": texts}
    if kb:
        cols = {"id": [f"doc-{i}" for i in range(len(texts))], **cols}
    if vectors is not None:
        cols["embedding"] = pa.array(list(vectors), type=pa.list_(pa.float32()))
    pq.write_table(pa.table(cols), path)
    return path


@pytest.fixture
def data(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "kb": [f"KB document {i} about opening hours and parking" for i in range(300)],
        "id": [f"in-domain question {i}?" for i in range(80)],
        "ood": [f"something else entirely {i}" for i in range(40)],
    }


def stored(texts: list[str]) -> np.ndarray:
    return np.stack([embed(t) for t in texts])


def test_stored_embeddings_skip_encoding_all_but_a_sample(
    tmp_path: Path, data: dict[str, list[str]]
) -> None:
    kb = write_set(tmp_path / "kb.parquet", data["kb"], kb=True, vectors=stored(data["kb"]))
    idq = write_set(tmp_path / "id.parquet", data["id"], kb=False, vectors=stored(data["id"]))
    ood = tmp_path / "ood.jsonl"
    ood.write_text("".join(json.dumps({"text": t}) + "\n" for t in data["ood"]))
    enc = CountingEncoder()
    cache = tmp_path / "cache"
    inputs, _ = load_inputs(
        InputSources(kb_path=kb, id_queries=idq, ood_queries=ood, cache_dir=cache),
        load_settings(),
        progress=False,
        encoder=enc,
    )
    encoded = enc.encoded
    kb_encoded = [t for t in encoded if t in set(data["kb"])]
    id_encoded = [t for t in encoded if t in set(data["id"])]
    assert len(kb_encoded) == 64 and len(set(kb_encoded)) == 64  # the sample, once each
    assert len(id_encoded) == 64
    assert sorted(t for t in encoded if t in set(data["ood"])) == sorted(data["ood"])
    assert encoded.count(PROBE_TEXTS[0]) == 1  # the probes, for the model
    np.testing.assert_array_equal(inputs.kb, stored(data["kb"]))
    np.testing.assert_array_equal(inputs.id_queries, stored(data["id"]))
    assert inputs.kb_ids[:2] == ["doc-0", "doc-1"] and inputs.kb_texts == data["kb"]
    assert inputs.encoder == {"name": "counting-encoder", "dim": DIM}
    assert inputs.encoder_probes is not None
    np.testing.assert_array_equal(inputs.encoder_probes, stored(list(PROBE_TEXTS)))


def test_nothing_touches_the_cache_when_every_input_has_embeddings(
    tmp_path: Path, data: dict[str, list[str]]
) -> None:
    kb = write_set(
        tmp_path / "kb.parquet", data["kb"][:30], kb=True, vectors=stored(data["kb"][:30])
    )
    idq = write_set(tmp_path / "id.parquet", data["id"], kb=False, vectors=stored(data["id"]))
    enc = CountingEncoder()
    cache = tmp_path / "cache"
    inputs, _ = load_inputs(
        InputSources(kb_path=kb, id_queries=idq, cache_dir=cache),
        load_settings(),
        progress=False,
        encoder=enc,
    )
    assert not cache.exists()
    # 30 KB rows (all of them: fewer than the sample), 64 of 80 queries, 6 probes
    assert len(enc.encoded) == 30 + 64 + len(PROBE_TEXTS)
    assert inputs.ood_queries is None and inputs.kb.shape == (30, DIM)


def test_embeddings_from_another_encoder_are_refused(
    tmp_path: Path, data: dict[str, list[str]]
) -> None:
    other = np.random.default_rng(0).normal(size=(len(data["kb"]), DIM)).astype(np.float32)
    kb = write_set(tmp_path / "kb.parquet", data["kb"], kb=True, vectors=other)
    idq = write_set(tmp_path / "id.parquet", data["id"], kb=False)
    with pytest.raises(DataError) as exc:
        load_inputs(
            InputSources(kb_path=kb, id_queries=idq, cache_dir=tmp_path / "c"),
            load_settings(),
            progress=False,
            encoder=CountingEncoder(),
        )
    message = str(exc.value)
    assert "KB embeddings" in message and "were not made by encoder counting-encoder" in message
    assert "64 sampled rows gives 64 below a cosine of 0.995" in message
    assert "leave the embedding column out" in message


def test_one_stale_row_is_named(tmp_path: Path, data: dict[str, list[str]]) -> None:
    texts = data["kb"][:40]
    vectors = stored(texts)
    vectors[17] = embed("the text this row had before it was edited")
    kb = write_set(tmp_path / "kb.parquet", texts, kb=True, vectors=vectors)
    idq = write_set(tmp_path / "id.parquet", data["id"], kb=False)
    with pytest.raises(DataError, match=r"gives 1 below a cosine.*id 'doc-17'"):
        load_inputs(
            InputSources(kb_path=kb, id_queries=idq, cache_dir=tmp_path / "c"),
            load_settings(),
            progress=False,
            encoder=CountingEncoder(),
        )


def test_embeddings_of_another_width_are_refused(
    tmp_path: Path, data: dict[str, list[str]]
) -> None:
    narrow = np.stack([embed(t, 8) for t in data["kb"]])
    kb = write_set(tmp_path / "kb.parquet", data["kb"], kb=True, vectors=narrow)
    idq = write_set(tmp_path / "id.parquet", data["id"], kb=False)
    with pytest.raises(DataError, match="have 8 dims, but encoder counting-encoder gives 16"):
        load_inputs(
            InputSources(kb_path=kb, id_queries=idq, cache_dir=tmp_path / "c"),
            load_settings(),
            progress=False,
            encoder=CountingEncoder(),
        )


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (InputSources(kb_path="kb.jsonl", kb_sql="docs"), "give --kb or --kb-sql, not both"),
        (
            InputSources(kb_sql="docs", id_queries="q.jsonl", id_queries_sql="q"),
            "give --id-queries or --id-queries-sql, not both",
        ),
        (
            InputSources(kb_path="a", kb_embeddings="b", kb_sql="c"),
            "give one of --kb, --kb-embeddings, --kb-sql, not several",
        ),
        (InputSources(id_queries_sql="q"), "training queries were given without a KB"),
        (
            InputSources(kb_path=demo_path(DEMO_KB)),
            r"ID training queries are required: --id-queries or --id-embeddings \(or --id-q",
        ),
    ],
)
def test_conflicting_or_missing_sources_are_refused(sources: InputSources, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_inputs(sources, load_settings(), progress=False, encoder=CountingEncoder())
