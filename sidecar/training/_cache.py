"""An on-disk cache of sentence embeddings, keyed by encoder name and sha256 of the text.

Layout: ``<root>/<encoder>/shard-<id>.keys.npy`` (uint8, shape (n, 32): raw sha256) next to
``shard-<id>.emb.npy`` (float32, one row per key). Shards are written atomically (temporary
file, then rename) and never rewritten, so several processes can fill one cache at once and
an interrupted run keeps every finished shard. Files are read with ``allow_pickle=False``.

A name does not say which weights filled a folder: a model fine-tuned again in the same
directory keeps its name. So each folder also keeps ``probes-<sha>.npy``, the embeddings
of the probe sentences (:mod:`sidecar.scoring._probes`) by the encoder that first wrote to
it, and a cache whose encoder embeds them differently refuses to serve stale vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._encoder import Encoder
from sidecar.scoring._probes import PROBE_TEXTS, embed_probes, probe_cosines

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("~/.cache/ood-sidecar/embeddings")
_SHARD_ROWS = 1024


def text_key(text: str) -> bytes:
    """Raw sha256 digest (32 bytes) of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "encoder"


# Stricter than a worker's MIN_PROBE_COSINE (0.995), which must never refuse a model on a
# machine of its own weights: a cache should hold the vectors of these weights only. The
# same weights on ONNX Runtime or in bfloat16 stay above 0.99998 on every probe; noise of
# 1% of each weight tensor's spread gives 0.9995 (tests/benchmarks/encoder_probes.json).
CACHE_MIN_PROBE_COSINE = 0.9999

# Which probe sentences a folder's probe file holds: other sentences, another file.
_PROBES_FILE = f"probes-{hashlib.sha256(chr(10).join(PROBE_TEXTS).encode()).hexdigest()[:12]}.npy"


class EmbeddingCache:
    """Embeddings of one encoder, cached on disk.

    Parameters
    ----------
    encoder : Encoder
        Computes what the cache lacks.
    root : path, optional
        Cache root; ``~/.cache/ood-sidecar/embeddings`` by default.
    progress : bool
        Show a tqdm bar while encoding.
    """

    def __init__(self, encoder: Encoder, root: str | Path | None = None, *, progress: bool = True):
        self.encoder = encoder
        self.root = Path(root or DEFAULT_CACHE_DIR).expanduser()
        self.dir = self.root / _slug(encoder.name)
        self.progress = progress
        self._index: dict[bytes, tuple[int, int]] = {}
        self._shards: list[np.ndarray] = []
        self._seen: set[str] = set()
        self._probes: np.ndarray | None = None

    def probes(self) -> np.ndarray:
        """The probe sentences' embeddings by this cache's encoder, computed (never
        cached as texts) on first use, which also checks that the folder's vectors came
        from the same weights; :class:`~sidecar.errors.DataError` if they did not."""
        if self._probes is None:
            fresh = embed_probes(self.encoder.encode)
            path = self.dir / _PROBES_FILE
            try:
                recorded = np.load(path, allow_pickle=False)
            except FileNotFoundError:
                recorded = None
            except (OSError, ValueError) as exc:
                raise DataError(
                    f"embedding cache {self.dir}: unreadable {path.name}: {exc}"
                ) from exc
            if recorded is None:
                # A new folder, or one an earlier release filled: its vectors are taken as
                # this encoder's from now on.
                try:
                    self._write(_PROBES_FILE, fresh)
                except OSError as exc:  # a read-only cache still serves what it holds
                    log.warning("cannot record the probes in %s: %s", self.dir, exc)
            else:
                same = recorded.shape == fresh.shape
                worst = float(np.min(probe_cosines(recorded, fresh))) if same else float("nan")
                if not worst >= CACHE_MIN_PROBE_COSINE:
                    raise DataError(
                        f"embedding cache {self.dir} holds the vectors of other weights named "
                        f"{self.encoder.name!r} (probe cosine {worst:.5f}, at least "
                        f"{CACHE_MIN_PROBE_COSINE} expected); delete that folder or pass "
                        "--cache-dir"
                    )
            self._probes = fresh
        return self._probes

    def _write(self, name: str, arr: np.ndarray) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        os.replace(tmp, self.dir / name)

    def _refresh(self) -> None:
        """Load shards written since the last call (by this or another process)."""
        if not self.dir.is_dir():
            return
        for kpath in sorted(self.dir.glob("shard-*.keys.npy")):
            sid = kpath.name[: -len(".keys.npy")]
            if sid in self._seen:
                continue
            epath = self.dir / f"{sid}.emb.npy"
            try:
                keys = np.load(kpath, allow_pickle=False)
                emb = np.load(epath, allow_pickle=False)
            except (OSError, ValueError) as exc:
                log.warning("skipping unreadable cache shard %s: %s", kpath, exc)
                continue
            if emb.ndim != 2 or emb.shape[0] != keys.shape[0] or emb.shape[1] != self.encoder.dim:
                log.warning("skipping cache shard %s with shape %s", kpath, emb.shape)
                continue
            self._seen.add(sid)
            slot = len(self._shards)
            self._shards.append(emb)
            # Raw bytes, not ``tolist()``: numpy drops trailing NUL bytes of ``S`` items.
            blob = np.ascontiguousarray(keys).view(np.uint8).tobytes()
            for row in range(keys.shape[0]):
                self._index[blob[32 * row : 32 * row + 32]] = (slot, row)

    def _write_shard(self, keys: list[bytes], emb: np.ndarray) -> None:
        sid = f"shard-{uuid.uuid4().hex[:12]}"
        karr = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32)
        for suffix, arr in ((".emb.npy", emb), (".keys.npy", karr)):  # keys last: the commit
            self._write(f"{sid}{suffix}", arr)
        self._seen.add(sid)
        slot = len(self._shards)
        self._shards.append(emb)
        for row, k in enumerate(keys):
            self._index[k] = (slot, row)

    def embed(
        self, texts: Sequence[str], *, batch_size: int = 64, desc: str = "encoding"
    ) -> np.ndarray:
        """Embeddings of ``texts``: ndarray of shape (len(texts), dim), float32.

        Computes and stores only the texts not cached yet (each distinct text once).
        """
        if any(not isinstance(t, str) for t in texts):
            raise DataError("every text to embed must be a string")
        self.probes()  # first: the folder must hold this encoder's vectors
        self._refresh()
        keys = [text_key(t) for t in texts]
        missing: dict[bytes, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in self._index and k not in missing:
                missing[k] = t
        if missing:
            self._compute(list(missing.items()), batch_size=batch_size, desc=desc)
        out = np.empty((len(texts), self.encoder.dim), dtype=np.float32)
        for i, k in enumerate(keys):
            slot, row = self._index[k]
            out[i] = self._shards[slot][row]
        return out

    def _compute(self, items: list[tuple[bytes, str]], *, batch_size: int, desc: str) -> None:
        from tqdm.auto import tqdm

        log.info("encoding %s uncached texts with %s", len(items), self.encoder.name)
        with tqdm(total=len(items), desc=desc, unit="text", disable=not self.progress) as bar:
            for start in range(0, len(items), _SHARD_ROWS):
                chunk = items[start : start + _SHARD_ROWS]
                emb = self.encoder.encode([t for _, t in chunk], batch_size=batch_size)
                self._write_shard([k for k, _ in chunk], np.asarray(emb, dtype=np.float32))
                bar.update(len(chunk))
