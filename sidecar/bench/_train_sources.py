"""How fast, and in how much memory, training inputs stream from PostgreSQL and Parquet
(``sidecar bench train-sources``).

In a scratch database on the server that ``postgres.dsn`` names (created, then dropped),
the benchmark builds a table of synthetic texts and one of texts with 384-dim ``real[]``
embeddings, writes the same rows to two Parquet files, and reads each through the readers
``sidecar train`` uses, each read in a process of its own: time, rows per second, peak RSS
and the RSS sampled as rows come in (flat if the reader streams). Then it runs the
training job's input loading on the embeddings table (the sample check included, nothing
else encoded), whose result must hold the whole KB matrix.

The embedded texts cycle through a pool of distinct sentences embedded once by the real
encoder, so that the stored vectors pass the check the job makes; reading costs the same
whatever the vectors hold.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._report_file import write_report
from sidecar.errors import ConfigError, SidecarError

POOL = 512  # distinct embedded sentences
QUERIES = 200  # ID queries beside the KB, for the input-loading run

_WORDS = [
    "invoice",
    "refund",
    "parcel",
    "clinic",
    "appointment",
    "warranty",
    "account",
    "password",
    "delivery",
    "schedule",
    "policy",
    "coverage",
    "claim",
    "ticket",
    "order",
    "payment",
    "return",
    "exchange",
    "booking",
    "insurance",
    "doctor",
    "fever",
    "dosage",
    "prescription",
    "shipping",
    "tracking",
    "balance",
    "statement",
]


@dataclass(frozen=True)
class TrainSourcesBenchConfig:
    """What ``sidecar bench train-sources`` builds and reads.

    ``rows``: rows of each table and file. ``every``: RSS is sampled each time this many
    more rows have come in. ``work_dir``: where the Parquet files go (None: a temporary
    folder, deleted after). ``load_inputs``: also run the training job's input loading on
    the embeddings table (loads the encoder; the result holds rows x 384 float32).
    """

    json_out: Path
    rows: int = 1_000_000
    every: int = 100_000
    work_dir: Path | None = None
    load_inputs: bool = True


def run_train_sources_bench(
    config: TrainSourcesBenchConfig, settings: Any, *, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Build the scratch tables and files, measure each read, write the report (to
    ``config.json_out``) and return it; ``echo`` gets one line per measurement."""
    if settings.postgres.dsn is None:
        raise ConfigError(
            "sidecar bench train-sources needs a PostgreSQL server: set postgres.dsn (the "
            "secret file postgres__dsn or SIDECAR_POSTGRES__DSN); it creates and drops a "
            "scratch database there"
        )
    t0 = time.perf_counter()
    pool_texts = [_sentence(i) for i in range(POOL)]
    pool, encoder_name = _pool_embeddings(pool_texts, settings, real=config.load_inputs)
    admin = settings.postgres.dsn.get_secret_value()
    with _scratch_database(admin) as dsn, _work_dir(config.work_dir) as work:
        _build_tables(dsn, config.rows, pool_texts, pool)
        files = _write_parquet(work, config.rows, pool_texts, pool)
        build_s = time.perf_counter() - t0
        echo(f"built {config.rows} rows per table and file in {build_s:.0f}s")
        jobs = {
            "pg_texts": {"kind": "pg", "source": "bench_texts"},
            "pg_vectors": {"kind": "pg", "source": "bench_vectors"},
            "parquet_texts": {"kind": "parquet", "source": str(files["texts"])},
            "parquet_vectors": {"kind": "parquet", "source": str(files["vectors"])},
        }
        if config.load_inputs:
            jobs["pg_load_inputs"] = {
                "kind": "pg-load-inputs",
                "source": "bench_vectors",
                "queries": "bench_queries",
            }
        runs = {}
        for name, job in jobs.items():
            runs[name] = _measure({**job, "every": config.every}, dsn, settings)
            r = runs[name]
            echo(
                f"{name}: {r['rows']} rows in {r['seconds']:.1f}s ({r['rows_per_s']}/s), "
                f"peak RSS {r['peak_rss_mib']:.0f} MiB"
            )
    out = {
        "rows": config.rows,
        "dims": int(pool.shape[1]),
        "fetch_rows": settings.postgres.fetch_rows,
        "encoder": encoder_name,
        "build_s": round(build_s, 1),
        "cpus": os.cpu_count(),
        # The machine's 1-minute load average as the runs ended: other work on it slows
        # every figure above (2 is a busy 2-CPU machine).
        "load_average_1m": round(os.getloadavg()[0], 1),
        "runs": runs,
        "note": "pg_*/parquet_*: the reader alone (each batch read, checked and dropped); "
        "rss_mib_at_rows samples the resident memory as rows come in. pg_load_inputs: the "
        "training job's input loading from the real[] table (plus 200 ID queries), a "
        "sample of 64 rows per input re-embedded as proof, nothing else encoded; its "
        "result holds the KB matrix (kb_matrix_mib) and every text. Texts of the vector "
        f"rows cycle through {POOL} distinct sentences embedded by the real encoder (random "
        "unit vectors when the input loading is not measured).",
    }
    write_report(config.json_out, out)
    return out


