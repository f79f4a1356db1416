"""What ``score``, ``calibrate`` and ``check`` read: a model (an artifact directory or a
store version) and held-out queries as embeddings of that model's encoder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sidecar.cli._servable import load_local_dir
from sidecar.cli._store_access import _open, _resolve, _settings, _version_option


def model_options(verb: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--artifact``, ``--kb`` and ``--version``: which model a command reads
    (:func:`read_model`); ``verb`` starts the help of ``--artifact`` ("Check")."""

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        f = _version_option(f)
        f = click.option(
            "--kb", default=None, help="KB of the store version [default: scoring.default_kb]."
        )(f)
        return click.option(
            "--artifact",
            type=click.Path(path_type=Path, file_okay=False),
            default=None,
            help=f"{verb} this artifact directory (`sidecar train --out`) instead of a store "
            "version.",
        )(f)

    return add


def read_model(
    artifact: Path | None,
    kb: str | None,
    ref: str,
    store_dir: Path | None,
    redis_url: str | None,
    default_kb: str,
) -> tuple[Any, str]:
    """(artifact, version): the directory ``artifact`` (checksums verified; ``kb``, when
    given, must be its KB), else version ``ref`` of KB ``kb`` (default ``default_kb``) in
    the store of ``store_dir`` / ``redis_url`` / settings, which must exist."""
    from sidecar.errors import ConfigError
    from sidecar.persistence import signing_key

    if artifact is not None:
        if store_dir or redis_url or ref != "active":
            raise ConfigError(f"--artifact reads {artifact}: leave out the store options")
        art = load_local_dir(artifact, signing_key(_settings(None, None)))
        check_artifact_kb(art, artifact, kb)
        return art, art.version
    name = kb or default_kb
    with _open(store_dir, redis_url, read_only=True) as store:
        version = _resolve(store, name, ref)
        return store.get(name, version), version


def check_artifact_kb(art: Any, directory: Path, kb: str | None) -> None:
    """ConfigError when ``kb`` is given and the artifact read from ``directory`` is a model
    of another KB."""
    from sidecar.errors import ConfigError

    if kb is not None and kb != art.manifest.get("kb"):
        raise ConfigError(f"{directory} is a model of KB {art.manifest.get('kb')!r}, not {kb!r}")


def query_embeddings(model: Any, settings: Any, opts: dict[str, Any]) -> Any:
    """:class:`sidecar.training.QueryEmbeddings` from a command's ``--encoder``,
    ``--cache-dir`` and ``--no-progress``."""
    from sidecar.training import QueryEmbeddings

    return QueryEmbeddings(
        model,
        settings,
        encoder=opts["encoder"],
        cache_dir=opts["cache_dir"],
        progress=not opts["no_progress"],
    )
