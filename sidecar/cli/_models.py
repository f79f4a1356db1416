"""``sidecar models ...``: list, inspect, promote, roll back, move and prune model versions."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from model_store import ModelStore
from sidecar.cli._root import main
from sidecar.cli._servable import _any_encoder_option, _load_for_import, servable_model
from sidecar.cli._store_access import (
    _open,
    _opened,
    _resolve,
    _settings,
    _store_options,
    _unknown_kb,
    promoted_suffix,
)

if TYPE_CHECKING:
    from model_store import Artifact

_PATH = click.Path(path_type=Path)
_EXPORT_FILES = frozenset({"manifest.json", "arrays.npz"})


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _metrics(manifest: dict[str, Any], limit: int = 3) -> str:
    items = [
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted((manifest.get("metrics") or {}).items())
        if isinstance(v, int | float | str) and not isinstance(v, bool)
    ]
    return " ".join(items[:limit]) + (" ..." if len(items) > limit else "")


@main.group("models")
def models() -> None:
    """Inspect and manage model versions in the model store (Redis or a directory).

    Versions are immutable and content-addressed; each KB has an active pointer that
    running sidecars follow within seconds (promote / rollback). By default the store
    comes from settings (SIDECAR_STORE__*, SIDECAR_REDIS__*); --store-dir or --redis-url
    override it.
    """


@models.command("list")
@click.argument("kb", required=False)
@_store_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_command(
    kb: str | None, store_dir: Path | None, redis_url: str | None, as_json: bool
) -> None:
    """List the versions of KB (or of every KB). `*` = active, `p` = previous."""
    rows: list[dict[str, Any]] = []
    with _open(store_dir, redis_url, read_only=True) as store:
        for name in [kb] if kb else store.kbs():
            active, previous = store.active(name), store.previous(name)
            for v in store.versions(name):
                info = store.info(name, v)
                model = info.manifest.get("model") or {}
                rows.append(
                    {
                        "kb": name,
                        "version": v,
                        "state": "active" if v == active else "previous" if v == previous else "",
                        "stored": _when(info.stored_at),  # entered this store (UTC)
                        "detector": str(model.get("kind", "?")),
                        "size_bytes": info.size_bytes,
                        "metrics": info.manifest.get("metrics") or {},
                        "_metrics": _metrics(dict(info.manifest)),
                    }
                )
    if as_json:
        click.echo(
            json.dumps(
                [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], indent=2
            )
        )
        return
    if not rows:
        click.echo("no versions" + (f" for KB {kb!r}" if kb else ""))
        return
    mark = {"active": "*", "previous": "p", "": ""}
    table = [("KB", "", "VERSION", "STORED (UTC)", "DETECTOR", "METRICS")] + [
        (r["kb"], mark[r["state"]], r["version"], r["stored"], r["detector"], r["_metrics"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _seal_state(store: ModelStore, kb: str) -> str:
    """Whether the active pointer's seal holds under the configured signing key."""
    from model_store import ArtifactRejected

    if store.hmac_key is None:
        return "- (no signing key configured: the pointer is not checked)"
    try:
        pointer = store.active_pointer(kb)
    except ArtifactRejected as exc:  # unsealed, or no version id at all
        named = store.active(kb)
        return (
            f"NOT VALID: {exc}; workers refuse this pointer and keep their model (if "
            f"{named} should serve, `sidecar models promote {kb} {named}` seals it)"
        )
    return f"valid (seq {pointer.seq if pointer is not None else '-'})"


@models.command("show")
@click.argument("kb")
@click.argument("version", required=False)
@_store_options
def show_command(
    kb: str, version: str | None, store_dir: Path | None, redis_url: str | None
) -> None:
    """Show a KB's pointer, history and recent events, or one VERSION's manifest.

    VERSION may be `active`, `previous`, a version id or a unique prefix of one.
    """
    with _open(store_dir, redis_url, read_only=True) as store:
        if version is None:
            # Everything read before anything is printed: a bad KB id is one error line.
            active, previous = store.active(kb), store.previous(kb)
            n_versions, history = len(store.versions(kb)), store.history(kb)[:10]
            if not n_versions:
                _unknown_kb(store, kb)
            events = store.events(kb)[-10:]
            click.echo(f"KB:       {kb}")
            click.echo(f"active:   {active or '-'}")
            click.echo(f"previous: {previous or '-'}")
            click.echo(f"versions: {n_versions}")
            click.echo(f"seal:     {_seal_state(store, kb) if active else '-'}")
            click.echo(f"history:  {' <- '.join(history) or '-'}")
            click.echo("events:")
            for e in events:
                click.echo(f"  {_when(e.ts)}  {e.action:<8}  {e.previous or '-'} -> {e.version}")
            return
        v = _resolve(store, kb, version)
        info = store.info(kb, v)
        state = (
            "active"
            if v == store.active(kb)
            else "previous"
            if v == store.previous(kb)
            else "stored"
        )
        click.echo(
            f"{kb}/{v} ({state}), stored {_when(info.stored_at)} UTC, "
            f"{info.size_bytes} bytes of arrays"
        )
        click.echo(json.dumps(info.manifest, indent=2, sort_keys=True))


