"""``sidecar train`` from PostgreSQL, against the real server in a scratch database.

The demo KB and its queries are loaded into tables, with their embeddings by the real
encoder in ``real[]`` / ``double precision[]`` columns (the pgvector extension is tested
where the server has it). Nothing here mocks the driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from click.testing import CliRunner, Result
from support.postgres import postgres_server, scratch_database  # noqa: F401

from model_store import load_dir
from sidecar.cli import main
from sidecar.errors import DataError, SourceUnavailable
from sidecar.persistence import model_from_artifact
from sidecar.settings import load_settings
from sidecar.training import InputSources, load_inputs
from sidecar.training._jsonl import DEMO_ID_QUERIES, DEMO_KB, DEMO_OOD_QUERIES, demo_path
from sidecar.training._sources_sql import PostgresSource

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "n0t-the-real-pw"


def _jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in demo_path(name).read_text().splitlines() if line]


@pytest.fixture(scope="module")
def encoder() -> Any:
    """The real default encoder, loaded once for the module."""
    from sidecar.encoders import load_encoder

    return load_encoder(load_settings().scoring)


@pytest.fixture(scope="module")
def kb_db(scratch_database: str, encoder: Any) -> Iterator[str]:  # noqa: F811
    """The demo KB and queries as tables, with their real embeddings; the database's DSN."""
    kb, idq, ood = _jsonl(DEMO_KB), _jsonl(DEMO_ID_QUERIES), _jsonl(DEMO_OOD_QUERIES)
    emb = {
        name: encoder.encode([r["text"] for r in rows])
        for name, rows in (("kb", kb), ("id", idq), ("ood", ood))
    }
    other = np.random.default_rng(0).normal(size=emb["kb"].shape)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA rag")
        conn.execute("CREATE TABLE rag.docs (id text PRIMARY KEY, text text, embedding real[])")
        conn.execute("CREATE TABLE rag.other (id int, text text, embedding real[])")
        conn.execute('CREATE TABLE id_queries (text text, "group" int, embedding real[])')
        conn.execute("CREATE TABLE ood_queries (text text, embedding double precision[])")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO rag.docs VALUES (%s, %s, %s)",
                [(r["id"], r["text"], e.tolist()) for r, e in zip(kb, emb["kb"], strict=True)],
            )
            cur.executemany(
                "INSERT INTO rag.other VALUES (%s, %s, %s)",
                [
                    (i, r["text"], e.tolist())
                    for i, (r, e) in enumerate(zip(kb, other, strict=True))
                ],
            )
            cur.executemany(
                "INSERT INTO id_queries VALUES (%s, %s, %s)",
                [
                    (r["text"], i // 3, e.tolist())
                    for i, (r, e) in enumerate(zip(idq, emb["id"], strict=True))
                ],
            )
            cur.executemany(
                "INSERT INTO ood_queries VALUES (%s, %s)",
                [(r["text"], e.tolist()) for r, e in zip(ood, emb["ood"], strict=True)],
            )
    yield scratch_database


def _settings(dsn: str, **postgres: Any) -> Any:
    return load_settings(postgres={"dsn": dsn, **postgres})


def _train(dsn: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["train", *args], env={"SIDECAR_POSTGRES__DSN": dsn})


def test_train_from_tables_with_stored_embeddings_encodes_nothing_else(
    kb_db: str, tmp_path: Path
) -> None:
    cache, out = tmp_path / "cache", tmp_path / "model"
    res = _train(
        kb_db,
        "--kb-sql",
        "rag.docs",
        "--id-queries-sql",
        "id_queries",
        "--ood-queries-sql",
        "SELECT text, embedding FROM ood_queries",
        "--cache-dir",
        str(cache),
        "--out",
        str(out),
        "--no-report",
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    assert not cache.exists()  # nothing went through the embedding cache: no text encoded
    model = model_from_artifact(load_dir(out))
    assert model.encoder["name"] == "all-MiniLM-L6-v2" and model.encoder["dim"] == 384
    assert model.encoder_probes is not None  # the workers check these as for any model
    assert "102 ID in 34 groups" in res.output  # the "group" column, as in JSONL
    # The release check reads held-out sets from the database as well (stored vectors,
    # proven by a sample, against the model's probes).
    check = CliRunner().invoke(
        main,
        [
            "check",
            "--artifact",
            str(out),
            "--id-queries-sql",
            'SELECT text, embedding FROM id_queries WHERE "group" % 2 = 0',
            "--ood-queries-sql",
            "ood_queries",
            "--max-frr",
            "1",
            "--no-progress",
        ],
        env={"SIDECAR_POSTGRES__DSN": kb_db},
    )
    assert check.exit_code == 0, check.output
    assert "gate --max-frr 1: met" in check.output


def test_texts_from_a_query_are_encoded_like_jsonl(
    kb_db: str, encoder: Any, tmp_path: Path
) -> None:
    sources = InputSources(
        kb_sql="SELECT id, text FROM rag.docs WHERE id <> 'parking' ORDER BY id",
        id_queries_sql='SELECT text, "group" FROM id_queries',
        cache_dir=tmp_path / "cache",
    )
    inputs, _ = load_inputs(sources, _settings(kb_db), progress=False, encoder=encoder)
    assert "parking" not in inputs.kb_ids and inputs.kb_ids == sorted(inputs.kb_ids)
    assert len(inputs.kb) == len(_jsonl(DEMO_KB)) - 1
    assert (tmp_path / "cache").is_dir()  # these were encoded here
    stored = dict(zip(inputs.kb_ids, inputs.kb, strict=True))
    with psycopg.connect(kb_db) as conn:
        rows = conn.execute("SELECT id, embedding FROM rag.docs WHERE id = 'hours'").fetchall()
    np.testing.assert_allclose(stored["hours"], rows[0][1], atol=1e-5)
    assert inputs.id_groups is not None and inputs.id_groups[:4] == [0, 0, 0, 1]


def test_embeddings_from_another_encoder_are_refused(
    kb_db: str, encoder: Any, tmp_path: Path
) -> None:
    sources = InputSources(
        kb_sql="rag.other", id_queries_sql="id_queries", cache_dir=tmp_path / "cache"
    )
    with pytest.raises(DataError) as exc:
        load_inputs(sources, _settings(kb_db), progress=False, encoder=encoder)
    assert "KB embeddings (--kb-sql rag.other) were not made by encoder all-MiniLM-L6-v2" in (
        str(exc.value)
    )
    assert "gives 64 below a cosine of 0.995" in str(exc.value)


def test_bad_dsn_and_unreachable_server_are_one_line_without_the_password(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    for dsn, expected in (
        (
            f"postgresql://app:{SECRET}@127.0.0.1:1/kb",
            "cannot connect to PostgreSQL at 127.0.0.1:1",
        ),
        (f"postgresql://app:{SECRET}@[::1:5432/kb", "postgres.dsn is not a valid connection"),
        (f"host=127.0.0.1 password={SECRET} port", "postgres.dsn is not a valid connection"),
    ):
        res = _train(dsn, "--kb-sql", "docs", "--id-queries-sql", "q", "--out", str(tmp_path / "m"))
        line = one_error_line(res)
        assert expected in line and SECRET not in res.output


def test_wrong_password_names_the_server_not_the_password(
    postgres_server: str,  # noqa: F811
) -> None:
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(postgres_server)
    dsn = conninfo.make_conninfo(postgres_server, user="no_such_role", password=SECRET)
    with pytest.raises(SourceUnavailable) as exc, PostgresSource(_settings(dsn).postgres):
        pass
    assert f"{params.get('host')}" in str(exc.value) and SECRET not in str(exc.value)
    assert exc.value.retryable


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("SELECT id AS doc_id, text FROM rag.docs", "no column 'id'"),
        ("SELECT id, text, 1 AS embedding FROM rag.docs", "column 'embedding' is int4"),
        ("rag.nosuch", 'relation "rag.nosuch" does not exist'),
        ("SELECT id, text, NULL::real[] AS embedding FROM rag.docs", "row 1: 'embedding' is NULL"),
        ("SELECT id, '' AS text FROM rag.docs", "'text' is empty"),
        ("SELECT id, text FROM rag.docs WHERE nextval('s') > 0", "read-only transaction"),
        (
            "WITH gone AS (DELETE FROM rag.docs RETURNING id, text) SELECT * FROM gone",
            "data-modifying",
        ),
    ],
)
def test_bad_tables_and_queries(kb_db: str, source: str, message: str) -> None:
    with psycopg.connect(kb_db, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE IF NOT EXISTS s")
    with (
        pytest.raises(DataError, match=message) as exc,
        PostgresSource(_settings(kb_db).postgres) as pg,
    ):
        pg.read(source, option="--kb-sql", kb=True, progress=False)
    assert str(exc.value).startswith("--kb-sql ")
    with psycopg.connect(kb_db) as conn:  # the delete was refused
        assert conn.execute("SELECT count(*) FROM rag.docs").fetchone() == (len(_jsonl(DEMO_KB)),)


def test_large_tables_stream_in_batches(kb_db: str) -> None:
    with PostgresSource(_settings(kb_db, fetch_rows=7).postgres) as pg:
        batches = list(pg.batches("rag.docs", option="--kb-sql", kb=True, progress=False))
        rows = pg.read("rag.docs", option="--kb-sql", kb=True, progress=False)
    assert max(len(b.texts) for b in batches) == 7 and len(batches) == -(-len(rows.ids) // 7)
    assert rows.embeddings is not None and rows.embeddings.shape == (len(rows.ids), 384)


def test_a_pgvector_column_where_the_extension_exists(kb_db: str) -> None:
    try:
        with psycopg.connect(kb_db, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        pytest.skip(f"the pgvector extension is not installed on this server ({exc.sqlstate})")
    with psycopg.connect(kb_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS rag.vec AS "
            "SELECT id, text, embedding::vector(384) AS embedding FROM rag.docs"
        )
    with PostgresSource(_settings(kb_db).postgres) as pg:
        vec = pg.read("rag.vec", option="--kb-sql", kb=True, progress=False)
        arr = pg.read("rag.docs", option="--kb-sql", kb=True, progress=False)
    assert vec.embeddings is not None and arr.embeddings is not None
    order = {k: i for i, k in enumerate(arr.ids)}
    np.testing.assert_array_equal(vec.embeddings, arr.embeddings[[order[i] for i in vec.ids]])
