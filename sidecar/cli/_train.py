"""``sidecar train``: fit, search, calibrate, report and (optionally) publish a model."""

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
    parse_features,
    seed_option,
    target_frr_option,
    threshold_rule_option,
)
from sidecar.cli._root import main

_PATH = click.Path(path_type=Path)


class _FitBar:
    """The search's model fits on a tqdm bar, whose total grows as fits are planned."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def planned(self, n: int) -> None:
        self._bar.total += n
        self._bar.refresh()

    def fitted(self) -> None:
        self._bar.update(1)


@main.command("train")
@click.option(
    "--kb",
    "kb_path",
    type=_PATH,
    help='KB documents: JSONL {"id", "text"}, or Parquet (a .parquet file or a directory '
    "of them) with columns id, text and optionally embedding [default, when no inputs are "
    "given: the built-in demo KB and its queries].",
)
@click.option(
    "--kb-embeddings",
    type=_PATH,
    help="KB as precomputed embeddings (.npy, n x dim) instead of --kb.",
)
@click.option(
    "--kb-sql",
    metavar="TABLE|QUERY",
    help="KB from PostgreSQL (postgres.dsn): a table (schema.table) or a read-only query "
    "yielding id, text and optionally embedding (pgvector, real[] or double precision[]); "
    "stored embeddings are used as they are, after a sample of rows is re-embedded to "
    "prove their encoder.",
)
@click.option(
    "--id-queries",
    type=_PATH,
    help='ID training queries, JSONL {"text"} or Parquet (text, optional embedding); an '
    'optional "group" names paraphrases.',
)
@click.option("--id-embeddings", type=_PATH, help="ID training queries as a .npy array.")
@click.option(
    "--id-queries-sql",
    metavar="TABLE|QUERY",
    help="ID training queries from PostgreSQL, as --kb-sql: text, optional group and embedding.",
)
@click.option(
    "--ood-queries",
    type=_PATH,
    help='OOD training queries, JSONL {"text"} or Parquet (optional for KB-only '
    'detectors; "group" as for --id-queries).',
)
@click.option("--ood-embeddings", type=_PATH, help="OOD training queries as a .npy array.")
@click.option(
    "--ood-queries-sql",
    metavar="TABLE|QUERY",
    help="OOD training queries from PostgreSQL, as --id-queries-sql.",
)
@click.option("--kb-name", default=None, help="KB id in the model store [default: settings].")
@encoder_option
@encoder_url_option
@click.option(
    "--detector",
    default="combined",
    show_default=True,
    help="Detector kind (combined, epsilon_ball, epsilon_cube, epsilon_rect, logreg, "
    "svm, gmm, residual, max_cosine, mahalanobis, knn).",
)
@criterion_option("How the m PCs are chosen.")
@click.option(
    "--m",
    type=click.IntRange(min=1),
    default=None,
    help="Fixed number of PCs; the detector sees at most 32 inputs in all, the PCs and any "
    "extra features (combined with its default features: m <= 29) [default: searched].",
)
@click.option("--m-range", default=None, help="Search m in LOW:HIGH, e.g. 8:32.")
@features_option
@neighbour_bank_option
@floor_option
@deny_topics_option
@target_frr_option
@click.option(
    "--group-near-duplicates/--no-group-near-duplicates",
    default=True,
    show_default=True,
    help="Join training queries at cosine >= 0.9 into groups. Each group (these, and each "
    "JSONL 'group' either way) stays whole in one part of the fit / validation / "
    "calibration split and in one calibration fold, so the threshold is calibrated on "
    "queries as new to the model as live traffic.",
)
@threshold_rule_option
@calibration_option
@click.option(
    "--per-language",
    is_flag=True,
    help="Also give each language of the ID training queries a threshold of its own, "
    "calibrated conformally on that language's held-out (or out-of-fold) scores, where it "
    "has enough of them (1/rate - 1: 99 for 0.01, 19 for 0.05); each query's language is "
    'the one its JSONL line gives ("language", a tag such as nl or pt-BR), else told by '
    "the language detector (scoring.languages), and other languages keep the global "
    "threshold. Needs the ID queries as texts and the frr threshold rule.",
)
@center_languages_option
@seed_option
@click.option("--out", required=True, type=_PATH, help="Artifact directory to write.")
@click.option("--report", "report_dir", type=_PATH, help="Report directory [default: OUT/report].")
@click.option("--no-report", is_flag=True, help="Skip the report (plots).")
@click.option("--publish", is_flag=True, help="Put the artifact into the model store.")
@click.option("--no-promote", is_flag=True, help="With --publish: store without activating.")
@click.option(
    "--store-backend",
    type=click.Choice(["redis", "directory"]),
    default=None,
    help="Model store backend [default: settings].",
)
@click.option(
    "--store-dir",
    type=_PATH,
    default=None,
    help="Publish to the directory store at this path (as --store-dir means for every "
    "command; implies --store-backend directory).",
)
@cache_dir_option
@click.option("--stats-json", type=_PATH, default=None, help="Also write timing/memory JSON here.")
@click.option(
    "--pca-method",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "full", "randomized", "incremental"]),
    help="KB PCA solver; auto = exact up to 20k docs, randomized beyond.",
)
@blas_threads_option
@no_progress_option
def train_command(**opts: Any) -> None:
    """Train an OOD detector for one KB and write a versioned artifact plus a report.

    Embeds the KB and the labelled queries (cached on disk), runs a PCA of the KB, searches
    m and the detector's hyperparameters on a validation split carved from the training
    queries (fixed seed), calibrates the threshold to --target-frr on held-out ID queries
    (conformal quantile) and writes OUT (manifest.json + arrays.npz, no pickle). With no
    KB options it trains on the built-in demo KB, so `sidecar train --out DIR` just works.

    The KB and the query sets may also come from PostgreSQL (--kb-sql, ...; the DSN is the
    secret postgres.dsn) or from Parquet; rows that carry their embeddings are not
    embedded again, once a sample of them shows they come from the model's encoder.
    """
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from sidecar.scoring import quiet_calibration
    from sidecar.training import (
        InputSources,
        ReleaseConfig,
        check_config,
        load_inputs,
        release_model,
    )

    _check_options(opts)
    settings = _load_settings(opts)
    if opts["publish"]:  # before the inputs are embedded, not after the training
        from sidecar.cli._options import check_publish_target

        check_publish_target(settings, opts["kb_name"] or settings.scoring.default_kb)
    progress = not opts["no_progress"]
    cfg = _train_config(opts)
    check_config(cfg)  # before the inputs are embedded
    # Inputs first (with their own encoding bar): a bad path fails before any other output.
    inputs, embed_s = load_inputs(InputSources.from_options(opts), settings, progress=progress)
    where = ReleaseConfig(
        out=opts["out"],
        report_dir=opts["report_dir"],
        report=not opts["no_report"],
        blas_threads=opts["blas_threads"],
    )
    with (
        logging_redirect_tqdm(),  # a warning gets its own line, not one inside the bar
        quiet_calibration(),  # the summary's threshold line reports on the shipped one
        tqdm(total=0, desc="train", unit="fit", disable=not progress) as bar,
    ):

        def stage(name: str) -> None:
            if name == "artifact":
                bar.total = bar.n  # planned fits that a dropped finalist never ran
            bar.set_description(f"train: {name}")

        release = release_model(inputs, cfg, where, embed_s=embed_s, tick=stage, fits=_FitBar(bar))
    _print_summary(release, cfg, opts["criterion"], has_ood=inputs.ood_queries is not None)
    if opts["stats_json"]:
        Path(opts["stats_json"]).write_text(
            json.dumps({**release.stats, "validation": release.result.validation}, indent=2) + "\n"
        )
    if opts["publish"]:
        _publish(release.artifact, settings, promote=not opts["no_promote"])


def _check_options(opts: dict[str, Any]) -> None:
    """Refuse options that contradict each other, and outputs that cannot be written.

    Options that would be silently ignored are refused: the run would not do what was
    asked, and might only show it minutes later. Where the results go is checked first:
    training can take minutes, and finding out only at save time that OUT is a file
    throws all of that away.
    """
    from sidecar.errors import ConfigError

    for given, needs, option in (
        (opts["no_promote"], opts["publish"], "--no-promote applies to --publish"),
        (opts["store_dir"], opts["publish"], "--store-dir applies to --publish"),
        (opts["store_backend"], opts["publish"], "--store-backend applies to --publish"),
        (opts["report_dir"], not opts["no_report"], "--report and --no-report contradict"),
    ):
        if given and not needs:
            raise click.UsageError(option)
    if opts["m"] is not None and opts["m_range"]:
        raise click.UsageError("give --m (a fixed m) or --m-range (searched), not both")
    check_output_dir(opts["out"], "--out")
    out_dir: Path = opts["out"]
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "manifest.json").exists():
        raise ConfigError(
            f"--out {out_dir} holds other files; give a new or empty directory (or a "
            "previous artifact's, to replace it)"
        )
    if not opts["no_report"]:
        check_output_dir(opts["report_dir"] or opts["out"] / "report", "--report")
    if opts["stats_json"]:
        check_output_file(opts["stats_json"], "--stats-json")
    if opts["kb_name"] is not None:
        from model_store import check_kb

        check_kb(opts["kb_name"])


def _load_settings(opts: dict[str, Any]) -> Any:
    """The settings, with --encoder, --encoder-url and the store options over them."""
    from sidecar.errors import ConfigError
    from sidecar.settings import load_settings

    overrides = encoder_overrides(opts["encoder"], opts["encoder_url"])
    store: dict[str, Any] = {}
    if opts["store_backend"]:
        store["backend"] = opts["store_backend"]
    if opts["store_dir"]:
        if opts["store_backend"] == "redis":
            raise ConfigError(
                "--store-dir names a directory store: leave out --store-backend redis"
            )
        store.update(backend="directory", directory=opts["store_dir"])
    if store:
        overrides["store"] = store
    return load_settings(**overrides)


def _train_config(opts: dict[str, Any]) -> Any:
    """The job's :class:`~sidecar.training.TrainConfig` from the command's options."""
    from sidecar.training import TrainConfig, parse_m_range

    return TrainConfig(
        detector=opts["detector"],
        criterion=opts["criterion"],
        m=opts["m"],
        m_range=parse_m_range(opts["m_range"]) if opts["m_range"] else None,
        features=parse_features(opts["features"]),
        target_frr=opts["target_frr"],
        seed=opts["seed"],
        pca_method=opts["pca_method"],
        threshold_rule=opts["threshold_rule"],
        calibration=opts["calibration"],
        group_near_duplicates=opts["group_near_duplicates"],
        neighbour_bank=opts["neighbour_bank"],
        floor=opts["floor"],
        per_language=opts["per_language"],
        center_languages=opts["center_languages"],
    )


def _print_summary(release: Any, cfg: Any, criterion: str, *, has_ood: bool) -> None:
    """The model, its validation figures, the training queries, the threshold and the
    run's cost, then where the artifact and the report went."""
    m, stats = release.result.model, release.stats
    click.echo(
        f"model {release.artifact.version} for KB {m.kb!r}: {m.detector_name}, criterion "
        f"{m.criterion}, m={m.m}, dims={m.dims}, threshold={m.threshold:.6g}"
    )
    if criterion != m.criterion and criterion != "auto":
        # p-value selection needs OOD queries (or enough ID ones) for its t-test
        click.echo(
            f"  note: --criterion {criterion} was asked for; the PCs were chosen by "
            f"{m.criterion}" + ("" if has_ood else " (no OOD training queries)")
        )
    for k, v in release.result.validation.items():
        if isinstance(v, float):
            click.echo(f"  {k}: {v:.4f}")

    def used(kind: str) -> str:
        n, k = stats[f"n_{kind}_queries"], stats[f"n_{kind}_used"]
        return "" if k == n else f" ({k} used: the split parts are capped)"

    click.echo(
        f"  training queries: {stats['n_id_queries']} ID in {stats['n_id_groups']} groups"
        f"{used('id')}, {stats['n_ood_queries']} OOD in {stats['n_ood_groups']} groups"
        f"{used('ood')}"
        + ("" if stats["near_duplicates_grouped"] else " (near-duplicates not grouped)")
    )
    click.echo(f"  threshold: {threshold_summary(m.metrics, cfg.target_frr)}")
    if "id_languages_given" in stats:
        click.echo(
            f"  ID query languages: {stats['id_languages_given']} given in their rows, "
            f"{stats['id_languages_detected']} detected"
        )
    for line in language_lines(m.metrics):
        click.echo(f"  {line}")
    if "centering" in stats:
        c = stats["centering"]
        told = ", ".join(f"{k} {v}" for k, v in c["texts_per_language"].items()) or "none told"
        click.echo(
            f"  centred by language: {c['n_texts']} training texts ({told}); own means for "
            f"{', '.join(c['languages_with_mean']) or 'none'} (>= {c['min_texts']} texts), "
            "the global mean for every other language"
        )
    drift = m.metrics.get("expected_frr")
    if drift:
        click.echo(
            f"  expected false-reject rate on ID query groups the calibration lacked: "
            f"{drift['mean'] * 100:.2f}% on average, {drift['max'] * 100:.2f}% at worst "
            f"({drift['folds']} group-wise folds), against the {cfg.target_frr * 100:g}% "
            "target; recalibrate on live ID traffic (sidecar calibrate) when it differs"
        )
    click.echo(
        f"  train {stats['train_total_s']:.2f}s, embed {stats['embed_s']:.2f}s, "
        f"peak RSS {stats['peak_rss_mb']:.0f} MiB"
    )
    click.echo(f"artifact: {release.out}")
    if release.report is not None:
        click.echo(f"report: {release.report}")