def _pool_embeddings(texts: list[str], settings: Any, *, real: bool) -> tuple[np.ndarray, str]:
    """The pool's embeddings by the real encoder (the input-loading run checks a sample of
    them), or random unit vectors of its width when only the readers are measured."""
    if not real:
        v = np.random.default_rng(0).normal(size=(len(texts), 384))
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32), "none"
    from sidecar.encoders import available_cpus, load_encoder

    encoder = load_encoder(settings.scoring, threads=available_cpus())
    return np.asarray(encoder.encode(texts), dtype=np.float32), encoder.name


def _sentence(i: int) -> str:
    rng = np.random.default_rng(i)
    words = rng.choice(_WORDS, size=12)
    return f"Question {i} about the " + " ".join(words) + "."


def _text(i: int) -> str:
    """The synthetic text of row ``i`` of the texts table (as the SQL builds it)."""
    h = hashlib.md5(str(i).encode()).hexdigest()
    return f"synthetic document {i}: {h} {h[::-1]} {h[:16]}"


@contextmanager
def _scratch_database(admin_dsn: str) -> Iterator[str]:
    """A new, empty database on the server of ``admin_dsn`` (its DSN), dropped after."""
    import psycopg
    from psycopg import conninfo, sql

    name = f"sidecar_bench_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        why = " ".join(str(exc).split()[:30]).replace(admin_dsn, "<dsn>")
        raise SidecarError(f"cannot create a scratch database: {why}") from None
    try:
        yield conninfo.make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def _work_dir(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="train-sources-") as tmp:
        yield Path(tmp)


def _build_tables(dsn: str, rows: int, pool_texts: list[str], pool: np.ndarray) -> None:
    """bench_texts (id, text), bench_vectors (id, text, embedding real[]) and
    bench_queries (text, embedding), built on the server (no row crosses the wire twice)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        # No parameters are passed: psycopg leaves the %s of format() alone.
        conn.execute(
            "CREATE UNLOGGED TABLE bench_texts AS SELECT g AS id, format("
            "'synthetic document %s: %s %s %s', g, md5(g::text), reverse(md5(g::text)), "
            f"left(md5(g::text), 16)) AS text FROM generate_series(0, {int(rows)} - 1) g"
        )
        conn.execute("CREATE TABLE bench_pool (k int PRIMARY KEY, text text, embedding real[])")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bench_pool VALUES (%s, %s, %s)",
                [(k, t, pool[k].tolist()) for k, t in enumerate(pool_texts)],
            )
        conn.execute(
            f"CREATE UNLOGGED TABLE bench_vectors AS SELECT g AS id, p.text, p.embedding "
            f"FROM generate_series(0, {int(rows)} - 1) g JOIN bench_pool p ON p.k = g % {POOL}"
        )
        conn.execute(
            f"CREATE TABLE bench_queries AS SELECT text, embedding FROM bench_pool "
            f"WHERE k < {QUERIES}"
        )
        for table in ("bench_texts", "bench_vectors"):
            conn.execute(f"ANALYZE {table}")  # the reader's progress total


def _write_parquet(
    work: Path, rows: int, pool_texts: list[str], pool: np.ndarray
) -> dict[str, Path]:
    """The same rows as two Parquet files, written in row groups of 64k rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {"texts": work / "texts.parquet", "vectors": work / "vectors.parquet"}
    dim = pool.shape[1]
    step = 65_536
    texts_schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    vec_schema = pa.schema(
        [("id", pa.int64()), ("text", pa.string()), ("embedding", pa.list_(pa.float32(), dim))]
    )
    with (
        pq.ParquetWriter(paths["texts"], texts_schema) as tw,
        pq.ParquetWriter(paths["vectors"], vec_schema) as vw,
    ):
        for start in range(0, rows, step):
            ids = np.arange(start, min(rows, start + step))
            tw.write_table(
                pa.table({"id": ids, "text": [_text(int(i)) for i in ids]}, schema=texts_schema)
            )
            k = ids % POOL
            emb = pa.FixedSizeListArray.from_arrays(pa.array(pool[k].ravel()), dim)
            vw.write_table(
                pa.table(
                    {"id": ids, "text": [pool_texts[j] for j in k], "embedding": emb},
                    schema=vec_schema,
                )
            )
    return paths


def _measure(job: dict[str, Any], dsn: str, settings: Any) -> dict[str, Any]:
    """Run one measurement in a child process; its result."""
    env = {**os.environ, "SIDECAR_POSTGRES__DSN": dsn}
    env["SIDECAR_POSTGRES__FETCH_ROWS"] = str(settings.postgres.fetch_rows)
    cmd = [sys.executable, "-m", "sidecar.bench._train_sources_child", json.dumps(job)]
    t0 = time.perf_counter()
    child = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if child.returncode != 0:
        lines = [ln for ln in child.stderr.splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {child.returncode}"
        raise SidecarError(f"measuring {job['kind']} {job['source']} failed: {why}")
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return {**result, "process_wall_s": round(wall, 2)}
