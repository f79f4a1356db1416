"""Turn the training job's input sources into :class:`TrainInputs` (texts embedded, arrays loaded).

Each input (the KB, the ID and the OOD queries) is text (JSONL or Parquet), precomputed
embeddings (``.npy``), or rows of a PostgreSQL table or query; Parquet and PostgreSQL
rows may carry their embeddings beside their texts, and then only a sample is re-embedded,
as proof of their encoder (:mod:`sidecar.training._stored_embeddings`). With no KB option
the built-in demo KB and its demo queries are used. The encoder is loaded only when some
input has texts.
"""

from __future__ import annotations

import contextlib
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
from sidecar.training._deny_topics import read_deny_topics
from sidecar.training._jsonl import (
    DEMO_ID_QUERIES,
    DEMO_KB,
    DEMO_OOD_QUERIES,
    demo_path,
    read_kb,
    read_query_rows,
)
from sidecar.training._languages import query_languages
from sidecar.training._source_rows import SourceRows
from sidecar.training._sources_parquet import is_parquet, read_parquet
from sidecar.training._stored_embeddings import CHECK_ROWS, check_stored_embeddings
from sidecar.training._train_config import TrainInputs

log = logging.getLogger(__name__)

# Per input: its text option, its .npy option and its PostgreSQL option (field names).
_OPTIONS = {
    "KB": ("kb_path", "kb_embeddings", "kb_sql"),
    "ID": ("id_queries", "id_embeddings", "id_queries_sql"),
    "OOD": ("ood_queries", "ood_embeddings", "ood_queries_sql"),
}


@dataclass(frozen=True)
class InputSources:
    """Where the training inputs come from: each is a file of texts (JSONL, or Parquet: a
    ``.parquet`` file or a directory of them), embeddings (``.npy``), or a PostgreSQL table
    or query (``*_sql``, read with ``postgres.dsn``).

    With no KB option the built-in demo KB and its queries are used. ``encoder`` names the
    encoder (default: ``scoring.encoder``), ``cache_dir`` the embedding cache, ``kb_name``
    the KB (default: ``scoring.default_kb``); ``deny_topics`` the denied topics
    (``"builtin"`` or a file, embedded by the same encoder); ``publish`` says the model is
    meant for the workers, so embeddings of another width are refused. ``check_rows``
    rows of an input that came with stored embeddings are re-embedded to prove their
    encoder.
    """

    kb_path: str | Path | None = None
    kb_embeddings: str | Path | None = None
    kb_sql: str | None = None
    id_queries: str | Path | None = None
    id_embeddings: str | Path | None = None
    id_queries_sql: str | None = None
    ood_queries: str | Path | None = None
    ood_embeddings: str | Path | None = None
    ood_queries_sql: str | None = None
    encoder: str | None = None
    cache_dir: str | Path | None = None
    kb_name: str | None = None
    publish: bool = False
    check_rows: int = CHECK_ROWS
    # Topics the model refuses: "builtin" or a text file (read_deny_topics); None: none.
    deny_topics: str | Path | None = None
    # Tell the language of each ID training query (TrainInputs.id_languages), for
    # per-language thresholds: the ID queries must then come as texts.
    per_language: bool = False
    # Tell the language of every training text (KB, ID, OOD), for the centring means; an
    # input given as embeddings has no languages and counts in the global mean only.
    center_languages: bool = False

    @classmethod
    def from_options(cls, opts: Mapping[str, Any]) -> InputSources:
        """The sources among ``sidecar train``'s options (other options are ignored)."""
        return cls(**{f.name: opts[f.name] for f in fields(cls) if opts.get(f.name)})


def _option(field: str) -> str:
    """The command-line option of an :class:`InputSources` field."""
    return "--kb" if field == "kb_path" else "--" + field.replace("_", "-")


@dataclass
class _Input:
    """One input as read: texts (with ids and groups) and/or embeddings."""

    given: str
    rows: SourceRows | None = None  # texts, and the embeddings stored beside them
    array: np.ndarray | None = None  # the embeddings (.npy, stored, or computed here)

    @property
    def texts(self) -> list[str] | None:
        return None if self.rows is None else self.rows.texts

    @property
    def to_embed(self) -> bool:
        return self.rows is not None and self.rows.embeddings is None


def _chosen(sources: InputSources, what: str) -> str | None:
    """The one option that gives input ``what``, or None; ConfigError for two."""
    given = [f for f in _OPTIONS[what] if getattr(sources, f)]
    if len(given) == 2:
        raise ConfigError(f"give {_option(given[0])} or {_option(given[1])}, not both")
    if len(given) > 2:
        raise ConfigError(f"give one of {', '.join(_option(f) for f in given)}, not several")
    return given[0] if given else None