def language_lines(metrics: dict[str, Any]) -> list[str]:
    """One line per language of a per-language calibration (``metrics``'s
    ``language_calibration``): its query count and its own threshold, or the global one it
    keeps (too few queries); and the queries whose language was not told."""
    table = metrics.get("language_calibration")
    if table is None:
        return []
    told = sum(int(row["n"]) for row in table.values())
    out = [f"per-language thresholds, {len(table)} languages among the calibration queries:"]
    for lang, row in table.items():
        if row["threshold"] is None:
            out.append(f"  {lang}: {row['n']} queries, too few: the global threshold")
        else:
            out.append(
                f"  {lang}: {row['n']} queries, threshold {row['threshold']:.6g} "
                f"(refuses {row['calibration_frr']:.2%} of them)"
            )
    untold = int(metrics.get("n_calibration") or told) - told
    if untold:
        out.append(f"  {untold} queries of no language told: the global threshold")
    return out


def threshold_summary(metrics: dict[str, Any], target_frr: float) -> str:
    """How the shipped threshold was calibrated, in one line, and whether the conformal
    guarantee holds (too few held-out ID queries for the target void it)."""
    from sidecar.scoring import min_calibration_size

    n = metrics.get("n_calibration")
    if metrics.get("threshold_rule") == "balanced":
        return (
            f"best balanced accuracy on {n} held-out ID and {metrics.get('n_ood_calibration')} "
            "held-out OOD training queries (no false-reject guarantee)"
        )
    if metrics.get("calibration") == "cross":
        how = f"{metrics.get('calibration_folds')}-fold out-of-fold scores of {n} ID queries"
    else:
        how = f"{n} held-out ID queries"
    line = f"conformal quantile for a {target_frr * 100:g}% false-reject rate, on {how}"
    need = min_calibration_size(target_frr)
    if isinstance(n, int) and n < need:
        line += (
            f"; too few for that rate (at least {need} needed), so the highest ID score is "
            "used and the rate is not guaranteed: add ID training queries or raise --target-frr"
        )
    return line


def _publish(artifact: Any, settings: Any, *, promote: bool) -> None:
    from sidecar.cli._store_access import promoted_suffix
    from sidecar.persistence import publish_model

    version, event = publish_model(settings, artifact, promote=promote)
    where = f" ({settings.store.directory})" if settings.store.backend == "directory" else ""
    click.echo(
        f"published {artifact.kb}/{version} to the {settings.store.backend} store"
        f"{where}{promoted_suffix(event, promote)}"
    )
