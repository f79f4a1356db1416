"""``sidecar bench detectors``: microseconds per query of every detector (see
:func:`sidecar.bench.run_detectors_bench`)."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import check_output_file, int_list
from sidecar.cli._root import bench


@bench.command("detectors")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the JSON report here.",
)
@click.option(
    "--m",
    default=13,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Selected PCs for the PC detectors.",
)
@click.option(
    "--n-train",
    default=2000,
    show_default=True,
    type=click.IntRange(min=100),
    help="ID and OOD training queries each (also the KB size).",
)
@click.option(
    "--repeats",
    default=7,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed runs per figure.",
)
@click.option(
    "--min-time",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds each timed run lasts at least.",
)
@click.option(
    "--scale-n",
    default="1000,10000,100000",
    show_default=True,
    callback=int_list(100),
    help="Training-point counts for the geometric scaling table ('' to skip).",
)
@click.option(
    "--scale-m",
    default="8,16,32",
    show_default=True,
    callback=int_list(1),
    help="Values of m for the scaling table ('' to skip).",
)
@click.option(
    "--detectors", "only", default="", help="Comma-separated subset of detectors [default: all]."
)
@click.option(
    "--blas-threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="BLAS threads while timing (0: library default). Small matrix products are "
    "fastest single-threaded, and on a shared machine extra threads mostly wait.",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
def detectors_cmd(
    json_path: Path,
    m: int,
    n_train: int,
    repeats: int,
    min_time: float,
    scale_n: list[int],
    scale_m: list[int],
    only: str,
    blas_threads: int,
    seed: int,
) -> None:
    """Microseconds per query of every detector at batch 1 and 256 (encoder excluded).

    Fits each detector on synthetic 384-d unit embeddings, times it on its own input
    (projected queries, or embeddings for the full-space baselines) and end to end
    through OODModel.score, next to naive references (scikit-learn's
    RadiusNeighborsClassifier and a Python loop for the epsilon-ball), and reports how
    the geometric detectors scale with training points and with m. Medians of repeated
    runs; the machine's load average is recorded because it moves every figure.
    """
    from sidecar.bench import DetectorsBenchConfig, run_detectors_bench
    from sidecar.errors import ConfigError
    from sidecar.scoring import detector_kinds

    if only.strip():
        kinds = [k.strip() for k in only.split(",") if k.strip()]
        if not kinds:
            raise ConfigError(f"--detectors {only!r} names no detector")
    else:  # not given: every detector
        kinds = list(detector_kinds())
    unknown = sorted(set(kinds) - set(detector_kinds()))
    if unknown:
        raise ConfigError(f"unknown detectors: {', '.join(unknown)}")
    check_output_file(json_path, "--json")
    config = DetectorsBenchConfig(
        json_out=json_path,
        kinds=tuple(kinds),
        m=m,
        n_train=n_train,
        repeats=repeats,
        min_time=min_time,
        scale_n=tuple(scale_n),
        scale_m=tuple(scale_m),
        blas_threads=blas_threads,
        seed=seed,
    )
    results = run_detectors_bench(config)["detectors"]
    width = max(len(k) for k in results)
    click.echo(f"{'detector':<{width}}  us/q b1   us/q b256  model b256")
    for kind, r in results.items():
        click.echo(
            f"{kind:<{width}}  {r['us_per_query_batch1']:8.2f}  "
            f"{r['us_per_query_batch256']:9.3f}  {r['model_us_per_query_batch256']:9.3f}"
        )
    click.echo(f"wrote {json_path}")
