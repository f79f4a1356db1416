"""``sidecar check``: a model's figures on labelled held-out queries, as a release gate.

The step between ``sidecar train --publish --no-promote`` and ``sidecar models promote``
in a retraining pipeline: score ID and OOD queries the model never saw, at its own
threshold, beside the version now serving when asked, and exit 1 when a gate fails so
that the pipeline stops before the release reaches traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sidecar.cli._model_inputs import model_options
from sidecar.cli._options import (
    cache_dir_option,
    check_output_dir,
    check_output_file,
    encoder_option,
    no_progress_option,
)
from sidecar.cli._root import main
from sidecar.cli._servable import _any_encoder_option, servable_model
from sidecar.cli._store_access import _open, _store_options

_RATE = click.FloatRange(0, 1)
_PATH = click.Path(path_type=Path)


@main.command("check")
@model_options("Check")
@click.option(
    "--id-queries",
    type=_PATH,
    default=None,
    help='Held-out in-domain queries, JSONL {"text"} or Parquet; never trained on.',
)
@click.option("--id-embeddings", type=_PATH, default=None, help="The same as a .npy array.")
@click.option(
    "--id-queries-sql",
    metavar="TABLE|QUERY",
    default=None,
    help="The same from PostgreSQL (postgres.dsn): a table or a read-only query yielding "
    "text and optionally embedding, as for `sidecar train --id-queries-sql`.",
)
@click.option(
    "--ood-queries",
    type=_PATH,
    default=None,
    help='Held-out out-of-domain queries, JSONL {"text"} or Parquet (optional: without them '
    "only the false-reject rate is measured).",
)
@click.option("--ood-embeddings", type=_PATH, default=None, help="The same as a .npy array.")
@click.option(
    "--ood-queries-sql",
    metavar="TABLE|QUERY",
    default=None,
    help="The same from PostgreSQL, as --id-queries-sql.",
)
@click.option(
    "--version-from",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Check the version named in this `sidecar train --stats-json` file (instead of "
    "--version): the candidate a retraining job just stored.",
)
@click.option(
    "--against",
    default=None,
    help="Also measure this store version of the KB on the same queries (e.g. active, the "
    "one now serving), for comparison; gates judge only the checked model.",
)
@click.option("--max-frr", type=_RATE, default=None, help="Gate: false-reject rate at most this.")
@click.option(
    "--max-ood-accept",
    type=_RATE,
    default=None,
    help="Gate: share of OOD queries accepted as in-domain at most this (needs OOD queries).",
)
@click.option(
    "--min-auroc", type=_RATE, default=None, help="Gate: AUROC at least this (needs OOD queries)."
)
@click.option(
    "--conservative",
    is_flag=True,
    help="Judge each gate at the worse end of the figure's 95% interval (exact binomial for "
    "the rates, Hanley-McNeil for AUROC) instead of at the measured value.",
)
@click.option(
    "--promote",
    is_flag=True,
    help="Promote the checked store version when every gate holds (at least one gate "
    "needed); a failed gate leaves the active version as it is.",
)
@_any_encoder_option
@click.option("--json", "json_out", type=_PATH, default=None, help="Also write the figures here.")
@click.option(
    "--report",
    "report_dir",
    type=_PATH,
    default=None,
    help="Also write a Markdown page with plots here: the figures, ROC curves and score "
    "histograms of the checked (and compared) model on the held-out queries.",
)
@encoder_option
@_store_options
@cache_dir_option
@no_progress_option
def check_command(**opts: Any) -> None:
    """Measure a model on labelled held-out queries and gate its release.

    Scores the ID (and OOD) queries with the model (the KB's active store version by
    default, --version for a candidate stored with `sidecar train --publish --no-promote`,
    or --artifact) at its own threshold and prints the false-reject rate, the OOD accept
    rate, balanced accuracy and AUROC, each rate with its exact 95% interval. With
    --against, the same for another store version. Exit status 0 when every gate given
    (--max-frr, --max-ood-accept, --min-auroc) holds, 1 when one fails, 2 on bad input.
    The queries must be new to the model: figures on training queries are optimistic.
    """
    from sidecar.cli._model_inputs import query_embeddings
    from sidecar.settings import load_settings
    from sidecar.training import check_release

    gates = _gates(opts)
    ref, ref_given = _checked_ref(opts)
    if opts["json_out"]:
        check_output_file(opts["json_out"], "--json")
    if opts["report_dir"]:
        check_output_dir(opts["report_dir"], "--report")
    settings = load_settings()
    model, version, other = _read_models(opts, ref, ref_given, settings)
    embed = query_embeddings(model, settings, opts)
    E_id = embed(opts["id_queries"], opts["id_embeddings"], "ID", sql=opts["id_queries_sql"])
    E_ood = embed(opts["ood_queries"], opts["ood_embeddings"], "OOD", sql=opts["ood_queries_sql"])
    # a model centred by language subtracts each query's language mean: tell them
    centred = any(m.centering is not None for m in (model, *(other or ())[:1]))
    langs = (embed.languages("ID"), embed.languages("OOD")) if centred else (None, None)
    report = check_release(
        model,
        version,
        E_id,
        E_ood,
        gates,
        against=other,
        conservative=opts["conservative"],
        languages=langs,
    )
    _show(f"KB {model.kb!r}, version {version[:12]}", report["checked"])
    if other is not None:
        _show(f"against {opts['against']}, version {other[1][:12]}", report["against"])
    for v in report["gates"]:
        click.echo(
            f"gate {v['gate']} {v['limit']:g}: {'met' if v['met'] else 'FAILED'} "
            f"(measured {v['measured']:.4f}{', 95% interval end' if opts['conservative'] else ''})"
        )
    if opts["promote"] and report["passed"]:
        _promote(opts["store_dir"], opts["redis_url"], model.kb, version)
    elif opts["promote"]:
        click.echo(f"not promoted: {model.kb}/{version} failed a gate; the active version stays")
    report["promoted"] = bool(opts["promote"] and report["passed"])
    if opts["json_out"]:
        opts["json_out"].write_text(json.dumps(report, indent=2) + "\n")
    if opts["report_dir"]:
        from sidecar.training import write_check_report

        models = {"checked": model, **({"against": other[0]} if other is not None else {})}
        page = write_check_report(
            report,
            models,
            E_id,
            E_ood,
            opts["report_dir"],
            languages=langs,
        )
        click.echo(f"report: {page}")
    if not report["passed"]:
        click.get_current_context().exit(1)


def _gates(opts: dict[str, Any]) -> list[Any]:
    """The gates given, once the query and promotion options are known to fit together."""
    from sidecar.training import Gate

    for kind in ("id", "ood"):
        given = [
            f"--{kind}-{suffix}"
            for suffix in ("queries", "embeddings", "queries-sql")
            if opts[f"{kind}_{suffix.replace('-', '_')}"]
        ]
        if len(given) > 1:
            raise click.UsageError(f"give {' or '.join(given)}, not both")
    if not (opts["id_queries"] or opts["id_embeddings"] or opts["id_queries_sql"]):
        raise click.UsageError("give --id-queries or --id-embeddings (or --id-queries-sql)")
    has_ood = bool(opts["ood_queries"] or opts["ood_embeddings"] or opts["ood_queries_sql"])
    gates = [
        Gate(option, figure, opts[key])
        for option, figure, key in (
            ("--max-frr", "false_reject", "max_frr"),
            ("--max-ood-accept", "ood_accept", "max_ood_accept"),
            ("--min-auroc", "auroc", "min_auroc"),
        )
        if opts[key] is not None
    ]
    for g in gates:
        if g.figure != "false_reject" and not has_ood:
            raise click.UsageError(f"{g.option} needs --ood-queries or --ood-embeddings")
    if opts["promote"] and not gates:
        raise click.UsageError("--promote needs at least one gate to judge the release by")
    if opts["any_encoder"] and not opts["promote"]:
        raise click.UsageError("--any-encoder applies to --promote")
    if opts["promote"] and opts["artifact"]:
        raise click.UsageError("--promote promotes a store version: leave out --artifact")
    return gates


def _checked_ref(opts: dict[str, Any]) -> tuple[str, bool]:
    """The store version to check and whether --version was given; with --version-from,
    the version that file names, its KB then filling in a missing --kb."""
    ref = opts["ref"]
    ref_given = click.get_current_context().get_parameter_source("ref") is not (
        click.core.ParameterSource.DEFAULT
    )
    if opts["version_from"]:
        if ref_given or opts["artifact"]:
            raise click.UsageError(
                "--version-from names a store version: leave out --version and --artifact"
            )
        ref, stats_kb = _version_from(opts["version_from"])
        if opts["kb"] is not None and stats_kb is not None and opts["kb"] != stats_kb:
            raise click.UsageError(
                f"--version-from {opts['version_from']} is a model of KB {stats_kb!r}, "
                f"not {opts['kb']!r}"
            )
        opts["kb"] = opts["kb"] or stats_kb  # the KB it was trained for
    return ref, ref_given


def _read_models(
    opts: dict[str, Any], ref: str, ref_given: bool, settings: Any
) -> tuple[Any, str, tuple[Any, str] | None]:
    """(model, version, against): the checked model and, with --against, the compared
    (model, version), None where the KB has no such version yet."""
    from model_store import ArtifactNotFound
    from sidecar.cli._model_inputs import read_model
    from sidecar.errors import ConfigError

    store_dir, redis_url = opts["store_dir"], opts["redis_url"]
    default_kb = settings.scoring.default_kb
    if opts["artifact"] is not None:
        # the store options then name where --against reads from
        if (store_dir or redis_url) and not opts["against"]:
            raise click.UsageError("--store-dir / --redis-url with --artifact apply to --against")
        if ref_given:
            raise click.UsageError("--artifact checks that directory: leave out --version")
        art, version = read_model(opts["artifact"], opts["kb"], "active", None, None, default_kb)
    else:
        art, version = read_model(None, opts["kb"], ref, store_dir, redis_url, default_kb)
    # a model --promote could not promote is refused before any query is encoded
    workers = settings if opts["promote"] and not opts["any_encoder"] else None
    model = servable_model(art, refused="nothing was checked or promoted", workers=workers)
    if not opts["against"]:
        return model, version, None
    # the store of --store-dir / --redis-url / settings, with or without --artifact
    try:
        other_art, other_version = read_model(
            None, model.kb, opts["against"], store_dir, redis_url, default_kb
        )
    except ArtifactNotFound:
        if opts["against"] not in ("active", "previous"):
            raise
        # a first release has nothing to compare with; the gates still judge it
        click.echo(f"against {opts['against']}: KB {model.kb!r} has no such version yet")
        return model, version, None
    other = servable_model(other_art, refused="nothing was checked")
    if other.encoder != model.encoder:
        raise ConfigError(
            f"--against {opts['against']} was built with encoder {other.encoder}, the "
            f"checked model with {model.encoder}: compare models of one encoder"
        )
    return model, version, (other, other_version)


def _promote(store_dir: Path | None, redis_url: str | None, kb: str, version: str) -> None:
    """Promote the checked version (every gate held) and say what moved."""
    with _open(store_dir, redis_url, create=False) as store:
        moved = store.promote(kb, version)
    done = "promoted" if moved else "already active:"
    if moved is not None and moved.action == "seal":
        done = "already active, pointer sealed:"
    click.echo(f"{done} {kb}/{version}")


def _version_from(path: Path) -> tuple[str, str | None]:
    """The ``version`` and ``kb`` (None in files of older releases) of a `sidecar train
    --stats-json` file."""
    from sidecar._input_files import input_file
    from sidecar.errors import DataError

    found = input_file(path, "a JSON file", missing=f"--version-from {path}: not found")
    try:
        doc = json.loads(found.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path}: not a JSON file ({exc})") from None
    version = doc.get("version") if isinstance(doc, dict) else None
    if not isinstance(version, str) or not version:
        raise DataError(f"{path} names no model version (a `sidecar train --stats-json` file)")
    kb = doc.get("kb")
    return version, kb if isinstance(kb, str) and kb else None


def _rate_line(name: str, r: dict[str, Any]) -> str:
    return (
        f"  {name:<17} {r['rate']:7.2%}  ({r['count']}/{r['n']}; 95% interval "
        f"{r['low']:.2%}-{r['high']:.2%})"
    )


def _show(title: str, f: dict[str, Any]) -> None:
    n_ood = f" and {f['n_ood']} OOD" if "n_ood" in f else ""
    click.echo(f"{title}, threshold {f['threshold']:.4f}, on {f['n_id']} ID{n_ood} queries:")
    click.echo(_rate_line("false-reject rate", f["false_reject"]))
    if "ood_accept" in f:
        a = f["auroc"]
        click.echo(_rate_line("OOD accept rate", f["ood_accept"]))
        click.echo(
            f"  balanced accuracy {f['balanced_accuracy']:.4f}, AUROC {a['value']:.4f} "
            f"(95% interval {a['low']:.4f}-{a['high']:.4f}), FPR at 95% TPR "
            f"{f['fpr_at_95tpr']:.4f}"
        )
    by_set = f.get("training_copies", {})
    copies = sum(by_set.values())
    if copies:
        which = ", ".join(f"{n} {s.upper()}" for s, n in by_set.items() if n)
        click.echo(
            f"  warning: {copies} of these queries repeat the model's training queries "
            f"({which}): its figures on them are optimistic"
        )