@models.command("promote")
@click.argument("kb")
@click.argument("version")
@_any_encoder_option
@_store_options
def promote_command(
    kb: str, version: str, any_encoder: bool, store_dir: Path | None, redis_url: str | None
) -> None:
    """Make VERSION the active model of KB; running sidecars swap to it.

    VERSION is loaded first: one that no worker could load, or one built with another
    encoder than the settings' scoring.encoder (or whose encoder probes that encoder
    embeds differently), is refused.
    """
    settings = _settings(store_dir, redis_url)
    with _opened(settings, create=False) as store:
        v = _resolve(store, kb, version)
        artifact = store.get(kb, v)
        workers = None if any_encoder else settings
        servable_model(artifact, refused="nothing was promoted", workers=workers)
        event = store.promote(kb, v)
    if event is None:
        click.echo(f"{kb}: {v} is already active")
    elif event.action == "seal":
        click.echo(f"{kb}: {v} is already active; sealed its pointer anew with the signing key")
    else:
        click.echo(f"{kb}: promoted {event.previous or '-'} -> {event.version}")


@models.command("rollback")
@click.argument("kb")
@_store_options
def rollback_command(kb: str, store_dir: Path | None, redis_url: str | None) -> None:
    """Return KB to the version that was active before the current one."""
    with _open(store_dir, redis_url, create=False) as store:
        event = store.rollback(kb)
    click.echo(f"{kb}: rolled back {event.previous} -> {event.version}")


@models.command("export")
@click.argument("kb")
@click.argument("version")
@click.argument("directory", type=_PATH)
@_store_options
def export_command(
    kb: str, version: str, directory: Path, store_dir: Path | None, redis_url: str | None
) -> None:
    """Write one verified VERSION of KB to DIRECTORY (manifest.json + arrays.npz).

    For air-gapped transfer: carry DIRECTORY across, then `sidecar models import`.
    """
    from model_store import save_dir

    with _open(store_dir, redis_url, read_only=True) as store:
        v = _resolve(store, kb, version)
        artifact = store.get(kb, v)
    _check_export_target(directory, artifact)
    save_dir(artifact, directory)
    click.echo(f"exported {kb}/{v} to {directory}")


def _check_export_target(directory: Path, artifact: Artifact) -> None:
    """Refuse a non-empty DIRECTORY unless it holds an export of this very version.

    Writing into it would leave its other files beside the artifact (or overwrite the
    manifest of another one); re-exporting the same version in place is harmless.
    """
    from model_store import Artifact
    from sidecar.errors import ConfigError

    if not directory.is_dir():
        return  # missing: created; a file in the way: save_dir reports it
    names = {p.name for p in directory.iterdir()}
    if not names:
        return
    if names <= _EXPORT_FILES:
        try:
            manifest = json.loads((directory / "manifest.json").read_bytes())
        except (OSError, ValueError):
            manifest = None
        if isinstance(manifest, dict) and Artifact(manifest, {}).version == artifact.version:
            return
    raise ConfigError(
        f"{directory} is not empty and holds no export of {artifact.kb}/{artifact.version}: "
        "give a new or empty directory"
    )


@models.command("import")
@click.argument("directory", type=_PATH)
@click.option("--promote", is_flag=True, help="Also make it the active version of its KB.")
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="When a signing key is configured, also accept an artifact that has no signature "
    "at all (it is signed with the local key on import). An artifact that carries a "
    "signature must still match the configured key.",
)
@_any_encoder_option
@_store_options
def import_command(
    directory: Path,
    promote: bool,
    allow_unsigned: bool,
    any_encoder: bool,
    store_dir: Path | None,
    redis_url: str | None,
) -> None:
    """Verify an artifact DIRECTORY (checksums; signature when a key is set; that its
    model loads) and store it."""
    from sidecar.persistence import publish_model, signing_key

    settings = _settings(store_dir, redis_url)
    # Verified before the store is opened: a rejected artifact needs no connection.
    artifact = _load_for_import(directory, signing_key(settings), allow_unsigned=allow_unsigned)
    workers = settings if promote and not any_encoder else None
    servable_model(artifact, refused="nothing was imported", workers=workers)
    version, event = publish_model(settings, artifact, promote=promote)
    click.echo(f"imported {artifact.kb}/{version}{promoted_suffix(event, promote)}")


@models.command("gc")
@click.argument("kb", required=False)
@click.option(
    "--retention",
    type=click.IntRange(2),
    default=None,
    help="Newest versions to keep per KB; the active and previous ones are kept as well, "
    "whatever their age [default: settings, store.retention].",
)
@_store_options
def gc_command(
    kb: str | None, retention: int | None, store_dir: Path | None, redis_url: str | None
) -> None:
    """Delete old versions beyond the retention (never the active or previous one)."""
    from model_store import DirectoryStore

    overrides: dict[str, Any] = {"retention": retention} if retention else {}
    with _open(store_dir, redis_url, create=False, **overrides) as store:
        # counted here, before gc sweeps its KB's folder again without counting
        swept = store.sweep(kb) if isinstance(store, DirectoryStore) else 0
        names = store.kbs() if kb is None else [kb] if store.versions(kb) else []
        if kb is not None and not names and not swept:
            _unknown_kb(store, kb)  # (leftovers alone: a KB whose first put was killed)
        for name in names:
            deleted = store.gc(name)
            click.echo(
                f"{name}: deleted {len(deleted)} version(s)"
                + (f": {', '.join(deleted)}" if deleted else "")
            )
        if swept:
            click.echo(f"removed {swept} leftover(s) of interrupted writes")
