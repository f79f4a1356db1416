"""``sidecar bench train-scale``: wall time and peak memory of ``sidecar train`` on
synthetic KBs of growing size (see :func:`sidecar.bench.run_train_scale_bench`)."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import check_output_file, int_list
from sidecar.cli._root import bench

_PATH = click.Path(path_type=Path)
_KB_SIZES = int_list(100)


def _kb_sizes(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``--sizes``: at least one KB size of at least 100 (an empty list would report
    nothing)."""
    sizes = _KB_SIZES(ctx, param, value)
    if not sizes:
        raise click.BadParameter("give at least one KB size", ctx, param)
    return sizes


@bench.command("train-scale")
@click.option(
    "--sizes",
    default="10000,100000",
    show_default=True,
    callback=_kb_sizes,
    help="Comma-separated KB sizes (synthetic embeddings).",
)
@click.option("--dim", default=384, show_default=True, type=click.IntRange(min=64))
@click.option(
    "--queries",
    default=3000,
    show_default=True,
    type=click.IntRange(min=200),
    help="ID and OOD training queries each.",
)
@click.option(
    "--pca-method",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "full", "randomized", "incremental"]),
)
@click.option(
    "--features",
    default="pcs,residual",
    show_default=True,
    help="The combined detector's blocks, at m = 13, or 'default' for what `sidecar train` "
    "searches without --features and --m (every default candidate, the max-cosine and "
    "labelled-neighbour blocks included: their cost grows with the KB and the queries).",
)
@click.option("--json", "json_out", required=True, type=_PATH, help="Report JSON.")
@click.option("--work-dir", type=_PATH, default=None, help="Scratch folder [default: temp].")
def train_scale_command(
    sizes: list[int],
    dim: int,
    queries: int,
    pca_method: str,
    features: str,
    json_out: Path,
    work_dir: Path | None,
) -> None:
    """Time `sidecar train` on synthetic KBs given as embeddings (wall time, peak RSS).

    Each size runs in its own process (so peak RSS is that run's), trains the combined
    detector (over [PCs + residuals] unless --features says otherwise) with --no-report,
    and then times scoring of the resulting artifact at batch 256 (projection +
    detector, encoder excluded). The scratch files (embeddings and models, hundreds of
    MB at the default sizes) are deleted afterwards unless --work-dir names where to
    keep them.
    """
    from sidecar.bench import TrainScaleBenchConfig, run_train_scale_bench
    from sidecar.cli._options import parse_features

    check_output_file(json_out, "--json")
    config = TrainScaleBenchConfig(
        json_out=json_out,
        sizes=tuple(sizes),
        dim=dim,
        queries=queries,
        pca_method=pca_method,
        features=None if features == "default" else parse_features(features),
        work_dir=work_dir,
    )
    run_train_scale_bench(config, echo=click.echo)
    click.echo(f"wrote {json_out}")
