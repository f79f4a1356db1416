"""``sidecar bench faults``: the real worker through crashes and outages, and what was lost.

Each scenario runs on its own embedded broker and private redis-server with real
``sidecar worker`` replicas and a steady query stream from a separate producer process;
every query the broker acknowledged is matched with its verdicts and dead letters.
"""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import check_output_file
from sidecar.cli._root import bench

# The names of sidecar.bench.FAULT_SCENARIOS, here so that `--help` loads no benchmark
# code (a unit test keeps the two lists equal).
SCENARIO_NAMES = (
    "replica_kill",
    "lone_kill",
    "broker_outage",
    "broker_unreachable",
    "broker_unreachable_past_timeout",
    "redis_outage",
    "redis_outage_promotion",
    "bad_artifact",
    "poison_query",
    "verdicts_stalled",
    "no_model",
)


@bench.command("faults")
@click.option(
    "--json",
    "json_out",
    type=click.Path(path_type=Path),
    required=True,
    help="Write the report here (e.g. benchmarks/results/faults.json).",
)
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice(SCENARIO_NAMES),
    help="Run this scenario (repeat for several)  [default: all, in the order listed].",
)
@click.option(
    "--rate",
    default=25.0,
    show_default=True,
    type=click.FloatRange(1, 500),
    help="Queries per second from the producer process.",
)
@click.option(
    "--outage-s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(1, 300),
    help="How long a broker, Redis or verdict outage lasts.",
)
@click.option(
    "--warmup-s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0, 60),
    help="Steady load before each fault.",
)
@click.option(
    "--after-s",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0, 120),
    help="Steady load after each fault, before the producer stops.",
)
@click.option(
    "--produce-timeout-s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(1, 120),
    help="kafka.produce_timeout_s in the scenarios meant to outlast it (verdicts_stalled, "
    "broker_unreachable_past_timeout); the others run the product default (30 s).",
)
@click.option(
    "--restart-delay-s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, 60),
    help="How long the bench's supervisor waits before restarting a worker that exited.",
)
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Keep the workers' and the producer's logs here [default: a temporary directory].",
)
def faults_command(
    json_out: Path,
    scenarios: tuple[str, ...],
    rate: float,
    outage_s: float,
    warmup_s: float,
    after_s: float,
    produce_timeout_s: float,
    restart_delay_s: float,
    log_dir: Path | None,
) -> None:
    """Inject faults into the real worker under load and count what was lost.

    Each scenario gets a fresh embedded broker and redis-server (started by the bench,
    stopped by pid), one worker (two for replica_kill) and a steady stream of queries
    from a separate producer process. Every query the broker acknowledged must come back
    as a verdict or a dead letter: the report gives per scenario sent, verdicts,
    dead_lettered, lost (neither; the target is 0), duplicates (queries scored twice)
    and their share, recovery_s (end of the fault to the first answer to a query sent
    after it), what /readyz and /metrics said before, during and after the fault, and
    the scenario's own checks. A bench supervisor restarts a worker that exits, as an
    orchestrator would.

    \b
    replica_kill        SIGKILL of one of two replicas mid-batch; the other takes over
    lone_kill           SIGKILL of a lone worker mid-batch, then restarted
    broker_outage       the embedded broker SIGKILLed for --outage-s, started again
                        (empty: what it held is counted apart, lost_with_broker)
    broker_unreachable  every client cut off the broker for --outage-s (the broker
                        keeps its data, as a Kafka cluster does)
    broker_unreachable_past_timeout
                        the same, outlasting --produce-timeout-s: halt and restart
    redis_outage        redis-server stopped for --outage-s, started again
    redis_outage_promotion
                        the worker cut off Redis while a new model is promoted
    bad_artifact        corrupt chunk, unsigned, unknown schema, other encoder promoted
    poison_query        the encoder raises on one query inside a batch
    verdicts_stalled    the worker's verdicts held for --outage-s (produce timeouts)
    no_model            queries before any model is promoted (fail-closed)

    All of them take about six minutes on two CPUs. Exits 1 when a check failed
    (lost > 0 among them), after writing the report.
    """
    from sidecar.bench import FaultsBenchConfig, run_faults_bench

    check_output_file(json_out, "--json")
    config = FaultsBenchConfig(
        json_out=json_out,
        scenarios=tuple(dict.fromkeys(scenarios)),
        rate=rate,
        outage_s=outage_s,
        warmup_s=warmup_s,
        after_s=after_s,
        produce_timeout_s=produce_timeout_s,
        restart_delay_s=restart_delay_s,
        log_dir=log_dir,
    )
    report = run_faults_bench(config, echo=click.echo)
    s = report["summary"]
    click.echo(
        f"lost {s['lost_total']} (and {s['lost_with_broker_total']} with the embedded "
        f"broker, {s['lost_to_log_reset_total']} to its empty log), duplicates "
        f"{s['duplicates_total']}, {s['wall_s']} s  ->  {json_out}"
    )
    if s["failed_checks"]:
        for name, checks in s["failed_checks"].items():
            click.echo(f"FAILED {name}: {', '.join(checks)}", err=True)
        raise SystemExit(1)
