"""Open the configured model store (Redis or a directory) from the process settings."""

from __future__ import annotations

from model_store import (
    AsyncDirectoryStore,
    AsyncModelStore,
    AsyncRedisStore,
    DirectoryStore,
    ModelStore,
    RedisStore,
)
from sidecar.settings import Settings


def signing_key(settings: Settings) -> bytes | None:
    """The store's signing key as bytes; None when signing is off.

    Never ``b""``: the settings reject a set-but-blank key, which the stores would read
    as "no key" and so accept unsigned models without a word.
    """
    key = settings.store.hmac_key
    return key.get_secret_value().encode() if key is not None else None


def _password(settings: Settings) -> str | None:
    pw = settings.redis.password
    return pw.get_secret_value() if pw is not None else None


def _tls(settings: Settings) -> dict[str, str | None]:
    """The TLS files of a ``rediss://`` store (all None: the system's CAs, no client cert)."""
    r = settings.redis
    return {
        "ssl_ca_file": r.ssl_ca_file,
        "ssl_cert_file": r.ssl_cert_file,
        "ssl_key_file": r.ssl_key_file,
    }


def _directory_store(settings: Settings) -> DirectoryStore:
    return DirectoryStore(
        settings.store.directory,
        hmac_key=signing_key(settings),
        retention=settings.store.retention,
    )


def open_store(settings: Settings) -> ModelStore:
    """The synchronous store named by ``settings.store.backend`` (CLI, training)."""
    if settings.store.backend == "directory":
        return _directory_store(settings)
    return RedisStore(
        settings.redis.url,
        password=_password(settings),
        prefix=settings.redis.key_prefix,
        hmac_key=signing_key(settings),
        retention=settings.store.retention,
        chunk_bytes=settings.store.chunk_bytes,
        socket_timeout_s=settings.redis.socket_timeout_s,
        **_tls(settings),
    )


def open_async_store(settings: Settings) -> AsyncModelStore:
    """The asyncio read side of the configured store (the stream processor's watcher)."""
    if settings.store.backend == "directory":
        return AsyncDirectoryStore(_directory_store(settings))
    return AsyncRedisStore(
        settings.redis.url,
        password=_password(settings),
        prefix=settings.redis.key_prefix,
        hmac_key=signing_key(settings),
        socket_timeout_s=settings.redis.socket_timeout_s,
        **_tls(settings),
    )
