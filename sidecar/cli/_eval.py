"""``sidecar eval``: every detector and baseline on a benchmark, as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sidecar.cli._options import (
    blas_threads_option,
    cache_dir_option,
    calibration_option,
    center_languages_option,
    check_output_dir,
    check_output_file,
    criterion_option,
    deny_topics_option,
    encoder_option,
    encoder_overrides,
    encoder_url_option,
    features_option,
    floor_option,
    neighbour_bank_option,
    no_progress_option,
    seed_option,
    target_frr_option,
    threshold_rule_option,
)
from sidecar.cli._root import main


@main.command("eval")
@click.option(
    "--benchmark",
    required=True,
    type=click.Choice(["clinc150", "stackexchange", "covid", "xsid", "sib200"]),
    help="Benchmark; each of its KBs is evaluated (see the README for layouts). xsid and "
    "sib200 are multilingual: see --language.",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder with clinc150/, stackexchange_tweac/, covid/, adversarial/, xsid/, sib200/.",
)
@click.option(
    "--language",
    default=None,
    help="xsid / sib200: the queries' language, a comma-separated list or 'all' (one "
    "evaluation each, one report) [default: en].",
)
@click.option(
    "--kb-language",
    default=None,
    help="xsid / sib200: write the KB and the training queries in this language and judge "
    "queries in --language; each language is also evaluated with its own KB, for the "
    "cross-lingual gap [default: the query language].",
)
@click.option(
    "--split",
    default="dev",
    show_default=True,
    type=click.Choice(["dev", "test"]),
    help="Evaluation split; training data is the same for both.",
)
@click.option(
    "--json",
    "json_out",
    required=True,
    type=click.Path(path_type=Path),
    help="Where to write the report JSON.",
)
@click.option(
    "--detectors",
    default="all",
    show_default=True,
    help="Comma-separated detector kinds, or 'all'.",
)
@click.option("--kbs", default=None, help="Comma-separated subset of the benchmark's KBs.")
@encoder_option
@encoder_url_option
@criterion_option("PC selection for the searched detectors.")
@target_frr_option
@threshold_rule_option
@calibration_option
@seed_option
@cache_dir_option
@blas_threads_option
@click.option(
    "--max-train-per-kb",
    default=None,
    type=int,
    help="stackexchange: seeded subset of each site's train titles [default: all].",
)
@click.option(
    "--max-eval-per-kb",
    default=None,
    type=int,
    help="stackexchange: seeded subset of each site's evaluation titles [default: all].",
)
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(path_type=Path, file_okay=False),
    help="Also write a Markdown report with plots here (see `sidecar eval-report`).",
)
@click.option(
    "--fold-grouping",
    default="grouped",
    show_default=True,
    type=click.Choice(["grouped", "random"]),
    help="grouped keeps near-duplicate training queries (cosine >= 0.9) in one part of the "
    "training split and, on cross-fitted benchmarks (covid), a question, its paraphrases "
    "and near-duplicates in one fold; random splits query by query, as the reference paper "
    "does (a paraphrase of a judged query may be trained on).",
)
@click.option(
    "--seeds",
    "n_seeds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 50),
    help="Also evaluate seeds --seed+1 ... --seed+N-1 (new splits and folds, no protocol "
    "refits) and report the median, min and max of every mean figure under "
    "'seed_spread'; the covid target is then judged on the median.",
)
@click.option(
    "--protocol/--no-protocol",
    default=True,
    show_default=True,
    help="Refit the paper's six detectors and the combined one at m=13 under both PC "
    "criteria for the p-value-vs-EVR table ('pvalue_vs_evr'); --no-protocol skips those "
    "refits (an empty table, no protocol targets) when only --detectors matter.",
)
@click.option(
    "--ood-protocol",
    default="standard",
    show_default=True,
    type=click.Choice(["standard", "unseen-ood"]),
    help="standard: OOD training and evaluation queries of the same families; unseen-ood: "
    "one OOD family at a time held out of training and judged alone (per family: AUROC, "
    "FPR at 95% TPR, false-reject and OOD-accept rates at the calibrated threshold).",
)
@features_option
@neighbour_bank_option
@floor_option
@deny_topics_option
@center_languages_option
@no_progress_option
def eval_command(
    benchmark: str,
    data_dir: Path,
    split: str,
    language: str | None,
    kb_language: str | None,
    json_out: Path,
    detectors: str,
    kbs: str | None,
    encoder: str | None,
    encoder_url: str | None,
    criterion: str,
    target_frr: float,
    threshold_rule: str,
    calibration: str | None,
    seed: int,
    cache_dir: Path | None,
    blas_threads: int,
    max_train_per_kb: int | None,
    max_eval_per_kb: int | None,
    report_dir: Path | None,
    fold_grouping: str,
    n_seeds: int,
    protocol: bool,
    features: str | None,
    neighbour_bank: int | None,
    floor: bool,
    deny_topics: str | None,
    ood_protocol: str,
    center_languages: bool,
    no_progress: bool,
) -> None:
    """Evaluate every detector and baseline on a benchmark and write a JSON report.

    Per KB and averaged: AUROC, FPR at 95% TPR, balanced accuracy at the calibrated
    threshold, accuracy on a balanced ID/OOD sample (the paper's protocol), dimensions
    and microseconds per query (encoder excluded). Hyperparameters are searched on a
    validation split of the training data, never on the evaluation queries.
    """
    from sidecar.evaluation import EvalConfig, run_evaluation
    from sidecar.settings import load_settings

    check_output_file(json_out, "--json")
    if report_dir is not None and benchmark in ("xsid", "sib200"):
        raise click.UsageError("--report draws the monolingual benchmarks' reports")
    if report_dir is not None:
        check_output_dir(report_dir, "--report")
        if ood_protocol != "standard":
            raise click.UsageError("--report draws the standard OOD protocol's report only")
    settings = load_settings(**encoder_overrides(None, encoder_url))
    cfg = EvalConfig(
        benchmark=benchmark,
        data_dir=data_dir,
        split=split,
        detectors=None
        if detectors == "all"
        else tuple(d.strip() for d in detectors.split(",") if d.strip()),
        kbs=kbs,
        encoder=encoder,
        criterion=criterion,
        target_frr=target_frr,
        threshold_rule=threshold_rule,
        calibration=calibration,
        seed=seed,
        cache_dir=cache_dir,
        blas_threads=blas_threads,
        max_train_per_kb=max_train_per_kb,
        max_eval_per_kb=max_eval_per_kb,
        fold_grouping=fold_grouping,
        n_seeds=n_seeds,
        protocol=protocol,
        features=features,
        neighbour_bank=neighbour_bank,
        floor=floor,
        deny_topics=deny_topics,
        language=language,
        kb_language=kb_language,
        ood_protocol=ood_protocol,
        center_languages=center_languages,
    )
    report = run_evaluation(settings, cfg, progress=not no_progress)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(f"wrote {json_out}")
    if "languages" in report:
        _echo_languages(report)
        return
    if report_dir is not None:
        from sidecar.evaluation import write_eval_report

        click.echo(f"report: {write_eval_report(report, report_dir)}")
    for group, g in report.get("groups", {}).items():
        click.echo(f"  held out: {group} ({g['holdouts']} holdouts)")
        for d, row in g["mean"].items():
            click.echo(
                f"    {d:14s} AUROC {row['auroc']:.4f}  FPR95 {row['fpr_at_95tpr']:.4f}  "
                f"FRR {row['false_reject_rate']:.4f}  OOD accepted {row['ood_accept_rate']:.4f}"
            )
    if "groups" in report:
        click.echo("  mean over the held-out OOD families:")
    for d, row in report.get("mean", {}).items():
        click.echo(
            f"  {d:14s} AUROC {row['auroc']:.4f}  FPR95 {row['fpr_at_95tpr']:.4f}  "
            f"bal.acc {row['balanced_accuracy']:.4f}  dims {row['dims']:.0f}  "
            f"{row['us_per_query']:.1f} us/q"
        )
    for t in report["targets"]:
        click.echo(f"  target {'MET ' if t['met'] else 'MISS'} {t['target']}: {t['measured']}")


def _echo_languages(report: dict[str, Any]) -> None:
    """One line per language and detector, then the targets."""
    for lang, entry in report["languages"].items():
        for d, row in entry["summary"].items():
            cross = (report.get("crosslingual") or {}).get(lang)
            gap = f"  cross-lingual AUROC {cross['summary'][d]['auroc']:.4f}" if cross else ""
            click.echo(
                f"  {lang:6s} {d:12s} AUROC {row['auroc']:.4f}  FPR95 {row['fpr_at_95tpr']:.4f}"
                f"  bal.acc {row['balanced_accuracy']:.4f}  FRR {row['false_reject_rate']:.4f}"
                f"  OOD-accept {row['ood_accept_rate']:.4f}{gap}"
            )
    for t in report["targets"]:
        click.echo(f"  target {'MET ' if t['met'] else 'MISS'} {t['target']}: {t['measured']}")


@main.command("eval-report")
@click.argument("json_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(path_type=Path, file_okay=False),
    help="Report directory [default: beside the JSON, <name>_report/].",
)
def eval_report_command(json_file: Path, out_dir: Path | None) -> None:
    """Draw the Markdown report with plots of a `sidecar eval` JSON.

    Plots: AUROC of every detector on every KB (which wins where), mean AUROC and
    balanced accuracy per detector, p-value against EVR PC selection, and microseconds
    per query against mean AUROC; tables: the targets, the means and the p-value-vs-EVR
    differences. Reads the JSON only: nothing is re-run.
    """
    from sidecar.evaluation import read_eval_json, write_eval_report

    report = read_eval_json(json_file)
    out = out_dir or json_file.with_name(f"{json_file.stem}_report")
    click.echo(f"report: {write_eval_report(report, out)}")
