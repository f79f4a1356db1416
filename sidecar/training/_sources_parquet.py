"""A KB or a query set read from Parquet, the data lake's format, one record batch at a time.

A source is one ``.parquet`` file or a directory of them (a table as Spark, DuckDB or a
lake writes it, partition folders included; files whose names start with ``_`` or ``.``
are skipped). Columns as for
PostgreSQL: ``text``, ``id`` (required for a KB), ``group`` (queries, optional) and
``embedding`` (optional): a list or fixed-size list of floats per row. Only these columns
are read, one row group at a time, so a wide file or a large one costs one row group of
memory (as the writer sized them: 64k to 1M rows).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.training._source_rows import (
    EMBEDDING,
    GROUP,
    ID,
    TEXT,
    RowBatch,
    RowCollector,
    SourceRows,
)

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
BATCH_ROWS = 8192


def is_parquet(path: str | Path) -> bool:
    """Whether an input path names Parquet (a Parquet file, or a directory of them)."""
    p = Path(path)
    return p.suffix.lower() in PARQUET_SUFFIXES or p.is_dir()


def read_parquet(path: str | Path, *, kb: bool, progress: bool = True) -> SourceRows:
    """Every row of the Parquet file or directory ``path``, checked."""
    collector = RowCollector(str(path), kb=kb)
    for batch in parquet_batches(path, kb=kb, progress=progress):
        collector.add(batch)
    return collector.finish()


def parquet_batches(
    path: str | Path, *, kb: bool, progress: bool = True, batch_rows: int = BATCH_ROWS
) -> Iterator[RowBatch]:
    """The rows of ``path`` as :class:`RowBatch` objects of at most ``batch_rows`` rows.

    Files are read one row group at a time, each by its own batch iterator: one iterator
    over a whole file kept every list column's values it had read until the end of the
    file (pyarrow 26), a whole embeddings file in memory; one per row group holds at most
    that row group's.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    given = str(path)
    problem, where = None, given
    try:
        files = _files(Path(path))
        opened = []
        for f in files:
            where = str(f)
            opened.append(pq.ParquetFile(f))
        total = sum(pf.metadata.num_rows for pf in opened)
        done = 0
        with tqdm(total=total, desc=f"reading {given}", unit="row", disable=not progress) as bar:
            for f, pf in zip(files, opened, strict=True):
                where = str(f)
                columns = _columns(pf.schema_arrow.names, f, kb=kb)
                for group in range(pf.num_row_groups):
                    for rb in pf.iter_batches(
                        batch_size=batch_rows, row_groups=[group], columns=columns
                    ):
                        if rb.num_rows:
                            yield record_batch_rows(rb, given, done)
                            done += rb.num_rows
                            bar.update(rb.num_rows)
        log.info("%s: %s rows read", given, done)
    except (pa.ArrowException, OSError) as exc:
        problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if problem is not None:
        shown = given if where == given else f"{given} ({Path(where).name})"
        raise DataError(f"{shown}: not readable as Parquet: {problem}")


def _files(path: Path) -> list[Path]:
    """``path`` itself, or the files under the directory ``path`` (sorted; names that start
    with ``_`` or ``.``, such as ``_SUCCESS`` or checksums, skipped)."""
    if not path.exists():
        raise DataError(f"Parquet input not found: {path}")
    if not path.is_dir():
        return [path]
    files = sorted(
        f
        for f in path.rglob("*")
        if f.is_file()
        and not any(part.startswith(("_", ".")) for part in f.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"{path}: no Parquet files in this directory")
    return files


def _columns(names: list[str], path: Path, *, kb: bool) -> list[str]:
    """The columns to read; DataError when a required one is missing."""
    need = (ID, TEXT) if kb else (TEXT,)
    missing = [n for n in need if n not in names]
    if missing:
        raise DataError(
            f"{path}: no column {' or '.join(map(repr, missing))} (it has "
            f"{', '.join(names[:12]) or 'no columns'})"
        )
    wanted = (ID, TEXT, EMBEDDING) if kb else (ID, TEXT, GROUP, EMBEDDING)
    return [c for c in wanted if c in names]


def record_batch_rows(rb: Any, given: str, first_row: int) -> RowBatch:
    """One Arrow record batch as a :class:`RowBatch`; ``first_row`` (0-based) numbers its
    rows in messages."""
    import pyarrow as pa

    names = rb.schema.names

    def column(name: str) -> list[Any] | None:
        return rb.column(names.index(name)).to_pylist() if name in names else None

    text = rb.column(names.index(TEXT))
    kind = text.type.value_type if pa.types.is_dictionary(text.type) else text.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{given}: column 'text' is {text.type}, expected strings")
    emb = rb.column(names.index(EMBEDDING)) if EMBEDDING in names else None
    return RowBatch(
        texts=text.to_pylist(),
        ids=column(ID),
        groups=column(GROUP),
        embeddings=None if emb is None else arrow_vectors(emb, given, first_row),
    )


def arrow_vectors(arr: Any, given: str, first_row: int) -> np.ndarray:
    """An Arrow list (or fixed-size list) column of floats as (n, dim) float32; NULL rows,
    NULL elements and rows of different lengths are a :class:`~sidecar.errors.DataError`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise DataError(f"{given}: column 'embedding' is {t}, expected a list of floats")
    if not pa.types.is_floating(t.value_type):
        raise DataError(f"{given}: column 'embedding' is {t}, expected a list of floats")
    if arr.null_count:
        first = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
        raise DataError(
            f"{given}: row {first_row + first + 1}: 'embedding' is NULL: filter such rows out, "
            "or leave the column out to embed every text here"
        )
    n = len(arr)
    if pa.types.is_fixed_size_list(t):
        width = t.list_size
    else:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        width = int(lengths[0]) if n else 0
        if n and (lengths != width).any():
            bad = int(np.argmax(lengths != width))
            raise DataError(
                f"{given}: row {first_row + bad + 1}: 'embedding' has {int(lengths[bad])} "
                f"values, row {first_row + 1} has {width}"
            )
    flat = arr.flatten()
    if flat.null_count:
        raise DataError(f"{given}: 'embedding' holds NULL values from row {first_row + 1} on")
    values = flat.to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float32).reshape(n, width)
