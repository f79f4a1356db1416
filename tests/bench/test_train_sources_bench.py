"""``sidecar bench train-sources`` at a few thousand rows, against the real PostgreSQL
server (the 1M-row figures in benchmarks/results/train_sources.json come from the same
command with --rows 1000000)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
from click.testing import CliRunner, Result
from support.postgres import postgres_server  # noqa: F401

from sidecar.cli import main


def test_bench_streams_every_source_and_drops_its_database(
    postgres_server: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "train_sources.json"
    args = ["bench", "train-sources", "--rows", "2500", "--every", "1000", "--no-load-inputs"]
    res = CliRunner().invoke(
        main,
        [*args, "--json", str(out), "--work-dir", str(tmp_path / "work")],
        env={"SIDECAR_POSTGRES__DSN": postgres_server, "SIDECAR_POSTGRES__FETCH_ROWS": "700"},
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["rows"] == 2500 and doc["fetch_rows"] == 700
    assert set(doc["runs"]) == {"pg_texts", "pg_vectors", "parquet_texts", "parquet_vectors"}
    for name, run in doc["runs"].items():
        assert run["rows"] == 2500, name
        assert run["dims"] == (384 if name.endswith("vectors") else None), name
        assert run["rows_per_s"] > 0 and run["peak_rss_mib"] >= run["rss_before_mib"] > 0
        assert len(run["rss_mib_at_rows"]) >= (2 if name.startswith("pg") else 1), name
    with psycopg.connect(postgres_server) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'sidecar_bench_%'"
        ).fetchone()
    assert left == (0,)


def test_bench_without_a_dsn_says_what_it_needs(
    one_error_line: Callable[[Result], str], tmp_path: Path
) -> None:
    res = CliRunner().invoke(
        main, ["bench", "train-sources", "--json", str(tmp_path / "x.json")], env={}
    )
    assert "needs a PostgreSQL server: set postgres.dsn" in one_error_line(res)
