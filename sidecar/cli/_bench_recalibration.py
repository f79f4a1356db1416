"""``sidecar bench recalibration``: does recalibrating on live ID queries keep the promise?

Per KB of a benchmark with its own training split (CLINC150, StackExchange), a model is
trained as ``sidecar eval`` trains it; half of the KB's evaluation ID queries then
recalibrate its threshold (``sidecar calibrate``) and the other half judges the shipped and
the recalibrated threshold, and the other way round (see
:func:`sidecar.bench.run_recalibration_bench`).
"""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import (
    blas_threads_option,
    cache_dir_option,
    check_output_file,
    encoder_option,
    no_progress_option,
    seed_option,
    target_frr_option,
)
from sidecar.cli._root import bench


@bench.command("recalibration")
@click.option(
    "--benchmark",
    required=True,
    type=click.Choice(["clinc150", "stackexchange"]),
    help="Benchmark with its own training split (covid is cross-fitted: no live half).",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder with clinc150/ and stackexchange_tweac/ (see the README for layouts).",
)
@click.option(
    "--json",
    "json_out",
    required=True,
    type=click.Path(path_type=Path),
    help="Write the report here (e.g. benchmarks/results/recalibration_clinc150_dev.json).",
)
@click.option("--detector", default="combined", show_default=True, help="Detector kind.")
@click.option("--kbs", default=None, help="Comma-separated subset of the benchmark's KBs.")
@encoder_option
@target_frr_option
@seed_option
@cache_dir_option
@blas_threads_option
@no_progress_option
def recalibration_command(
    benchmark: str,
    data_dir: Path,
    json_out: Path,
    detector: str,
    kbs: str | None,
    encoder: str | None,
    target_frr: float,
    seed: int,
    cache_dir: Path | None,
    blas_threads: int,
    no_progress: bool,
) -> None:
    """Refusal rate of the shipped threshold and of one recalibrated on live ID queries.

    For each KB of the dev split: train DETECTOR as `sidecar eval` does, cut the KB's
    evaluation ID queries into two halves (near-duplicates together), recalibrate on one
    half, judge both thresholds on the other half and every OOD evaluation query, and
    swap. Reports false-reject rate, OOD accept rate and balanced accuracy per KB and on
    average.
    """
    from sidecar.bench import RecalibrationBenchConfig, run_recalibration_bench
    from sidecar.errors import ConfigError, DataError
    from sidecar.evaluation import load_benchmark, select_kbs
    from sidecar.scoring import detector_kinds
    from sidecar.settings import load_settings

    check_output_file(json_out, "--json")
    if detector not in detector_kinds():
        raise ConfigError(f"unknown detector {detector!r}; one of {', '.join(detector_kinds())}")
    if data_dir.exists() and not data_dir.is_dir():
        raise DataError(f"--data-dir {data_dir} is not a directory")
    tasks = load_benchmark(benchmark, data_dir, "dev")
    tasks = select_kbs(tasks, kbs, benchmark)
    config = RecalibrationBenchConfig(
        json_out=json_out,
        benchmark=benchmark,
        detector=detector,
        encoder=encoder,
        target_frr=target_frr,
        seed=seed,
        cache_dir=cache_dir,
        blas_threads=blas_threads,
        no_progress=no_progress,
    )
    report = run_recalibration_bench(
        config, tasks, load_settings().scoring, warn=lambda line: click.echo(line, err=True)
    )
    for side in ("shipped", "recalibrated"):
        m = report["mean"][side]
        click.echo(
            f"{side:<13} FRR {m['false_reject_rate']:.2%}  OOD accepted "
            f"{m['ood_accept_rate']:.2%}  balanced accuracy {m['balanced_accuracy']:.4f}"
        )
    click.echo(f"wrote {json_out}")
