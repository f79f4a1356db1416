"""``sidecar calibrate``: recalibrate a trained model's threshold on live ID queries.

For operators whose traffic has drifted from the training queries: the refusal rate the
shipped threshold promised no longer holds (``sidecar score`` on a sample of answerable
live queries shows more refused than the target). A sample of such queries, never trained
on, gives a new threshold (the conformal quantile of their scores) without retraining; the
result is a new artifact version, written to a directory or published to the store, which
running sidecars swap to like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sidecar.cli._model_inputs import (
    check_artifact_kb,
    model_options,
    query_embeddings,
    read_model,
)
from sidecar.cli._options import (
    cache_dir_option,
    check_output_dir,
    encoder_option,
    no_progress_option,
)
from sidecar.cli._root import main
from sidecar.cli._servable import (
    _any_encoder_option,
    _load_for_import,
    load_local_dir,
    servable_model,
)
from sidecar.cli._store_access import _settings, _store_options, promoted_suffix


@main.command("calibrate")
@model_options("Recalibrate")
@click.option(
    "--id-queries",
    type=click.Path(path_type=Path),
    default=None,
    help='In-domain queries from the traffic to serve, JSONL {"text"} (and "language" for '
    "--per-language); never trained on.",
)
@click.option(
    "--id-embeddings",
    type=click.Path(path_type=Path),
    default=None,
    help="The same as a .npy array (n x the model's encoder dimension).",
)
@click.option(
    "--live-queries",
    type=click.Path(path_type=Path),
    default=None,
    help='A sample of live traffic as it comes (ID and OOD, unlabelled), JSONL {"text"}: '
    "the share the new threshold refuses is recorded, and the worker alerts when its live "
    "OOD share moves far from it.",
)
@click.option(
    "--live-embeddings",
    type=click.Path(path_type=Path),
    default=None,
    help="The same as a .npy array (n x the model's encoder dimension).",
)
@click.option(
    "--target-frr",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="False-reject rate to calibrate to [default: the model's own target]. Needs at "
    "least 1/rate - 1 queries, rounded up (99 for 0.01, 33 for 0.03).",
)
@click.option(
    "--per-language",
    is_flag=True,
    help="Also give each language with enough of the --id-queries (1/rate - 1, as above) "
    'a threshold of its own, each query\'s language the one its line gives ("language", '
    "a tag such as nl or pt-BR), else told by the language detector (scoring.languages); "
    "the others keep the global threshold.",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Write the new artifact here."
)
@click.option(
    "--publish",
    is_flag=True,
    help="Put the new version into the store (the source store, "
    "or the configured one with --artifact).",
)
@click.option("--no-promote", is_flag=True, help="With --publish: store without activating.")
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="With --artifact --publish and a signing key configured: also accept an artifact "
    "without a signature (as `models import --allow-unsigned`); a wrong signature is "
    "always refused.",
)
@_any_encoder_option
@encoder_option
@_store_options
@cache_dir_option
@no_progress_option
def calibrate_command(**opts: Any) -> None:
    """Recalibrate a model's threshold on in-domain queries from live traffic.

    Scores the given ID queries with the model (the KB's active store version by default,
    --version for another, or --artifact), sets the threshold to the conformal quantile of
    their scores for --target-frr and writes the result as a new version (--out and/or
    --publish). Nothing else is refitted. When the queries are drawn from the traffic the
    model serves and were never trained on, at most --target-frr of that traffic's
    in-domain queries is refused, in expectation. Prints both thresholds and the rate at
    which each refuses the given queries.
    """
    from model_store import save_dir
    from sidecar.settings import load_settings
    from sidecar.training import recalibrate_release

    _check_options(opts)
    settings = load_settings()
    store_dir, redis_url = opts["store_dir"], opts["redis_url"]
    kb_name = opts["kb"] or settings.scoring.default_kb
    if opts["publish"]:  # before the queries are encoded, not after
        from sidecar.cli._options import check_publish_target

        check_publish_target(_settings(store_dir, redis_url), kb_name)
    art = _read_source(opts, kb_name)
    # the new version keeps the source's encoder: one --publish could not promote is
    # refused before any query is encoded
    promotes = opts["publish"] and not opts["no_promote"] and not opts["any_encoder"]
    model = servable_model(
        art, refused="nothing was recalibrated", workers=settings if promotes else None
    )
    langs, given = None, 0
    if opts["per_language"]:  # a bad "language" line is refused before anything is encoded
        langs, given = _languages(model, settings, opts["id_queries"])
    embed = query_embeddings(model, settings, opts)
    E = embed(opts["id_queries"], opts["id_embeddings"], "ID")
    live = None
    if opts["live_queries"] or opts["live_embeddings"]:
        live = embed(opts["live_queries"], opts["live_embeddings"], "live")
    centred = model.centering is not None  # its means need each query's language
    done = recalibrate_release(
        model,
        E,
        opts["target_frr"],
        languages=langs,
        live=live,
        query_languages=embed.languages("ID") if centred else None,
        live_languages=embed.languages("live") if centred else None,
    )
    new, old, artifact = done.model, done.source, done.artifact
    if old.get("threshold_rule") == "balanced":
        click.echo(
            "note: the source threshold was chosen by the balanced rule; the new one is the "
            "conformal quantile for the target false-reject rate"
        )
    click.echo(
        f"KB {model.kb!r}, version {art.version[:12]} -> {artifact.version[:12]}, "
        f"{new.metrics['n_calibration']} ID queries, target FRR {done.target_frr:g}"
    )
    click.echo(
        f"  threshold {model.threshold:.4f} refused {old['frr_on_recalibration_queries']:.2%} "
        f"of them; the new {new.threshold:.4f} refuses {new.metrics['calibration_frr']:.2%}"
    )
    if langs is not None:
        click.echo(
            f"  languages: {given} given in the queries' lines, {len(langs) - given} detected"
        )
    for lang, row in (new.metrics.get("language_calibration") or {}).items():
        own = "global" if row["threshold"] is None else f"{row['threshold']:.4f}"
        click.echo(f"  {lang}: {row['n']} queries, threshold {own}")
    share = new.metrics.get("calibration_ood_share")
    if share is not None:
        click.echo(
            f"  the new threshold refuses {share:.2%} of {new.metrics['n_live_sample']} live "
            "queries: the worker exports it (sidecar_model_calibration_ood_share) and the "
            "chart alerts when the live OOD share moves far from it"
        )
    if done.training_copies:
        # The quantile's guarantee holds for queries new to the model: its own training
        # queries score as more in-domain, so the threshold comes out too strict.
        click.echo(
            f"  warning: {done.training_copies} of these queries repeat the model's training "
            "queries: they score as more in-domain than new traffic, and the new threshold "
            "may refuse more than the target; leave them out"
        )
    if opts["out"]:
        click.echo(f"wrote {save_dir(artifact, opts['out'])}")
    if opts["publish"]:
        from sidecar.persistence import publish_model

        promote = not opts["no_promote"]
        version, event = publish_model(_settings(store_dir, redis_url), artifact, promote=promote)
        click.echo(f"published {artifact.kb}/{version}{promoted_suffix(event, promote)}")


def _languages(model: Any, settings: Any, queries: Path) -> tuple[list[str | None], int]:
    """The language of each query of ``queries`` (JSONL): the one its line gives, else the
    detector's among the languages of the model's encoder or ``scoring.languages``; and
    how many the lines gave."""
    from sidecar.training import query_languages, read_query_rows

    rows = read_query_rows(queries, languages=True)
    name = str(model.encoder["name"])
    return query_languages(rows.texts, rows.languages, name, settings.scoring.languages)


def _check_options(opts: dict[str, Any]) -> None:
    """Refuse options that do not fit together, and an --out that cannot take the model."""
    from sidecar.errors import ConfigError

    if not opts["out"] and not opts["publish"]:
        raise click.UsageError("give --out DIR and/or --publish for the recalibrated model")
    if opts["no_promote"] and not opts["publish"]:
        raise click.UsageError("--no-promote applies to --publish")
    if opts["any_encoder"] and (opts["no_promote"] or not opts["publish"]):
        raise click.UsageError("--any-encoder applies to --publish without --no-promote")
    if opts["allow_unsigned"] and not (opts["artifact"] and opts["publish"]):
        raise click.UsageError("--allow-unsigned applies to --artifact DIR --publish")
    if bool(opts["id_queries"]) == bool(opts["id_embeddings"]):
        raise click.UsageError("give --id-queries or --id-embeddings (one of them)")
    if opts["per_language"] and not opts["id_queries"]:
        raise click.UsageError("--per-language tells languages from texts: give --id-queries")
    if opts["live_queries"] and opts["live_embeddings"]:
        raise click.UsageError("give --live-queries or --live-embeddings, not both")
    if opts["out"]:
        check_output_dir(opts["out"], "--out")
        if opts["out"].is_dir() and any(opts["out"].iterdir()):
            raise ConfigError(f"--out {opts['out']} is not empty")


def _read_source(opts: dict[str, Any], kb_name: str) -> Any:
    """The artifact to recalibrate: --artifact (verified as `models import` verifies it
    when it is to be published) or store version --version of KB ``kb_name``."""
    from sidecar.errors import ConfigError

    store_dir, redis_url = opts["store_dir"], opts["redis_url"]
    if opts["artifact"] is None:
        art, _ = read_model(None, kb_name, opts["ref"], store_dir, redis_url, kb_name)
        return art
    if opts["ref"] != "active":
        raise ConfigError("--artifact recalibrates that directory: leave out --version")
    if not opts["publish"] and (store_dir or redis_url):
        raise ConfigError("--store-dir / --redis-url name where --publish puts the model")
    from sidecar.persistence import signing_key

    key = signing_key(_settings(store_dir, redis_url))
    if opts["publish"]:
        # Verified as `models import` verifies: put() signs with the store's key, so an
        # unverified directory would come out signed.
        art = _load_for_import(opts["artifact"], key, allow_unsigned=opts["allow_unsigned"])
    else:
        art = load_local_dir(opts["artifact"], key)  # a wrong signature stops here too
    check_artifact_kb(art, opts["artifact"], opts["kb"])
    return art
