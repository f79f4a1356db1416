"""The KB readers' parsing without a server: PostgreSQL's binary float arrays, pgvector
values, table names and queries, Arrow batches, and the row checks they share."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sidecar.errors import ConfigError, DataError
from sidecar.settings import load_settings
from sidecar.training._source_rows import RowBatch, RowCollector, group_numbers, stack_vectors
from sidecar.training._sources_parquet import arrow_vectors, read_parquet, record_batch_rows
from sidecar.training._sources_sql import (
    PostgresSource,
    _masked,
    _query_text,
    float_arrays,
    parse_table,
    vector_values,
)

SECRET = "s3cr3t-pw"


def pg_array(values: list[float] | None, *, oid: int = 700, nulls: bool = False) -> bytes:
    """A float array in PostgreSQL's binary format (what array_send writes)."""
    if values is None:
        return struct.pack("!iiI", 0, 0, oid)
    fmt, size = ("!f", 4) if oid == 700 else ("!d", 8)
    head = struct.pack("!iiIii", 1, int(nulls), oid, len(values), 1)
    body = b"".join(struct.pack("!i", size) + struct.pack(fmt, v) for v in values)
    return head + body


def test_binary_float_arrays_parse_as_one_matrix() -> None:
    rows = [[0.5, -1.25, 3.0], [1.0, 2.0, 4.5]]
    got = float_arrays([pg_array(r) for r in rows], "t", 0)
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, np.array(rows, dtype=np.float32))
    doubles = float_arrays([pg_array(r, oid=701) for r in rows], "t", 0)
    np.testing.assert_array_equal(doubles, np.array(rows, dtype=np.float32))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([pg_array([1.0, 2.0]), None], "row 12: 'embedding' is NULL"),
        ([pg_array([1.0, 2.0]), pg_array([1.0, 2.0, 3.0])], "row 12: 'embedding' has 3 values"),
        ([pg_array([1.0]), pg_array([2.0], nulls=True)], "row 12: 'embedding' holds NULL"),
        ([pg_array(None)], "row 11: 'embedding' is an empty array"),
        ([struct.pack("!iiIiiii", 2, 0, 700, 1, 1, 1, 1)], "multi-dimensional"),
        ([pg_array([1.0], oid=23)], "type oid 23, not of floats"),
    ],
)
def test_bad_arrays_name_the_row(values: list[bytes | None], message: str) -> None:
    with pytest.raises(DataError, match=message):
        float_arrays(values, "--kb-sql docs", 10)


def test_pgvector_values_become_float32_rows() -> None:
    from pgvector import HalfVector, Vector

    for value in (
        Vector.from_text("[1.5,2,-3]"),
        Vector.from_binary(Vector([1.5, 2.0, -3.0]).to_binary()),
        HalfVector([1.5, 2.0, -3.0]),
    ):
        got = vector_values(value)
        assert got is not None and got.dtype == np.float32
        np.testing.assert_array_equal(got, [1.5, 2.0, -3.0])
    assert vector_values(None) is None
    stacked = stack_vectors([vector_values(Vector([1.0, 2.0]))] * 3, "t", 0)
    assert stacked.shape == (3, 2)
    with pytest.raises(DataError, match="row 6: 'embedding' is NULL"):
        stack_vectors([np.ones(2), None], "t", 4)
    with pytest.raises(DataError, match="2 widths"):
        stack_vectors([np.ones(2), np.ones(3)], "t", 0)


@pytest.mark.parametrize(
    ("source", "parts"),
    [
        ("docs", ("docs",)),
        ("Rag.Docs", ("rag", "docs")),
        (' rag . "Docs 2024" ', ("rag", "Docs 2024")),
        ('"a""b"', ('a"b',)),
        ("SELECT id, text FROM docs", None),
        ("a.b.c", None),
        ("docs; DROP TABLE docs", None),
    ],
)
def test_table_names_are_told_from_queries(source: str, parts: tuple[str, ...] | None) -> None:
    assert parse_table(source) == parts


