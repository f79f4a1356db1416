"""Options that ``sidecar train``, ``eval`` and ``calibrate`` share, defined once, and the
checks of their output paths.

Each is a click decorator; the defaults stay literal so that ``--help`` does not import the
scoring stack (a unit test pins ``--target-frr`` to ``sidecar.scoring.DEFAULT_TARGET_FRR``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

encoder_option = click.option(
    "--encoder",
    default=None,
    help="all-MiniLM-L6-v2, use-multilingual-v3, multilingual-e5-small-q4 or a local "
    "sentence-transformers dir [default: settings].",
)

encoder_url_option = click.option(
    "--encoder-url",
    default=None,
    metavar="URL",
    help="Embed through this OpenAI-compatible embedding server, as workers with "
    "scoring.encoder_backend=http do (sets it and embedding_server.base_url; the key comes "
    "from the settings) [default: settings].",
)


def encoder_overrides(encoder: str | None, encoder_url: str | None) -> dict[str, Any]:
    """Settings overrides for ``--encoder`` and ``--encoder-url``."""
    overrides: dict[str, Any] = {}
    if encoder:
        overrides["scoring"] = {"encoder": encoder}
    if encoder_url is not None:
        overrides.setdefault("scoring", {})["encoder_backend"] = "http"
        overrides["embedding_server"] = {"base_url": encoder_url}
    return overrides


def criterion_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--criterion pvalue|evr|auto`` with the command's own help text."""
    return click.option(
        "--criterion",
        default="pvalue",
        show_default=True,
        type=click.Choice(["pvalue", "evr", "auto"]),
        help=help + " auto: search under both, keep the better winner (out-of-fold balanced "
        "accuracy under cross-calibration, else validation AUROC).",
    )


target_frr_option = click.option(
    "--target-frr",
    default=0.01,  # sidecar.scoring.DEFAULT_TARGET_FRR (not imported: keeps --help fast)
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="False-reject rate (ID queries flagged OOD) the threshold is calibrated to.",
)

threshold_rule_option = click.option(
    "--threshold-rule",
    default="frr",
    show_default=True,
    type=click.Choice(["frr", "balanced"]),
    help="frr: conformal quantile for --target-frr on held-out ID queries; balanced: best "
    "balanced accuracy on held-out ID + OOD training queries (needs OOD queries).",
)

calibration_option = click.option(
    "--calibration",
    default=None,
    type=click.Choice(["cross", "split"]),
    help="frr rule: cross ships a model fitted on every ID training query, its threshold "
    "the conformal quantile of 5-fold out-of-fold scores (a steadier threshold; no "
    "finite-sample guarantee), and picks among the candidates validation cannot tell "
    "apart by out-of-fold balanced accuracy at that threshold; split calibrates on a "
    "held-out calibration part only (the conformal guarantee holds, the threshold moves "
    "more with the split) and keeps the smallest of those candidates. "
    "[default: cross; split for --threshold-rule balanced]",
)

seed_option = click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seed of splits and fits.",
)


def _usable_cache_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Any:
    """--cache-dir checked before the encoder loads (a file there used to fail only then)."""
    if value is not None:
        check_output_dir(value, "--cache-dir")
    return value


cache_dir_option = click.option(
    "--cache-dir",
    default=None,
    type=click.Path(path_type=Path),
    callback=_usable_cache_dir,
    help="Embedding cache [default: ~/.cache/ood-sidecar/embeddings].",
)

blas_threads_option = click.option(
    "--blas-threads",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="BLAS threads; more than the free cores makes the many small SVDs crawl.",
)

no_progress_option = click.option("--no-progress", is_flag=True, help="Hide progress bars.")


def check_output_dir(path: Path, option: str) -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a writable directory.

    Nothing is created, so a run that fails later on its inputs leaves no empty folder.
    """
    from sidecar.errors import ConfigError

    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{option} {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {path} is not writable")
        return
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{option} {path} cannot be created: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path} cannot be created: {ancestor} is not writable")


def check_output_file(path: Path, option: str) -> None:
    """Raise ConfigError unless ``path`` can be written as a file (its folder may be made)."""
    from sidecar.errors import ConfigError

    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path} is not writable")
    if not path.exists():
        check_output_dir(path.absolute().parent, option)


def int_list(low: int) -> Callable[[click.Context, click.Parameter, str], list[int]]:
    """click callback: ``"1000,10000"`` -> ``[1000, 10000]`` (``""``: none), each at least
    ``low``; anything else is a usage error naming the option."""

    def parse(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
        out = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            try:
                n = int(part)
            except ValueError:
                raise click.BadParameter(f"{part!r} is not an integer", ctx, param) from None
            if n < low:
                raise click.BadParameter(f"{n} is below {low}", ctx, param)
            out.append(n)
        return out

    return parse


def check_publish_target(settings: Any, kb: str) -> None:
    """Fail before a command's long work where it could not publish at its end: a store
    directory that cannot be made (checked, not created), or a Redis store that cannot
    be reached (one pointer read)."""
    if settings.store.backend == "directory":
        check_output_dir(Path(settings.store.directory), "store directory")
        return
    from sidecar.persistence import open_store

    store = open_store(settings)
    try:
        store.active(kb)
    finally:
        store.close()


features_option = click.option(
    "--features",
    default=None,
    help="combined only: comma-separated blocks among pcs,residual,max_cosine,knn,neighbours.",
)

neighbour_bank_option = click.option(
    "--neighbour-bank",
    type=click.IntRange(min=10),
    default=None,
    help="combined with the neighbours block: keep at most N labelled training queries "
    "per class for it (a seeded subsample); scoring time is linear in N [default: all, up "
    "to 6,000 ID and 4,000 OOD]. 2000 halved CLINC150's cost for -0.0002 AUROC.",
)

floor_option = click.option(
    "--floor/--no-floor",
    default=None,
    help="combined only: score each query by the larger of the learned log-odds and its "
    "distance to the KB and to the ID training queries (both scaled by the ID training "
    "queries), so OOD unlike every labelled OOD query is still refused. --no-floor: the "
    "learned log-odds alone, at most a little sharper on OOD like the labelled OOD and "
    "much weaker on OOD of other kinds; see docs/concepts/unseen-ood.md. [default: floor]",
)


center_languages_option = click.option(
    "--center-languages",
    is_flag=True,
    help="Centre every embedding by its text's language: minus the mean embedding of the "
    "training texts of that language (a language with fewer than 50 of them, or none told, "
    "loses the mean of all of them), at unit length again. The means ship with the model "
    "(format kb-subspace-ood/3: older workers refuse it), and the worker centres each query "
    "by its detected language. For multilingual encoders; see docs/guides/multilingual.md.",
)


def _deny_spec(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    return None if value in (None, "", "none") else value


deny_topics_option = click.option(
    "--deny-topics",
    metavar="builtin|none|FILE",
    default="none",
    show_default=True,
    callback=_deny_spec,
    help="Topics the model refuses even when they share the KB's subject: 'builtin' (the "
    "packaged list of harmful-request categories), a text file with one short topic "
    "description per line ('#' comments), or 'none'. The score becomes the larger of the "
    "detector's and the query's closeness to its nearest topic, each scaled by the ID "
    "training queries, and the threshold is calibrated on it, so the false-reject target "
    "holds; see docs/guides/denied-topics.md.",
)


def parse_features(text: str | None) -> tuple[str, ...] | None:
    """``--features pcs,residual`` -> ("pcs", "residual"); None when not given."""
    if not text:
        return None
    return tuple(f.strip() for f in text.split(",") if f.strip())
