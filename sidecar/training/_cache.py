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

from sidecar.encoders import Encoder, embed_probes
from sidecar.errors import DataError
from sidecar.scoring import PROBE_TEXTS, probe_cosines

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
# 1% of each weight tensor's spread gives 0.9995 (benchmarks/results/encoder_probes.json).
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
        self._running: np.ndarray | None = None  # the encoder's probe embeddings
        self._checked = False  # the folder's vectors are this encoder's

    def probes(self, *, check_folder: bool = True) -> np.ndarray:
        """The probe sentences' embeddings by this cache's encoder (computed once, never
        cached as texts). With ``check_folder`` (as :meth:`embed` does first) also check
        that the folder's vectors came from the same weights:
        :class:`~sidecar.errors.DataError` if they did not. ``check_folder=False`` lets a
        caller compare a model's probes first, so that the one that is off is named."""
        if self._running is None:
            self._running = embed_probes(self.encoder.encode)
        if check_folder and not self._checked:
            self._check_folder(self._running)
            self._checked = True
        return self._running

    def _check_folder(self, running: np.ndarray) -> None:
        path = self.dir / _PROBES_FILE
        recorded = self._load_probes(path)
        if recorded is None:
            # The release before the probe file cached the probe sentences as texts.
            self._refresh()
            keys = [text_key(t) for t in PROBE_TEXTS]
            if all(k in self._index for k in keys):
                rows = [self._index[k] for k in keys]
                held = np.stack([self._shards[slot][row] for slot, row in rows])
            else:
                # A new folder, or one filled before there were probes: its vectors are
                # taken as this encoder's from now on.
                held = running
            recorded = self._record_probes(path, held)
        if recorded.shape != running.shape:
            raise DataError(
                f"embedding cache {self.dir} holds probe embeddings of shape "
                f"{recorded.shape}, but {self.encoder.name!r} gives {running.shape}; delete "
                "that folder or pass --cache-dir"
            )
        worst = float(np.min(probe_cosines(recorded, running)))
        if not worst >= CACHE_MIN_PROBE_COSINE:
            raise DataError(
                f"embedding cache {self.dir} and the encoder {self.encoder.name!r} disagree on "
                f"the probe sentences (cosine {worst:.5f}, at least {CACHE_MIN_PROBE_COSINE} "
                "expected): other weights under one name filled that folder; if the encoder "
                "is the right one, delete that folder or pass --cache-dir"
            )

    def _load_probes(self, path: Path) -> np.ndarray | None:
        try:
            return np.asarray(np.load(path, allow_pickle=False))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DataError(f"embedding cache {self.dir}: unreadable {path.name}: {exc}") from exc

    def _record_probes(self, path: Path, probes: np.ndarray) -> np.ndarray:
        """Write ``probes`` as the folder's unless another process got there first (then
        theirs are returned, to be compared); a read-only folder keeps none."""
        try:
            tmp = self._temp_copy(path.name, probes)
            try:
                os.link(tmp, path)  # fails if it exists: the first writer's probes stay
            except FileExistsError:
                theirs = self._load_probes(path)
                return probes if theirs is None else theirs
            except OSError:  # a file system without hard links: last writer wins
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:  # a read-only cache still serves what it holds
            log.warning("cannot record the probes in %s: %s", self.dir, exc)
        return probes

    def _temp_copy(self, name: str, arr: np.ndarray) -> Path:
        """``arr`` saved under a temporary name beside ``name`` in the folder."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        return tmp

    def _write(self, name: str, arr: np.ndarray) -> None:
        os.replace(self._temp_copy(name, arr), self.dir / name)

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
        if not texts:
            return np.empty((0, self.encoder.dim), dtype=np.float32)
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
