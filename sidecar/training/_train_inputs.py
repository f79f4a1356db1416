"""Turn ``sidecar train`` options into :class:`TrainInputs` (texts embedded, arrays loaded).

Each input is text (JSONL) or precomputed embeddings (``.npy``). With neither KB option the
built-in demo KB and its demo queries are used. The encoder is only loaded when some input
is text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sidecar._input_files import input_file
from sidecar.errors import ConfigError, DataError
from sidecar.settings import Settings
from sidecar.training._job import TrainInputs
from sidecar.training._jsonl import (
    DEMO_ID_QUERIES,
    DEMO_KB,
    DEMO_OOD_QUERIES,
    demo_path,
    read_kb,
    read_query_groups,
)

log = logging.getLogger(__name__)


def _either(opts: Mapping[str, Any], text_key: str, emb_key: str) -> None:
    if opts.get(text_key) and opts.get(emb_key):
        text = "kb" if text_key == "kb_path" else text_key.replace("_", "-")  # its option
        raise ConfigError(f"give --{text} or --{emb_key.replace('_', '-')}, not both")


def load_inputs(
    opts: Mapping[str, Any], settings: Settings, *, progress: bool = True
) -> tuple[TrainInputs, float]:
    """Read, embed and return the training inputs and the seconds spent embedding."""
    for text_key, emb_key in (
        ("kb_path", "kb_embeddings"),
        ("id_queries", "id_embeddings"),
        ("ood_queries", "ood_embeddings"),
    ):
        _either(opts, text_key, emb_key)
    demo = not opts.get("kb_path") and not opts.get("kb_embeddings")
    queries = ("id_queries", "id_embeddings", "ood_queries", "ood_embeddings")
    if demo and any(opts.get(k) for k in queries):
        # the built-in demo is all or nothing: the user's queries against the demo KB (or
        # the demo's ID queries beside the user's OOD ones) would train a meaningless model
        raise ConfigError(
            "training queries were given without a KB: add --kb (or --kb-embeddings); the "
            "built-in demo KB is used only when no inputs are given"
        )
    kb_path = opts.get("kb_path") or (demo_path(DEMO_KB) if demo else None)
    id_path = opts.get("id_queries")
    ood_path = opts.get("ood_queries")
    if demo:
        id_path, ood_path = demo_path(DEMO_ID_QUERIES), demo_path(DEMO_OOD_QUERIES)
    docs = read_kb(kb_path) if kb_path else None  # first: a wrong --kb is named as such
    if not id_path and not opts.get("id_embeddings"):
        raise ConfigError("ID training queries are required: --id-queries or --id-embeddings")
    id_texts, id_groups = read_query_groups(id_path) if id_path else (None, None)
    ood_texts, ood_groups = read_query_groups(ood_path) if ood_path else (None, None)
    kb_arr = load_npy(opts["kb_embeddings"], "KB embeddings") if opts.get("kb_embeddings") else None
    id_arr = load_npy(opts["id_embeddings"], "ID embeddings") if opts.get("id_embeddings") else None
    ood_arr = (
        load_npy(opts["ood_embeddings"], "OOD embeddings") if opts.get("ood_embeddings") else None
    )

    t0 = time.perf_counter()
    name = str(opts.get("encoder") or settings.scoring.encoder)
    width: int | None = None  # the encoder's embedding width, where it is known
    probes = None
    if docs is not None or id_texts is not None or ood_texts is not None:
        from sidecar.encoders import available_cpus, load_encoder
        from sidecar.training._cache import EmbeddingCache

        # The worker's backend (ONNX Runtime under `auto`), on every CPU the job has.
        enc = load_encoder(settings.scoring, name=name, threads=available_cpus())
        cache = EmbeddingCache(enc, opts.get("cache_dir"), progress=progress)
        if docs is not None:
            kb_arr = cache.embed([d.text for d in docs], desc="encoding KB")
        if id_texts is not None:
            id_arr = cache.embed(id_texts, desc="encoding ID queries")
        if ood_texts is not None:
            ood_arr = cache.embed(ood_texts, desc="encoding OOD queries")
        # The cache checked its vectors against them: they are what embedded the texts.
        probes = cache.probes()
        encoder: dict[str, Any] = {"name": enc.name, "dim": enc.dim}
        width = enc.dim
    else:
        from sidecar.encoders import encoder_dim, resolve_encoder_path

        assert kb_arr is not None
        encoder = {"name": resolve_encoder_path(name)[0], "dim": int(kb_arr.shape[1])}
        _check_width(encoder, encoder_dim(name), publish=bool(opts.get("publish")))
    embed_s = time.perf_counter() - t0
    assert kb_arr is not None and id_arr is not None
    dim = int(encoder["dim"])
    for what, arr in (("KB", kb_arr), ("ID", id_arr), ("OOD", ood_arr)):
        if arr is None or arr.shape[1] == dim:
            continue
        # Only a .npy can be off: texts were embedded at the encoder's width.
        against = f"encoder {encoder['name']} gives" if width else "the KB embeddings have"
        raise DataError(
            f"{what} embeddings ({opts.get(f'{what.lower()}_embeddings')}) have "
            f"{arr.shape[1]} dims, but {against} {dim}"
        )
    kb_name = opts.get("kb_name") or settings.scoring.default_kb
    inputs = TrainInputs(
        kb_name=str(kb_name),
        encoder=encoder,
        kb=np.asarray(kb_arr, dtype=np.float32),
        id_queries=np.asarray(id_arr, dtype=np.float32),
        ood_queries=None if ood_arr is None else np.asarray(ood_arr, dtype=np.float32),
        kb_ids=[d.id for d in docs] if docs else [],
        kb_texts=[d.text for d in docs] if docs else [],
        id_groups=id_groups,
        ood_groups=ood_groups,
        encoder_probes=probes,
    )
    log.info(
        "training inputs: %s KB docs, %s ID, %s OOD queries",
        len(inputs.kb),
        len(inputs.id_queries),
        0 if inputs.ood_queries is None else len(inputs.ood_queries),
    )
    return inputs, embed_s


def _check_width(encoder: Mapping[str, Any], width: int | None, *, publish: bool) -> None:
    """Embeddings given without texts must have the named encoder's width, where its
    configs say it: workers embed queries with that encoder and refuse a model of another
    width. Publishing such a model is refused; training one to a directory is warned about
    (synthetic embeddings, or an encoder the workers will get through --encoder later)."""
    if width is None or width == encoder["dim"]:
        return
    why = (
        f"the KB embeddings have {encoder['dim']} dims, but encoder {encoder['name']} gives "
        f"{width}: workers running it would refuse the model (pass --encoder with the "
        "directory of the encoder that made the embeddings)"
    )
    if publish:
        raise DataError(f"{why}; nothing was trained or published")
    log.warning("%s", why)


def demo_inputs_paths() -> dict[str, Path]:
    """Paths of the built-in demo KB and queries."""
    return {
        "kb": demo_path(DEMO_KB),
        "id": demo_path(DEMO_ID_QUERIES),
        "ood": demo_path(DEMO_OOD_QUERIES),
    }


def load_npy(path: str | Path, what: str) -> np.ndarray:
    """A 2-D float array from ``.npy`` (never pickled objects)."""
    # Not a pipe: the array is memory-mapped, after a first read of its header.
    p = input_file(
        path, f"a .npy file ({what})", missing=f"{what} file not found: {path}", pipes=False
    )
    with p.open("rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":  # numpy would call it pickled data (never unpickled here)
        raise DataError(f"{p}: not a .npy array (no .npy header)")
    try:
        arr = np.load(p, allow_pickle=False, mmap_mode="r")
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{p}: not a .npy array ({exc or 'truncated'})") from exc
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise DataError(f"{p}: {what} must be a 2-D float array, got {arr.dtype} {arr.shape}")
    out = np.ascontiguousarray(arr, dtype=np.float32)
    for bad, why in (
        (~np.isfinite(out).all(axis=1), "with NaN or infinite values"),
        (~out.any(axis=1), "of zeros (no encoder gives those)"),
    ):
        if bad.any():
            raise DataError(
                f"{p}: {what} has {int(bad.sum())} rows {why} (first: row {int(np.argmax(bad))})"
            )
    return out
