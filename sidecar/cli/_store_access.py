"""How ``sidecar`` commands reach the model store: the store options and settings, opening
the store, and naming a version (``active``, ``previous``, an id or a prefix of one), the
active one only through its seal when a signing key is configured."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from model_store import ArtifactNotFound, ModelStore

if TYPE_CHECKING:
    from sidecar.settings import Settings

_PATH = click.Path(path_type=Path)
# What model_store.save_dir writes into an artifact directory.
_EXPORT_FILES = frozenset({"manifest.json", "arrays.npz"})


def _not_empty(
    hint: str, convert: Callable[[str], Any] = str
) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback refusing a blank value, else ``convert(value)``: an empty
    --store-dir would be the working directory, an empty --redis-url the settings' Redis;
    neither is what was meant."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        if not value.strip():
            raise click.BadParameter(f"is empty ({hint})")
        return convert(value)

    return check


def _store_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--redis-url",
        default=None,
        callback=_not_empty("leave it out to use redis.url"),
        help="Use the Redis store at this URL [default: settings].",
    )(f)
    f = click.option(
        "--store-dir",
        type=click.Path(),
        default=None,
        callback=_not_empty("use . for the current directory", Path),
        help="Use the directory store at this path.",
    )(f)
    return f


# Which store version of a KB a command reads (score, calibrate).
_version_option = click.option(
    "--version",
    "ref",
    default="active",
    show_default=True,
    help="Store version: active, previous, a version id or a unique prefix of one.",
)


def _settings(store_dir: Path | None, redis_url: str | None, **store_overrides: Any) -> Settings:
    from sidecar.errors import ConfigError
    from sidecar.settings import load_settings

    if store_dir and redis_url:
        raise ConfigError("give --store-dir or --redis-url, not both")
    store: dict[str, Any] = dict(store_overrides)
    redis: dict[str, Any] = {}
    if store_dir:
        store.update(backend="directory", directory=store_dir)
    if redis_url:
        store["backend"] = "redis"
        redis["url"] = redis_url
    return load_settings(store=store, redis=redis)


@contextmanager
def _opened(settings: Settings, *, create: bool = True) -> Iterator[ModelStore]:
    """The configured store; unless ``create``, a directory store must already exist.

    Opening a directory store creates its root. Only a command that puts a new version
    (import, calibrate --publish) may do that: for a command that reads, moves a pointer
    or deletes, a mistyped --store-dir would list an empty store, report "no version", or
    leave a stray empty store behind.
    """
    from sidecar.persistence import open_store

    if not create and settings.store.backend == "directory":
        _check_store_dir(settings.store.directory)
    s = open_store(settings)
    try:
        yield s
    finally:
        s.close()


def _check_store_dir(root: Path) -> None:
    from sidecar.errors import ConfigError

    hint = "check --store-dir or store.directory"
    if not root.exists():
        raise ConfigError(f"store directory {root} does not exist ({hint})")
    if not root.is_dir():
        raise ConfigError(f"store directory {root} is not a directory ({hint})")


def _open(
    store_dir: Path | None,
    redis_url: str | None,
    *,
    read_only: bool = False,
    create: bool = True,
    **store_overrides: Any,
) -> AbstractContextManager[ModelStore]:
    """The store of --store-dir / --redis-url / settings.

    ``read_only`` (the command only reads) implies ``create=False``; a command that
    changes pointers or deletes versions gives ``create=False`` itself.
    """
    settings = _settings(store_dir, redis_url, **store_overrides)
    return _opened(settings, create=create and not read_only)


def _unknown_kb(store: ModelStore, kb: str) -> None:
    """Refuse a KB id that has no version in ``store``: gc keeps the active one, so that
    is a mistyped name, not an empty KB."""
    known = store.kbs()
    if kb in known:  # listed, but none of its versions reads back
        raise ArtifactNotFound(f"KB {kb!r} has no readable versions in this store")
    raise ArtifactNotFound(
        f"KB {kb!r} has no versions in this store"
        + (f" (its KBs: {', '.join(known)})" if known else " (it holds no KB)")
    )


def promoted_suffix(event: Any, promote: bool) -> str:
    """How a publishing command ends its line: what ``store.promote`` did, if asked."""
    if not promote:
        return ""
    if event is None:
        return " (already active)"
    if event.action == "seal":
        return " (already active; its pointer sealed anew)"
    return " and promoted it"


def _active(store: ModelStore, kb: str) -> str | None:
    """The active version, its seal checked when the store has a signing key: a command
    must not check, recalibrate, export or re-seal a version that a writer without the
    key put in service (:class:`~model_store.PointerUnsealed`)."""
    pointer = store.active_pointer(kb)
    return pointer.version if pointer is not None else None


def _resolve(store: ModelStore, kb: str, ref: str) -> str:
    """``active``, ``previous``, a full version id or a unique prefix of one."""
    if ref in ("active", "previous"):
        v = _active(store, kb) if ref == "active" else store.previous(kb)
        if v is None:
            raise ArtifactNotFound(f"KB {kb!r} has no {ref} version")
        return v
    matches = [v for v in store.versions(kb) if v.startswith(ref.lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ArtifactNotFound(f"KB {kb!r} has no version {ref!r}")
    raise ArtifactNotFound(f"{ref!r} matches {len(matches)} versions of KB {kb!r}; give more")
