"""The read side of the Redis store for asyncio (the stream processor's model watcher).

Same keys and checks as :class:`model_store.RedisStore`. ``wait_events`` is one
``XREAD BLOCK`` over the served KBs' streams: every replica reads every event (no
consumer group), which is what lets all replicas swap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from model_store._artifact import Artifact, verify_manifest
from model_store._errors import ArtifactCorrupt, ArtifactNotFound
from model_store._redis_common import (
    Keys,
    client_from_url,
    loose_text,
    manifest_and_meta,
    parse_event,
    queue_manifest_and_meta,
    safe_url,
    text,
    tls_options,
    translate_errors,
)
from model_store._seal import POINTER_MAX_CHARS, ActivePointer, SeqGuard, verified_pointer
from model_store._store import (
    StoreEvent,
    check_chunk_lengths,
    check_kb,
    check_version,
    previous_in,
    stored_chunks,
    verified_artifact,
)


class AsyncRedisStore:
    """Asyncio Redis store (read side): get, active pointer, event stream.

    Parameters are those of :class:`model_store.RedisStore`.
    """

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        prefix: str = "oodsc",
        hmac_key: bytes | None = None,
        socket_timeout_s: float = 5.0,
        ssl_ca_file: str | None = None,
        ssl_cert_file: str | None = None,
        ssl_key_file: str | None = None,
    ) -> None:
        self.url = safe_url(url)
        self.keys = Keys(prefix)
        self.hmac_key = hmac_key or None
        self.socket_timeout_s = socket_timeout_s
        self._seqs = SeqGuard()
        kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": socket_timeout_s,
            "retry": Retry(ExponentialBackoff(cap=0.5, base=0.02), 3),
        }
        if password:
            kwargs["password"] = password
        kwargs.update(
            tls_options(url, ca_file=ssl_ca_file, cert_file=ssl_cert_file, key_file=ssl_key_file)
        )
        self.client: aioredis.Redis = client_from_url(aioredis.Redis.from_url, url, **kwargs)

    def __repr__(self) -> str:
        return f"AsyncRedisStore({self.url!r}, prefix={self.keys.prefix!r})"

    async def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        check_kb(kb), check_version(version)
        k = self.keys
        with translate_errors(self.url):
            if await self.client.zscore(k.versions(kb), version) is None:
                raise ArtifactNotFound(f"KB {kb!r} has no version {version!r}")
            pipe = self.client.pipeline(transaction=False)
            queue_manifest_and_meta(pipe, k, kb, version)
            manifest_bytes, meta = manifest_and_meta(await pipe.execute(), kb, version)
            manifest = verify_manifest(
                manifest_bytes, hmac_key=self.hmac_key, expected_encoder=expected_encoder
            )
            n = stored_chunks(kb, version, manifest, meta)
            pipe = self.client.pipeline(transaction=False)
            for i in range(n):
                pipe.strlen(k.chunk(kb, version, i))
            check_chunk_lengths(kb, version, await pipe.execute(), meta)
            for i in range(n):
                pipe.get(k.chunk(kb, version, i))
            parts = await pipe.execute()
        if any(p is None for p in parts):
            raise ArtifactCorrupt(f"version {version} of KB {kb!r} is missing chunks")
        # Hashing every array takes a while for big models: keep it off the event loop.
        return await asyncio.to_thread(
            verified_artifact,
            kb,
            version,
            manifest_bytes,
            b"".join(parts),
            meta,
            hmac_key=self.hmac_key,
            expected_encoder=expected_encoder,
        )

    async def active(self, kb: str) -> str | None:
        check_kb(kb)
        with translate_errors(self.url):
            # a version id is 16 characters: more is not one, and is not read whole
            v = await self.client.getrange(self.keys.active(kb), 0, POINTER_MAX_CHARS - 1)
        return loose_text(v) or None

    async def active_pointer(self, kb: str) -> ActivePointer | None:
        check_kb(kb)
        with translate_errors(self.url):
            # one read command, atomic and allowed to a read-only ACL user (workers)
            version, seal = await self.client.mget(self.keys.active(kb), self.keys.seal(kb))
        pointer = verified_pointer(self.hmac_key, kb, loose_text(version), seal)
        return self._seqs.check(kb, pointer)

    async def previous(self, kb: str) -> str | None:
        check_kb(kb)
        with translate_errors(self.url):
            rows = await self.client.lrange(self.keys.history(kb), 0, -1)
        return previous_in([loose_text(v) or "" for v in rows])

    async def last_event_id(self, kb: str) -> str:
        check_kb(kb)
        with translate_errors(self.url):
            rows = await self.client.xrevrange(self.keys.events(kb), count=1)
        return text(rows[0][0]) if rows else "0"

    async def wait_events(self, after: Mapping[str, str], timeout_s: float) -> Sequence[StoreEvent]:
        if not after:
            await asyncio.sleep(timeout_s)
            return []
        # Block for less than the socket timeout, or the read itself would time out.
        block_ms = max(1, int(min(timeout_s, self.socket_timeout_s / 2) * 1000))
        streams = {self.keys.events(check_kb(kb)): (i or "0") for kb, i in after.items()}
        with translate_errors(self.url):
            reply: Any = await self.client.xread(streams, block=block_ms)  # type: ignore[arg-type]
        events: list[StoreEvent] = []
        for key, rows in reply or []:
            kb = self.keys.kb_from_events_key(text(key))
            events.extend(parse_event(i, f, kb) for i, f in rows)
        return events

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless Redis answers (for readiness checks)."""
        with translate_errors(self.url):
            await self.client.ping()

    async def close(self) -> None:
        await self.client.aclose()