def _plan(sources: InputSources) -> dict[str, tuple[str, Any] | None]:
    """Per input, (field, value) of the option that gives it, or None (the demo's files
    where no KB is given)."""
    plan = {what: _chosen(sources, what) for what in _OPTIONS}
    if plan["KB"] is None:
        if plan["ID"] or plan["OOD"]:
            # the built-in demo is all or nothing: the user's queries against the demo KB (or
            # the demo's ID queries beside the user's OOD ones) would train a meaningless model
            raise ConfigError(
                "training queries were given without a KB: add --kb (or --kb-embeddings, "
                "--kb-sql); the built-in demo KB is used only when no inputs are given"
            )
        return {
            "KB": ("kb_path", demo_path(DEMO_KB)),
            "ID": ("id_queries", demo_path(DEMO_ID_QUERIES)),
            "OOD": ("ood_queries", demo_path(DEMO_OOD_QUERIES)),
        }
    return {w: None if f is None else (f, getattr(sources, f)) for w, f in plan.items()}


def _read(
    what: str, field: str, value: Any, pg: Any, progress: bool, languages: bool = False
) -> _Input:
    """Read one input from the option ``field`` (its value ``value``); ``pg`` is the open
    :class:`~sidecar.training.PostgresSource` where some input comes from PostgreSQL;
    ``languages``: also the ``language`` of each JSONL query line."""
    kb = what == "KB"
    if field.endswith("_embeddings"):
        return _Input(str(value), array=load_npy(value, f"{what} embeddings"))
    if field.endswith("_sql"):
        rows = pg.read(value, option=_option(field), kb=kb, progress=progress)
        return _Input(rows.given, rows=rows, array=rows.embeddings)
    if is_parquet(value):
        rows = read_parquet(value, kb=kb, progress=progress)
        return _Input(rows.given, rows=rows, array=rows.embeddings)
    if kb:
        docs = read_kb(value)
        rows = SourceRows(str(value), [d.text for d in docs], [d.id for d in docs], None, None)
    else:
        q = read_query_rows(value, languages=languages)
        rows = SourceRows(str(value), q.texts, [], q.groups, None, q.languages)
    return _Input(str(value), rows=rows)


def load_inputs(
    sources: InputSources,
    settings: Settings,
    *,
    progress: bool = True,
    encoder: Any = None,
) -> tuple[TrainInputs, float]:
    """Read, embed and return the training inputs and the seconds spent embedding.

    ``encoder`` (an :class:`~sidecar.encoders.Encoder`) is used instead of loading the one
    the settings and ``sources.encoder`` name.
    """
    plan = _plan(sources)
    if sources.per_language and plan["ID"] is not None and plan["ID"][0] == "id_embeddings":
        raise ConfigError(
            "--per-language tells each ID query's language from its text: give --id-queries "
            "(or --id-queries-sql) instead of --id-embeddings"
        )
    topics = read_deny_topics(sources.deny_topics) if sources.deny_topics else ()
    inputs: dict[str, _Input | None] = {}
    with contextlib.ExitStack() as stack:
        pg = None
        sql_fields = [p[0] for p in plan.values() if p is not None and p[0].endswith("_sql")]
        if sql_fields:
            from sidecar.training._sources_sql import PostgresSource

            # One connection and one snapshot for every input read from the database.
            pg = stack.enter_context(
                PostgresSource(settings.postgres, option=_option(sql_fields[0]))
            )
        for what, chosen in plan.items():  # the KB first: a wrong --kb is named as such
            if what == "ID" and chosen is None:
                raise ConfigError(
                    "ID training queries are required: --id-queries or --id-embeddings (or "
                    "--id-queries-sql)"
                )
            # a query line's own "language" is read where languages are told: the ID
            # queries' for per-language thresholds, every query's for the centring means
            langs = (what == "ID" and sources.per_language) or (
                what != "KB" and sources.center_languages
            )
            inputs[what] = None if chosen is None else _read(what, *chosen, pg, progress, langs)
    t0 = time.perf_counter()
    name = str(sources.encoder or settings.scoring.encoder)
    probes, source = None, None
    read = {w: i for w, i in inputs.items() if i is not None}
    if any(i.rows is not None for i in read.values()):
        enc_record, probes, source, encoder = _embed(
            read, settings, name, sources, progress, encoder
        )
    else:
        from sidecar.encoders import encoder_dim, encoder_label, resolve_encoder_path

        kb_arr = read["KB"].array
        assert kb_arr is not None
        # A server's model need not be on this machine: its name is the setting's label.
        remote = settings.scoring.encoder_backend == "http"
        label = encoder_label(name) if remote else resolve_encoder_path(name)[0]
        enc_record = {"name": label, "dim": int(kb_arr.shape[1])}
        _check_width(enc_record, encoder_dim(name), publish=sources.publish)
    deny = _embed_topics(topics, encoder, settings, name, enc_record) if topics else None
    embed_s = time.perf_counter() - t0
    _check_dims(read, enc_record, embedded=probes is not None)
    kb, id_q, ood = read["KB"], read["ID"], inputs["OOD"]
    assert kb.array is not None and id_q.array is not None
    kb_rows = kb.rows
    told = sources.center_languages
    id_langs, given = (
        _languages(id_q, enc_record, settings) if told or sources.per_language else (None, 0)
    )
    train_inputs = TrainInputs(
        kb_name=str(sources.kb_name or settings.scoring.default_kb),
        encoder=enc_record,
        kb=np.asarray(kb.array, dtype=np.float32),
        id_queries=np.asarray(id_q.array, dtype=np.float32),
        ood_queries=None if ood is None else np.asarray(ood.array, dtype=np.float32),
        kb_ids=kb_rows.ids if kb_rows else [],
        kb_texts=kb_rows.texts if kb_rows else [],
        id_groups=id_q.rows.groups if id_q.rows else None,
        ood_groups=ood.rows.groups if ood is not None and ood.rows else None,
        encoder_probes=probes,
        encoder_source=source,
        deny_topics=topics,
        deny_embeddings=deny,
        id_languages=id_langs,
        id_languages_given=given,
        kb_languages=_languages(kb, enc_record, settings)[0] if told else None,
        ood_languages=_languages(ood, enc_record, settings)[0] if told and ood else None,
    )
    log.info(
        "training inputs: %s KB docs, %s ID, %s OOD queries",
        len(train_inputs.kb),
        len(train_inputs.id_queries),
        0 if train_inputs.ood_queries is None else len(train_inputs.ood_queries),
    )
    return train_inputs, embed_s