def test_queries_must_read() -> None:
    assert _query_text(" SELECT id, text FROM docs ;\n", "--kb-sql") == (
        "SELECT id, text FROM docs"
    )
    for ok in ("with x as (select 1) select * from x", "(SELECT 1)", "VALUES (1, 'a')"):
        assert _query_text(ok, "--kb-sql")
    for bad in ("DELETE FROM docs", "docs; DROP TABLE docs", ""):
        with pytest.raises(ConfigError, match="--kb-sql takes a table"):
            _query_text(bad, "--kb-sql")


def test_messages_never_show_the_password() -> None:
    for text in (
        f'bad URI: "postgresql://app:{SECRET}@db:5432/kb"',
        f"host=db password={SECRET} user=app",
        f"host=db password='{SECRET} x' user=app",
    ):
        assert SECRET not in _masked(text, [])
    assert _masked(f"x {SECRET} y", [SECRET]) == "x *** y"


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        (f"postgresql://app:{SECRET}@[::1:5432/kb", "not a valid connection string"),
        (f"host=db password={SECRET} user", "not a valid connection string"),
    ],
)
def test_a_malformed_dsn_is_a_config_error_without_the_password(dsn: str, message: str) -> None:
    settings = load_settings(postgres={"dsn": dsn})
    with pytest.raises(ConfigError, match=message) as exc:
        PostgresSource(settings.postgres).__enter__()
    assert SECRET not in str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__context__ is None


def test_no_dsn_says_where_to_give_it() -> None:
    with pytest.raises(ConfigError, match=r"postgres\.dsn is not set.*postgres__dsn"):
        PostgresSource(load_settings().postgres, option="--id-queries-sql").__enter__()


def test_the_dsn_is_a_secret_in_settings() -> None:
    settings = load_settings(postgres={"dsn": f"postgresql://app:{SECRET}@db/kb"})
    assert SECRET not in repr(settings) and SECRET not in str(settings.postgres)
    with pytest.raises(ConfigError, match=r"postgres\.dsn is set but empty"):
        load_settings(postgres={"dsn": "  "})


def test_collector_checks_each_row() -> None:
    emb = np.ones((2, 3), dtype=np.float32)
    cases = [
        (RowBatch(texts=["a", " "], ids=[1, 2]), "row 2 \\(id '2'\\): 'text' is empty"),
        (RowBatch(texts=["a", None], ids=[1, 2]), "'text' is NULL"),
        (RowBatch(texts=["a", "b"], ids=[1, None]), "row 2: 'id' is NULL"),
        (RowBatch(texts=["a", "b"], ids=[7, "7"]), "row 2: duplicate id '7'"),
        (RowBatch(texts=["a", "b"]), "no 'id' column"),
        (
            RowBatch(texts=["a", "b"], ids=[1, 2], embeddings=np.array([[1.0, np.nan]] * 2)),
            "row 1 \\(id '1'\\): 'embedding' holds NaN.*1 more rows",
        ),
        (
            RowBatch(texts=["a", "b"], ids=[1, 2], embeddings=np.zeros((2, 3))),
            "'embedding' is all zeros",
        ),
    ]
    for batch, message in cases:
        with pytest.raises(DataError, match=message):
            RowCollector("t", kb=True).add(batch)
    c = RowCollector("t", kb=True)
    c.add(RowBatch(texts=["a", "b"], ids=[1, 2], embeddings=emb))
    with pytest.raises(DataError, match="2 dims in some rows and 3 in others"):
        c.add(RowBatch(texts=["c"], ids=[3], embeddings=np.ones((1, 2))))
    with pytest.raises(DataError, match="t: row 3: duplicate id '1'"):
        c.add(RowBatch(texts=["c"], ids=[1], embeddings=np.ones((1, 3))))
    with pytest.raises(DataError, match="t: no rows"):
        RowCollector("t", kb=False).finish()


def test_collector_joins_batches_into_one_matrix() -> None:
    c = RowCollector("t", kb=True)
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 4)).astype(np.float32) for n in (3, 5, 1)]
    start = 0
    for part in parts:
        n = len(part)
        c.add(
            RowBatch(
                texts=[f" t{start + i} " for i in range(n)],
                ids=range(start, start + n),
                embeddings=part,
            )
        )
        start += n
    rows = c.finish()
    assert rows.ids == [str(i) for i in range(9)] and rows.texts[0] == "t0"
    assert rows.embeddings is not None
    np.testing.assert_array_equal(rows.embeddings, np.concatenate(parts))
    assert rows.groups is None


