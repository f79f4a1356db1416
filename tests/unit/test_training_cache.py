"""The on-disk embedding cache: computes each distinct text once, survives a new process,
and refuses vectors that other weights under the same name wrote."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import DataError
from sidecar.scoring import PROBE_TEXTS
from sidecar.training import EmbeddingCache


class CountingEncoder:
    """A fake of the project's Encoder protocol: deterministic vectors, counts calls."""

    name = "fake/enc v1"
    dim = 8

    def __init__(self, weights: int = 0) -> None:
        self.weights = weights  # another value: the same name with other weights
        self.seen: list[str] = []  # texts it embedded, the cache's probe check left out

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if tuple(texts) != PROBE_TEXTS:
            self.seen.extend(texts)
        seeds = [len(t) * 7919 + sum(map(ord, t)) + 104729 * self.weights for t in texts]
        out = np.array([np.random.default_rng(s).normal(size=8) for s in seeds], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_cache_hits_and_order(tmp_path: Path) -> None:
    enc = CountingEncoder()
    cache = EmbeddingCache(enc, tmp_path, progress=False)
    a = cache.embed(["x", "y", "x"])
    assert a.shape == (3, 8) and a.dtype == np.float32
    assert np.array_equal(a[0], a[2])
    assert sorted(enc.seen) == ["x", "y"]
    b = cache.embed(["y", "z"])
    assert enc.seen[-1] == "z" and len(enc.seen) == 3
    assert np.array_equal(b[0], a[1])


def test_cache_persists_across_instances(tmp_path: Path) -> None:
    first = CountingEncoder()
    ref = EmbeddingCache(first, tmp_path, progress=False).embed(["alpha", "beta"])
    second = CountingEncoder()
    again = EmbeddingCache(second, tmp_path, progress=False).embed(["beta", "alpha"])
    assert second.seen == []
    assert np.array_equal(again, ref[::-1])
    # one directory per encoder, with a filesystem-safe name
    assert [p.name for p in tmp_path.iterdir()] == ["fake_enc_v1"]


def test_other_weights_under_the_same_name_are_refused(tmp_path: Path) -> None:
    """A model fine-tuned again in its directory keeps its name: the cached vectors of the
    old weights must not be served as the new ones'."""
    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed(["alpha"])
    retrained = CountingEncoder(weights=1)
    cache = EmbeddingCache(retrained, tmp_path, progress=False)
    with pytest.raises(DataError, match=r"'fake/enc v1' disagree.*other weights.*--cache-dir"):
        cache.embed(["alpha"])
    assert retrained.seen == []
    # the same weights again (another process) are served from the folder
    same = CountingEncoder()
    again = EmbeddingCache(same, tmp_path, progress=False)
    assert np.array_equal(again.probes(), CountingEncoder().encode(list(PROBE_TEXTS)))
    again.embed(["alpha"])
    assert same.seen == []


class _Nudged(CountingEncoder):
    """The fake's vectors moved by ``by`` towards another direction."""

    def __init__(self, by: float) -> None:
        super().__init__()
        self.by = by

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        out = super().encode(texts, batch_size=batch_size) + self.by * np.eye(8)[0]
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def test_the_cache_is_stricter_than_a_worker(tmp_path: Path) -> None:
    """Same weights on another backend differ by ~1e-5; a nudge that a worker would
    still accept (cosine ~0.999 > 0.995) is refused by the cache."""
    from sidecar.scoring import MIN_PROBE_COSINE
    from sidecar.scoring._probes import probe_cosines
    from sidecar.training._cache import CACHE_MIN_PROBE_COSINE

    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed(["alpha"])
    base = CountingEncoder().encode(list(PROBE_TEXTS))
    tiny, nudged = _Nudged(1e-4), _Nudged(0.05)
    assert probe_cosines(base, tiny.encode(list(PROBE_TEXTS))).min() > CACHE_MIN_PROBE_COSINE
    worst = probe_cosines(base, nudged.encode(list(PROBE_TEXTS))).min()
    assert MIN_PROBE_COSINE < worst < CACHE_MIN_PROBE_COSINE
    EmbeddingCache(tiny, tmp_path, progress=False).embed(["alpha"])
    assert tiny.seen == []
    with pytest.raises(DataError, match=r"at least 0\.9999 expected"):
        EmbeddingCache(nudged, tmp_path, progress=False).embed(["alpha"])


def test_a_folder_that_cached_the_probes_as_texts_is_checked_by_them(tmp_path: Path) -> None:
    """The release before the probe file embedded the probe sentences through the cache:
    a folder it filled is checked against those rows, which become its probe file."""
    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed([*PROBE_TEXTS, "alpha"])
    folder = tmp_path / "fake_enc_v1"
    for probes in folder.glob("probes-*.npy"):
        probes.unlink()
    with pytest.raises(DataError, match="disagree"):
        EmbeddingCache(CountingEncoder(weights=1), tmp_path, progress=False).embed(["alpha"])
    # the probe file now records the folder's own probes, not the refused encoder's
    (recorded,) = folder.glob("probes-*.npy")
    assert np.array_equal(np.load(recorded), CountingEncoder().encode(list(PROBE_TEXTS)))
    same = CountingEncoder()
    EmbeddingCache(same, tmp_path, progress=False).embed(["alpha"])
    assert same.seen == [] and len(list(folder.glob("probes-*.npy"))) == 1


def test_nothing_to_embed_runs_nothing(tmp_path: Path) -> None:
    enc = CountingEncoder()
    out = EmbeddingCache(enc, tmp_path, progress=False).embed([])
    assert out.shape == (0, 8) and not tmp_path.joinpath("fake_enc_v1").exists()


def test_a_folder_without_probes_adopts_the_encoder(tmp_path: Path) -> None:
    """A folder an earlier release filled has no probe file: it is kept and gets one."""
    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed(["alpha"])
    folder = tmp_path / "fake_enc_v1"
    (probes,) = folder.glob("probes-*.npy")
    probes.unlink()
    later = CountingEncoder()
    EmbeddingCache(later, tmp_path, progress=False).embed(["alpha"])
    assert later.seen == [] and len(list(folder.glob("probes-*.npy"))) == 1


def test_cache_is_keyed_by_encoder(tmp_path: Path) -> None:
    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed(["t"])
    other = CountingEncoder()
    other.name = "another"
    EmbeddingCache(other, tmp_path, progress=False).embed(["t"])
    assert other.seen == ["t"]


def test_digests_ending_in_nul_bytes_round_trip(tmp_path: Path) -> None:
    """A sha256 may end in 0x00; the cache must not lose those keys when it reloads."""
    import hashlib

    texts = [f"t{i}" for i in range(3000)]
    nul = [t for t in texts if hashlib.sha256(t.encode()).digest().endswith(b"\x00")]
    assert nul  # ~1/256 of the texts
    EmbeddingCache(CountingEncoder(), tmp_path, progress=False).embed(nul)
    again = CountingEncoder()
    EmbeddingCache(again, tmp_path, progress=False).embed(nul)
    assert again.seen == []