def _languages(
    given: _Input, encoder: Mapping[str, Any], settings: Settings
) -> tuple[list[str | None] | None, int]:
    """The language of each of ``given``'s texts: the one its row gives, else told as the
    worker tells a query's (among the encoder's languages, or ``scoring.languages``); and
    how many the rows gave. (None, 0) for an input of embeddings."""
    rows = given.rows
    if rows is None:  # --per-language refused an .npy ID input before any reading
        return None, 0
    return query_languages(
        rows.texts, rows.languages, str(encoder["name"]), settings.scoring.languages
    )


def _embed(
    inputs: Mapping[str, _Input],
    settings: Settings,
    name: str,
    sources: InputSources,
    progress: bool,
    encoder: Any,
) -> tuple[dict[str, Any], np.ndarray, dict[str, Any], Any]:
    """Embed the inputs that are texts alone, and check a sample of those that came with
    embeddings; the encoder's record, its probe embeddings, where it ran (the backend;
    for an embedding server its URL and model names) and the encoder itself."""
    from sidecar.encoders import available_cpus, embed_probes, load_encoder

    # The worker's backend (ONNX Runtime under `auto`), on every CPU the job has.
    enc = encoder or load_encoder(settings, name=name, threads=available_cpus())
    cache = None
    descs = {"KB": "encoding KB", "ID": "encoding ID queries", "OOD": "encoding OOD queries"}
    for what, given in inputs.items():
        if given.to_embed:
            if cache is None:
                from sidecar.training._cache import EmbeddingCache

                cache = EmbeddingCache(enc, sources.cache_dir, progress=progress)
            assert given.texts is not None
            given.array = cache.embed(given.texts, desc=descs[what])
        elif given.rows is not None:  # embeddings read with their texts
            check_stored_embeddings(given.rows, enc, what, sample=sources.check_rows)
    # The cache checked its vectors against them, and the sample check the stored ones:
    # they are the encoder's that made the vectors.
    probes = cache.probes() if cache is not None else embed_probes(enc.encode)
    source: dict[str, Any] = {"backend": getattr(enc, "backend", None)}
    describe = getattr(enc, "describe", None)
    if callable(describe):  # an embedding server: which one, and what it calls the model
        server = describe()
        source.update({k: server[k] for k in ("url", "model", "served_model")})
    return {"name": enc.name, "dim": enc.dim}, probes, source, enc


def _embed_topics(
    topics: tuple[str, ...],
    encoder: Any,
    settings: Settings,
    name: str,
    record: Mapping[str, Any],
) -> np.ndarray:
    """The denied topics embedded by the encoder of the training data (loaded here when
    every input came as embeddings)."""
    if encoder is None:
        from sidecar.encoders import available_cpus, load_encoder

        encoder = load_encoder(settings, name=name, threads=available_cpus())
    E = np.asarray(encoder.encode(list(topics)), dtype=np.float32)
    if E.shape != (len(topics), int(record["dim"])):
        raise DataError(
            f"the encoder embedded the denied topics as {E.shape}, not "
            f"({len(topics)}, {record['dim']}): it is not the encoder of the training inputs"
        )
    return E


def _check_dims(
    inputs: Mapping[str, _Input], encoder: Mapping[str, Any], *, embedded: bool
) -> None:
    """Every array has the encoder's width; only a ``.npy`` can be off."""
    dim = int(encoder["dim"])
    for what, given in inputs.items():
        arr = given.array
        if arr is None or arr.shape[1] == dim:
            continue
        against = f"encoder {encoder['name']} gives" if embedded else "the KB embeddings have"
        raise DataError(
            f"{what} embeddings ({given.given}) have {arr.shape[1]} dims, but {against} {dim}"
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
