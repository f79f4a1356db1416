"""``sidecar bench train-sources``: read time and memory of the KB readers on large tables
and Parquet files (see :func:`sidecar.bench.run_train_sources_bench`)."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import check_output_file
from sidecar.cli._root import bench

_PATH = click.Path(path_type=Path)


@bench.command("train-sources")
@click.option(
    "--rows",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=100),
    help="Rows of each synthetic table and Parquet file.",
)
@click.option(
    "--every",
    default=100_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Sample the reader's resident memory each time this many more rows came in.",
)
@click.option(
    "--no-load-inputs",
    is_flag=True,
    help="Skip the training job's input loading (it holds the whole KB matrix).",
)
@click.option("--json", "json_out", required=True, type=_PATH, help="Report JSON.")
@click.option(
    "--work-dir", type=_PATH, default=None, help="Where the Parquet files go [default: temp]."
)
def train_sources_command(
    rows: int, every: int, no_load_inputs: bool, json_out: Path, work_dir: Path | None
) -> None:
    """Stream synthetic KBs from PostgreSQL and Parquet: time, rows/s and peak RSS.

    Creates a scratch database on the server postgres.dsn names (its user needs CREATEDB;
    the database is dropped afterwards), fills a table of synthetic texts and one of texts
    with 384-dim real[] embeddings (--rows each), writes the same rows to Parquet, and
    reads each through `sidecar train`'s readers in a process of its own. Then it times
    the training job's input loading from the embeddings table: a sample re-embedded as
    proof, nothing else encoded, the whole KB matrix in memory.
    """
    from sidecar.bench import TrainSourcesBenchConfig, run_train_sources_bench
    from sidecar.settings import load_settings

    check_output_file(json_out, "--json")
    config = TrainSourcesBenchConfig(
        json_out=json_out,
        rows=rows,
        every=every,
        work_dir=work_dir,
        load_inputs=not no_load_inputs,
    )
    run_train_sources_bench(config, load_settings(), echo=click.echo)
    click.echo(f"wrote {json_out}")
