"""Turn the training job's input sources into :class:`TrainInputs` (texts embedded, arrays loaded).

Each input is text (JSONL) or precomputed embeddings (``.npy``). With neither KB option the
built-in demo KB and its demo queries are used. The encoder is only loaded when some input
is text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
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


@dataclass(frozen=True)
class InputSources:
    """Where the training inputs come from: each is text (JSONL) or embeddings (``.npy``).

    With neither ``kb_path`` nor ``kb_embeddings`` the built-in demo KB and its queries are
    used. ``encoder`` names the encoder (default: ``scoring.encoder``), ``cache_dir`` the
    embedding cache, ``kb_name`` the KB (default: ``scoring.default_kb``); ``publish`` says
    the model is meant for the workers, so embeddings of another width are refused.
    """

    kb_path: str | Path | None = None
    kb_embeddings: str | Path | None = None
    id_queries: str | Path | None = None
    id_embeddings: str | Path | None = None
    ood_queries: str | Path | None = None
    ood_embeddings: str | Path | None = None
    encoder: str | None = None
    cache_dir: str | Path | None = None
    kb_name: str | None = None
    publish: bool = False

    @classmethod
    def from_options(cls, opts: Mapping[str, Any]) -> InputSources:
        """The sources among ``sidecar train``'s options (other options are ignored)."""
        return cls(**{f.name: opts[f.name] for f in fields(cls) if opts.get(f.name)})


def _either(sources: InputSources, text_key: str, emb_key: str) -> None:
    if getattr(sources, text_key) and getattr(sources, emb_key):
        text = "kb" if text_key == "kb_path" else text_key.replace("_", "-")  # its option
        raise ConfigError(f"give --{text} or --{emb_key.replace('_', '-')}, not both")


def _text_paths(sources: InputSources) -> tuple[Any, Any, Any]:
    """The KB, ID and OOD text files to read (the demo's where no KB is given)."""
    for text_key, emb_key in (
        ("kb_path", "kb_embeddings"),
        ("id_queries", "id_embeddings"),
        ("ood_queries", "ood_embeddings"),
    ):
        _either(sources, text_key, emb_key)
    demo = not sources.kb_path and not sources.kb_embeddings
    queries = (sources.id_queries, sources.id_embeddings, sources.ood_queries)
    if demo and any((*queries, sources.ood_embeddings)):
        # the built-in demo is all or nothing: the user's queries against the demo KB (or
        # the demo's ID queries beside the user's OOD ones) would train a meaningless model
        raise ConfigError(
            "training queries were given without a KB: add --kb (or --kb-embeddings); the "
            "built-in demo KB is used only when no inputs are given"
        )
    if demo:
        return demo_path(DEMO_KB), demo_path(DEMO_ID_QUERIES), demo_path(DEMO_OOD_QUERIES)
    return sources.kb_path, sources.id_queries, sources.ood_queries


def _npy(path: str | Path | None, what: str) -> np.ndarray | None:
    return load_npy(path, what) if path else None