def test_query_groups_are_numbered_as_in_jsonl() -> None:
    assert group_numbers([None, None]) is None
    assert group_numbers([3, "3", None, "a", 3]) == [0, 0, 1, 2, 0]
    c = RowCollector("q", kb=False)
    c.add(RowBatch(texts=["a", "b"], groups=["x", None]))
    c.add(RowBatch(texts=["c"], groups=["x"]))
    assert c.finish().groups == [0, 1, 0]
    with pytest.raises(DataError, match="'group' must be a string or an integer, got float"):
        RowCollector("q", kb=False).add(RowBatch(texts=["a"], groups=[1.5]))


def test_arrow_vectors_of_every_list_kind() -> None:
    rows = [[1.0, 2.0], [3.0, 4.0]]
    for arr in (
        pa.array(rows, type=pa.list_(pa.float32())),
        pa.array(rows, type=pa.large_list(pa.float64())),
        pa.array(rows, type=pa.list_(pa.float32(), 2)),
        pa.array([[9.0, 9.0], *rows], type=pa.list_(pa.float32())).slice(1),
    ):
        got = arrow_vectors(arr, "f", 0)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, rows)


@pytest.mark.parametrize(
    ("arr", "message"),
    [
        (pa.array([[1.0, 2.0], [1.0]]), "row 102: 'embedding' has 1 values, row 101 has 2"),
        (pa.array([[1.0, 2.0], None]), "row 102: 'embedding' is NULL"),
        (pa.array([[1.0, None]]), "holds NULL values"),
        (pa.array([[1, 2]]), "expected a list of floats"),
        (pa.array(["1,2"]), "expected a list of floats"),
    ],
)
def test_bad_arrow_vectors(arr: pa.Array, message: str) -> None:
    with pytest.raises(DataError, match=message):
        arrow_vectors(arr, "f", 100)


def test_record_batch_text_must_be_strings() -> None:
    rb = pa.record_batch({"id": [1], "text": [b"bytes"]})
    with pytest.raises(DataError, match="column 'text' is binary"):
        record_batch_rows(rb, "f", 0)
    dictionary = pa.array(["a", "b", "a"]).dictionary_encode()
    batch = record_batch_rows(pa.record_batch({"id": [1, 2, 3], "text": dictionary}), "f", 0)
    assert list(batch.texts) == ["a", "b", "a"]


def test_parquet_is_read_in_batches(tmp_path: Path) -> None:
    from sidecar.training._sources_parquet import parquet_batches

    n = 50
    emb = np.random.default_rng(1).normal(size=(n, 8)).astype(np.float32)
    table = pa.table(
        {
            "id": [f"d{i}" for i in range(n)],
            "text": [f"text {i}" for i in range(n)],
            "extra": list(range(n)),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 8),
        }
    )
    folder = tmp_path / "kb"
    folder.mkdir()
    pq.write_table(table.slice(0, 20), folder / "part-0.parquet")
    pq.write_table(table.slice(20), folder / "part-1.parquet")
    (folder / "_SUCCESS").write_text("")
    sizes = [len(b.texts) for b in parquet_batches(folder, kb=True, progress=False, batch_rows=8)]
    assert sum(sizes) == n and max(sizes) <= 8
    rows = read_parquet(folder, kb=True, progress=False)
    assert sorted(rows.ids) == sorted(f"d{i}" for i in range(n))
    assert rows.embeddings is not None and rows.embeddings.shape == (n, 8)
    order = [int(i[1:]) for i in rows.ids]
    np.testing.assert_array_equal(rows.embeddings, emb[order])


def test_parquet_errors_are_one_line(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1], "body": ["x"]}), tmp_path / "kb.parquet")
    with pytest.raises(DataError, match="no column 'text' \\(it has id, body\\)"):
        read_parquet(tmp_path / "kb.parquet", kb=True, progress=False)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not readable as Parquet"):
        read_parquet(tmp_path / "bad.parquet", kb=True, progress=False)
    with pytest.raises(DataError, match="not found"):
        read_parquet(tmp_path / "missing.parquet", kb=True, progress=False)
