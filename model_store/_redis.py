"""The production store: artifacts in Redis, in chunks, with an atomic active pointer.

See :mod:`model_store._redis_common` for the key layout and :mod:`model_store._scripts`
for the Lua scripts. A version's chunks, manifest and metadata are written before the
version is listed in the KB's ``versions`` set, so a reader never sees half a version.
Pointer changes are one Lua script each (check, move, push history, seal with a signing
key, XADD event). Connection and timeout errors are retried with a short exponential
backoff by the client, then raised as :class:`StoreUnavailable`.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from model_store._artifact import Artifact, encode, verify_manifest
from model_store._errors import ArtifactCorrupt, ArtifactNotFound, StoreUnavailable
from model_store._redis_common import (
    EVENTS_MAX,
    Keys,
    client_from_url,
    loose_text,
    manifest_and_meta,
    parse_event,
    queue_manifest_and_meta,
    safe_url,
    script_event,
    split_chunks,
    text,
    tls_options,
    translate_errors,
)
from model_store._scripts import PROMOTE_LUA, READ_SEAL_LUA, ROLLBACK_LUA, UNLIST_LUA
from model_store._seal import (
    POINTER_MAX_CHARS,
    SEAL_MAX_BYTES,
    SEAL_TRIES,
    ActivePointer,
    next_seal,
    verified_pointer,
)
from model_store._store import (
    HISTORY_MAX,
    MAX_CHUNKS,
    MIN_CHUNK_BYTES,
    StoreEvent,
    VersionInfo,
    check_chunk_lengths,
    check_kb,
    check_version,
    previous_in,
    stored_chunks,
    stored_info,
    verified_artifact,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
_CORRUPT = (
    "KB {kb!r}: its history or event stream key holds another Redis type; the pointer "
    "did not move (delete that key to repair the KB)"
)


def redis_retry() -> Retry:
    """Three retries, 20 ms doubling to 0.5 s, on connection and timeout errors only."""
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), 3)


class RedisStore:
    """Synchronous Redis store (CLI, training job).

    Parameters
    ----------
    url : str
        ``redis://[user@]host:port/db``, or ``rediss://...`` for TLS.
    password : str, optional
        Overrides a password in the URL.
    prefix : str
        Namespace of every key.
    hmac_key : bytes, optional
        Sign manifests on :meth:`put`; require a valid signature on :meth:`get`.
    retention : int
        Versions kept per KB by :meth:`gc` (the active and previous ones always).
    chunk_bytes : int
        Size of each stored slice of the arrays file.
    ssl_ca_file, ssl_cert_file, ssl_key_file : str, optional
        With a ``rediss://`` URL: the CA bundle the server's certificate must chain to
        (default: the system's), and a client certificate and key for mutual TLS. Loaded
        once here: a file that does not load is :class:`StoreMisconfigured`.
    """

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        prefix: str = "oodsc",
        hmac_key: bytes | None = None,
        retention: int = 10,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        socket_timeout_s: float = 5.0,
        ssl_ca_file: str | None = None,
        ssl_cert_file: str | None = None,
        ssl_key_file: str | None = None,
    ) -> None:
        self.url = safe_url(url)
        self.keys = Keys(prefix)
        self.hmac_key = hmac_key or None
        self.retention = retention
        if chunk_bytes < MIN_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": socket_timeout_s,
            "retry": redis_retry(),
        }
        if password:
            kwargs["password"] = password
        kwargs.update(
            tls_options(url, ca_file=ssl_ca_file, cert_file=ssl_cert_file, key_file=ssl_key_file)
        )
        self.client: redis.Redis = client_from_url(redis.Redis.from_url, url, **kwargs)
        self._promote = self.client.register_script(PROMOTE_LUA)
        self._rollback = self.client.register_script(ROLLBACK_LUA)
        self._unlist = self.client.register_script(UNLIST_LUA)
        self._read_seal = self.client.register_script(READ_SEAL_LUA)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.keys.prefix!r})"

    # -- versions -------------------------------------------------------------------------

    def put(self, artifact: Artifact) -> str:
        kb, version = check_kb(artifact.kb), artifact.version
        k = self.keys
        with translate_errors(self.url):
            if self.client.zscore(k.versions(kb), version) is not None:
                log.info("version %s of KB %s already stored", version, kb)
                return version
            manifest_bytes, arrays_bytes = encode(artifact.signed(self.hmac_key))
            chunks = split_chunks(arrays_bytes, self.chunk_bytes)
            if len(chunks) > MAX_CHUNKS:
                raise ValueError(
                    f"{len(arrays_bytes)} bytes make {len(chunks)} chunks of {self.chunk_bytes}; "
                    f"at most {MAX_CHUNKS}: raise chunk_bytes"
                )
            pipe = self.client.pipeline(transaction=False)
            for i, chunk in enumerate(chunks):
                pipe.set(k.chunk(kb, version, i), chunk)
            pipe.execute()
            now = time.time()
            meta = {
                "chunks": len(chunks),
                "size": len(arrays_bytes),
                "sha256": hashlib.sha256(arrays_bytes).hexdigest(),
                "stored_at": repr(now),
            }
            pipe = self.client.pipeline(transaction=True)
            pipe.set(k.manifest(kb, version), manifest_bytes)
            pipe.hset(k.meta(kb, version), mapping=meta)  # type: ignore[arg-type]
            # Listed last: from here on readers may use the version.
            pipe.zadd(k.versions(kb), {version: now}, nx=True)
            pipe.sadd(k.kbs, kb)
            pipe.execute()
        log.info(
            "stored version %s of KB %s (%d bytes, %d chunks)",
            version,
            kb,
            len(arrays_bytes),
            len(chunks),
        )
        return version

    def _require_listed(self, kb: str, version: str) -> None:
        if self.client.zscore(self.keys.versions(kb), version) is None:
            raise ArtifactNotFound(f"KB {kb!r} has no version {version!r}")

    def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        check_kb(kb), check_version(version)
        k = self.keys
        with translate_errors(self.url):
            self._require_listed(kb, version)
            manifest_bytes, meta = self._manifest_and_meta(kb, version)
            # Cheap checks (schema, signature, encoder, sizes) before fetching the arrays.
            manifest = verify_manifest(
                manifest_bytes, hmac_key=self.hmac_key, expected_encoder=expected_encoder
            )
            n = stored_chunks(kb, version, manifest, meta)
            pipe = self.client.pipeline(transaction=False)
            for i in range(n):
                pipe.strlen(k.chunk(kb, version, i))
            check_chunk_lengths(kb, version, pipe.execute(), meta)
            for i in range(n):
                pipe.get(k.chunk(kb, version, i))
            parts = pipe.execute()
        if any(p is None for p in parts):
            raise ArtifactCorrupt(f"version {version} of KB {kb!r} is missing chunks")
        return verified_artifact(
            kb,
            version,
            manifest_bytes,
            b"".join(parts),
            meta,
            hmac_key=self.hmac_key,
            expected_encoder=expected_encoder,
        )

    def _manifest_and_meta(self, kb: str, version: str) -> tuple[bytes, dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        queue_manifest_and_meta(pipe, self.keys, kb, version)
        return manifest_and_meta(pipe.execute(), kb, version)

    def manifest(self, kb: str, version: str) -> dict[str, Any]:
        return dict(self.info(kb, version).manifest)

    def info(self, kb: str, version: str) -> VersionInfo:
        check_kb(kb), check_version(version)
        with translate_errors(self.url):
            self._require_listed(kb, version)
            manifest_bytes, meta = self._manifest_and_meta(kb, version)
        return stored_info(kb, version, manifest_bytes, meta)

    def versions(self, kb: str) -> list[str]:
        check_kb(kb)
        with translate_errors(self.url):
            return [text(v) for v in self.client.zrange(self.keys.versions(kb), 0, -1)]

    def kbs(self) -> list[str]:
        with translate_errors(self.url):
            return sorted(text(v) for v in self.client.smembers(self.keys.kbs))

    # -- pointer --------------------------------------------------------------------------

    def active(self, kb: str) -> str | None:
        check_kb(kb)
        with translate_errors(self.url):
            # a version id is 16 characters: more is not one, and is not read whole
            v = self.client.getrange(self.keys.active(kb), 0, POINTER_MAX_CHARS - 1)
        return loose_text(v) or None

    def history(self, kb: str) -> list[str]:
        check_kb(kb)
        with translate_errors(self.url):
            return [loose_text(v) or "" for v in self.client.lrange(self.keys.history(kb), 0, -1)]

    def previous(self, kb: str) -> str | None:
        check_kb(kb)
        return previous_in(self.history(kb))

    def active_pointer(self, kb: str) -> ActivePointer | None:
        check_kb(kb)
        with translate_errors(self.url):
            # one read command, atomic and allowed to a read-only ACL user
            version, seal = self.client.mget(self.keys.active(kb), self.keys.seal(kb))
        return verified_pointer(self.hmac_key, kb, loose_text(version), seal)

    def _seal_read(self, kb: str) -> tuple[bytes | None, str]:
        """The stored seal (its first bytes) and its hash, for a move's compare-and-set."""
        seal, digest = self._read_seal(keys=[self.keys.seal(kb)], args=[SEAL_MAX_BYTES])
        return seal, text(digest)

    def _move(self, kb: str, script: Any, args: Callable[[], list[Any]]) -> Any:
        """Run a pointer ``script`` with ``args()``, read afresh (and signed again) while
        other writers change the seal under it."""
        for attempt in range(SEAL_TRIES):
            with translate_errors(self.url):
                reply = script(keys=self.keys.pointer_keys(kb), args=args())
            if text(reply[0]) != "raced":
                return reply
            time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise StoreUnavailable(
            f"KB {kb!r}: the pointer's seal kept changing under other writers; nothing moved"
        )

    def promote(self, kb: str, version: str) -> StoreEvent | None:
        check_kb(kb), check_version(version)
        ts = time.time()

        def args() -> list[Any]:
            seal_args = ["0", "", ""]
            if self.hmac_key is not None:
                seal, digest = self._seal_read(kb)
                seal_args = ["1", digest, next_seal(self.hmac_key, seal, kb, version)]
            return [version, repr(ts), kb, HISTORY_MAX, EVENTS_MAX, *seal_args]

        reply = self._move(kb, self._promote, args)
        status = text(reply[0])
        if status == "missing":
            raise ArtifactNotFound(f"KB {kb!r} has no version {version!r} to promote")
        if status == "corrupt":
            raise ArtifactCorrupt(_CORRUPT.format(kb=kb))
        if status == "noop":
            return None
        if status == "sealed":
            event = script_event(reply, kb, "seal", ts)
            log.info("sealed the active pointer of KB %s at %s", kb, version)
            return event
        event = script_event(reply, kb, "promote", ts)
        log.info("promoted KB %s to %s (was %s)", kb, version, event.previous)
        return event

    def rollback(self, kb: str) -> StoreEvent:
        check_kb(kb)
        ts = time.time()

        def args() -> list[Any]:
            seal_args = ["0", "", "", ""]
            if self.hmac_key is not None:
                seal, digest = self._seal_read(kb)
                rows = self.client.lrange(self.keys.history(kb), 0, -1)
                # with no target the script answers 'nohistory', or 'raced' if one came
                target = previous_in([loose_text(v) or "" for v in rows]) or ""
                seal_args = ["1", digest, target, next_seal(self.hmac_key, seal, kb, target)]
            return [repr(ts), kb, EVENTS_MAX, *seal_args]

        reply = self._move(kb, self._rollback, args)
        status = text(reply[0])
        if status == "nohistory":
            raise ArtifactNotFound(f"KB {kb!r} has no previous version to roll back to")
        if status == "missing":
            raise ArtifactNotFound(f"KB {kb!r}: previous version {text(reply[1])} is gone")
        if status == "corrupt":
            raise ArtifactCorrupt(_CORRUPT.format(kb=kb))
        event = script_event(reply, kb, "rollback", ts)
        log.info("rolled KB %s back to %s (was %s)", kb, event.version, event.previous)
        return event

    def events(self, kb: str, after: str | None = None) -> list[StoreEvent]:
        check_kb(kb)
        start = f"({after}" if after and after != "0" else "-"
        with translate_errors(self.url):
            rows: Any = self.client.xrange(self.keys.events(kb), min=start, max="+")
        return [parse_event(i, f, kb) for i, f in rows]

    # -- retention ------------------------------------------------------------------------

    def gc(self, kb: str) -> list[str]:
        check_kb(kb)
        k = self.keys
        deleted: list[str] = []
        with translate_errors(self.url):
            listed = [text(v) for v in self.client.zrange(k.versions(kb), 0, -1)]
            for version in listed[: max(0, len(listed) - self.retention)]:
                keys = [k.versions(kb), k.active(kb), k.history(kb)]
                keys += [k.manifest(kb, version), k.meta(kb, version)]
                if self._unlist(keys=keys, args=[version, k.chunks(kb, version), MAX_CHUNKS]):
                    deleted.append(version)
        if deleted:
            log.info("gc removed %d versions of KB %s", len(deleted), kb)
        return deleted

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