def load_inputs(
    sources: InputSources, settings: Settings, *, progress: bool = True
) -> tuple[TrainInputs, float]:
    """Read, embed and return the training inputs and the seconds spent embedding."""
    kb_path, id_path, ood_path = _text_paths(sources)
    docs = read_kb(kb_path) if kb_path else None  # first: a wrong --kb is named as such
    if not id_path and not sources.id_embeddings:
        raise ConfigError("ID training queries are required: --id-queries or --id-embeddings")
    id_texts, id_groups = read_query_groups(id_path) if id_path else (None, None)
    ood_texts, ood_groups = read_query_groups(ood_path) if ood_path else (None, None)
    arrays = {
        "KB": _npy(sources.kb_embeddings, "KB embeddings"),
        "ID": _npy(sources.id_embeddings, "ID embeddings"),
        "OOD": _npy(sources.ood_embeddings, "OOD embeddings"),
    }
    t0 = time.perf_counter()
    name = str(sources.encoder or settings.scoring.encoder)
    texts = {"KB": [d.text for d in docs] if docs else None, "ID": id_texts, "OOD": ood_texts}
    probes, source = None, None
    if any(t is not None for t in texts.values()):
        encoder, probes, source = _embed(texts, arrays, settings, name, sources.cache_dir, progress)
    else:
        from sidecar.encoders import encoder_dim, encoder_label, resolve_encoder_path

        kb_arr = arrays["KB"]
        assert kb_arr is not None
        # A server's model need not be on this machine: its name is the setting's label.
        remote = settings.scoring.encoder_backend == "http"
        label = encoder_label(name) if remote else resolve_encoder_path(name)[0]
        encoder = {"name": label, "dim": int(kb_arr.shape[1])}
        _check_width(encoder, encoder_dim(name), publish=sources.publish)
    embed_s = time.perf_counter() - t0
    _check_dims(arrays, encoder, sources, embedded=probes is not None)
    kb_arr, id_arr, ood_arr = arrays["KB"], arrays["ID"], arrays["OOD"]
    assert kb_arr is not None and id_arr is not None
    inputs = TrainInputs(
        kb_name=str(sources.kb_name or settings.scoring.default_kb),
        encoder=encoder,
        kb=np.asarray(kb_arr, dtype=np.float32),
        id_queries=np.asarray(id_arr, dtype=np.float32),
        ood_queries=None if ood_arr is None else np.asarray(ood_arr, dtype=np.float32),
        kb_ids=[d.id for d in docs] if docs else [],
        kb_texts=[d.text for d in docs] if docs else [],
        id_groups=id_groups,
        ood_groups=ood_groups,
        encoder_probes=probes,
        encoder_source=source,
    )
    log.info(
        "training inputs: %s KB docs, %s ID, %s OOD queries",
        len(inputs.kb),
        len(inputs.id_queries),
        0 if inputs.ood_queries is None else len(inputs.ood_queries),
    )
    return inputs, embed_s


def _embed(
    texts: Mapping[str, list[str] | None],
    arrays: dict[str, np.ndarray | None],
    settings: Settings,
    name: str,
    cache_dir: str | Path | None,
    progress: bool,
) -> tuple[dict[str, Any], np.ndarray, dict[str, Any]]:
    """Embed the text inputs into ``arrays``; the encoder's record, its probe embeddings
    and where it ran (the backend; for an embedding server its URL and model names)."""
    from sidecar.encoders import available_cpus, load_encoder
    from sidecar.training._cache import EmbeddingCache

    # The worker's backend (ONNX Runtime under `auto`), on every CPU the job has.
    enc = load_encoder(settings, name=name, threads=available_cpus())
    cache = EmbeddingCache(enc, cache_dir, progress=progress)
    descs = {"KB": "encoding KB", "ID": "encoding ID queries", "OOD": "encoding OOD queries"}
    for what, desc in descs.items():
        given = texts[what]
        if given is not None:
            arrays[what] = cache.embed(given, desc=desc)
    # The cache checked its vectors against them: they are what embedded the texts.
    probes = cache.probes()
    source: dict[str, Any] = {"backend": getattr(enc, "backend", None)}
    describe = getattr(enc, "describe", None)
    if callable(describe):  # an embedding server: which one, and what it calls the model
        server = describe()
        source.update({k: server[k] for k in ("url", "model", "served_model")})
    return {"name": enc.name, "dim": enc.dim}, probes, source


def _check_dims(
    arrays: Mapping[str, np.ndarray | None],
    encoder: Mapping[str, Any],
    sources: InputSources,
    *,
    embedded: bool,
) -> None:
    """Every array has the encoder's width; only a ``.npy`` can be off."""
    dim = int(encoder["dim"])
    for what, arr in arrays.items():
        if arr is None or arr.shape[1] == dim:
            continue
        against = f"encoder {encoder['name']} gives" if embedded else "the KB embeddings have"
        given = getattr(sources, f"{what.lower()}_embeddings")
        raise DataError(
            f"{what} embeddings ({given}) have {arr.shape[1]} dims, but {against} {dim}"
        )


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
