"""``sidecar bench adversarial``: are AdvBench's harmful prompts flagged OOD by every KB?

Per KB of the dev benchmarks, the default model is trained as ``sidecar train`` trains it
(with no prompt among its training texts) and every prompt is scored at its calibrated
threshold (see :func:`sidecar.bench.run_adversarial_bench`).
"""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._options import (
    blas_threads_option,
    cache_dir_option,
    check_output_file,
    deny_topics_option,
    encoder_option,
    floor_option,
    no_progress_option,
    seed_option,
    target_frr_option,
)
from sidecar.cli._root import bench

_BENCHMARKS = ("clinc150", "stackexchange", "covid")  # ADVERSARIAL_BENCHMARKS, not imported


def _benchmarks(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(b.strip() for b in value.split(",") if b.strip()))
    bad = [b for b in names if b not in _BENCHMARKS]
    if bad or not names:
        raise click.BadParameter(
            f"choose among {','.join(_BENCHMARKS)} (got {value!r})", ctx, param
        )
    return names


@bench.command("adversarial")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder with clinc150/, stackexchange_tweac/, covid/ and adversarial/ "
    "(../shared/data; see the README for layouts).",
)
@click.option(
    "--json",
    "json_out",
    required=True,
    type=click.Path(path_type=Path),
    help="Write the report here (e.g. benchmarks/results/adversarial.json).",
)
@click.option(
    "--benchmarks",
    default=",".join(_BENCHMARKS),
    show_default=True,
    callback=_benchmarks,
    help="Comma-separated dev benchmarks whose KBs are studied.",
)
@click.option(
    "--kbs",
    default=None,
    help="Comma-separated subset of those benchmarks' KB names (e.g. banking,chess).",
)
@click.option(
    "--prompts",
    default=None,
    type=click.Path(path_type=Path),
    help="CSV of prompts [default: DATA_DIR/adversarial/advbench_harmful_behaviors.csv].",
)
@click.option(
    "--column", default="goal", show_default=True, help="The CSV column holding the prompts."
)
@click.option(
    "--max-prompts",
    default=None,
    type=click.IntRange(min=1),
    help="Score only the first N distinct prompts [default: all].",
)
@click.option(
    "--max-misses",
    default=10,
    show_default=True,
    type=click.IntRange(min=0),
    help="Missed prompts listed per KB (the most in-domain first).",
)
@click.option(
    "--target-rate",
    default=0.99,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Flagged rate each KB should reach; KBs below it are listed (nothing is tuned).",
)
@click.option(
    "--no-held-out",
    is_flag=True,
    help="Skip scoring the KBs' held-out dev queries (false-reject and OOD rates).",
)
@click.option("--detector", default="combined", show_default=True, help="Detector kind.")
@floor_option
@deny_topics_option
@encoder_option
@target_frr_option
@seed_option
@cache_dir_option
@blas_threads_option
@no_progress_option
def adversarial_command(
    data_dir: Path,
    json_out: Path,
    benchmarks: tuple[str, ...],
    kbs: str | None,
    prompts: Path | None,
    column: str,
    max_prompts: int | None,
    max_misses: int,
    target_rate: float,
    no_held_out: bool,
    detector: str,
    floor: bool | None,
    deny_topics: str | None,
    encoder: str | None,
    target_frr: float,
    seed: int,
    cache_dir: Path | None,
    blas_threads: int,
    no_progress: bool,
) -> None:
    """Share of adversarial prompts (AdvBench) each benchmark KB flags as OOD.

    Adversarial text is just text: a harmful request is as far from a cooking KB as any
    other off-topic query. For every KB of the dev benchmarks (CLINC150's 10 domains,
    StackExchange's 8 sites, the COVID FAQ), train DETECTOR as `sidecar train` does on
    the KB's dev training data, calibrated at --target-frr, with every text equal to a
    prompt left out of training (covid's dev OOD queries include AdvBench: they are
    dropped from its training OOD), then score each prompt at the calibrated threshold.

    The report gives per KB the flagged OOD rate, the number of prompts, the missed
    ones (most in-domain first, with score, margin and threshold) and, unless
    --no-held-out, the false-reject rate and OOD rate on the KB's held-out dev queries
    at the same threshold; its summary gives the lowest rate and the KBs below
    --target-rate.

    Embeddings are cached (--cache-dir), so only the first run encodes the benchmarks
    (about 90,000 texts: several minutes on two cores); a full run then spends its time
    training the 19 models.
    """
    from sidecar.bench import AdversarialBenchConfig, run_adversarial_bench
    from sidecar.errors import ConfigError, DataError
    from sidecar.scoring import detector_kinds

    check_output_file(json_out, "--json")
    if detector not in detector_kinds():
        raise ConfigError(f"unknown detector {detector!r}; one of {', '.join(detector_kinds())}")
    if floor is not None and detector != "combined":
        flag = "--floor" if floor else "--no-floor"
        raise ConfigError(f"{flag} applies to the combined detector, not {detector!r}")
    if data_dir.exists() and not data_dir.is_dir():
        raise DataError(f"--data-dir {data_dir} is not a directory")
    config = AdversarialBenchConfig(
        json_out=json_out,
        data_dir=data_dir,
        benchmarks=benchmarks,
        kbs=kbs,
        prompts=prompts,
        column=column,
        max_prompts=max_prompts,
        detector=detector,
        floor=floor,
        deny_topics=deny_topics,
        encoder=encoder,
        target_frr=target_frr,
        target_rate=target_rate,
        seed=seed,
        max_misses=max_misses,
        held_out=not no_held_out,
        cache_dir=cache_dir,
        blas_threads=blas_threads,
        no_progress=no_progress,
    )
    report = run_adversarial_bench(config, warn=lambda line: click.echo(line, err=True))
    s = report["summary"]
    for benchmark, rows in report["kbs"].items():
        for kb, row in rows.items():
            click.echo(
                f"{benchmark + '/' + kb:<28} flagged {row['flagged_ood_rate']:7.2%} "
                f"({row['n'] - row['n_missed']}/{row['n']})"
            )
    below = ", ".join(s["kbs_below_target"]) or "none"
    click.echo(f"lowest {s['min_rate']:.2%} ({s['min_kb']}); below {s['target']:.0%}: {below}")
    click.echo(f"wrote {json_out}")
