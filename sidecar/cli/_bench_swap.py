"""``sidecar bench swap``: promote and roll back a model under a steady query stream.

Starts the embedded broker and a private redis-server, publishes model A, starts N
``sidecar worker`` replicas (child processes, one consumer group), streams queries at a
fixed rate, promotes model B a third of the way in and rolls back two thirds in, then
reads every verdict and reports loss, duplicates, version regressions, swap latency per
replica and the latency tail in steady state and around the swaps.
"""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import check_output_file
from sidecar.cli._root import bench


@bench.command("swap")
@click.option(
    "--json",
    "json_out",
    type=click.Path(path_type=Path),
    required=True,
    help="Write the report here (e.g. benchmarks/results/swap.json).",
)
@click.option(
    "--rate",
    default=20.0,
    show_default=True,
    type=click.FloatRange(1, 2000),
    help="Queries per second.",
)
@click.option(
    "--duration",
    default=30.0,
    show_default=True,
    type=click.FloatRange(6, 3600),
    help="Seconds of streaming; promote at 1/3, roll back at 2/3.",
)
@click.option(
    "--replicas",
    default=2,
    show_default=True,
    type=click.IntRange(1, 8),
    help="Worker processes in the consumer group.",
)
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--swap-window",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds after a promotion or rollback counted as 'during swap'.",
)
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep the workers' logs here [default: a temporary directory].",
)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Independent runs (fresh broker, Redis and workers); latencies are their medians.",
)
def swap_command(
    json_out: Path,
    rate: float,
    duration: float,
    replicas: int,
    partitions: int,
    swap_window: float,
    log_dir: Path | None,
    repeat: int,
) -> None:
    """Measure a live model swap through the real sidecar (embedded broker, real Redis)."""
    from sidecar.bench import SwapBenchConfig, run_swap_bench

    check_output_file(json_out, "--json")
    config = SwapBenchConfig(
        json_out=json_out,
        rate=rate,
        duration=duration,
        replicas=replicas,
        partitions=partitions,
        swap_window=swap_window,
        log_dir=log_dir,
        repeat=repeat,
    )
    report = run_swap_bench(config, echo=click.echo)
    s = report["swap_latency_ms"]
    click.echo(
        f"sent {report['sent']}, verdicts {report['verdicts']}, lost {report['lost']}, "
        f"duplicates {report['duplicates']}, regressions {report['version_regressions']}"
    )
    click.echo(
        f"swap latency max {s['max']} ms; p99 steady {report['p99_latency_ms_steady']} "
        f"ms, during swap {report['p99_latency_ms_during_swap']} ms"
    )
    click.echo(f"all targets met: {all(report['met'].values())}  ->  {json_out}")
