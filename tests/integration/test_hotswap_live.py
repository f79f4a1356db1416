"""Live model swaps against a real redis-server (and the directory store).

Tiny real models (``fit_ood_model`` on random unit vectors, no encoder load). Every wait
is on the holder's change notification with a timeout, never a bare sleep.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_store import (
    Artifact,
    AsyncDirectoryStore,
    AsyncModelStore,
    AsyncRedisStore,
    DirectoryStore,
    ModelStore,
    RedisStore,
    StoreUnavailable,
)
from sidecar.hotswap import ModelHolder, ModelWatcher
from sidecar.local import EmbeddedRedis
from sidecar.persistence import model_to_artifact

pytestmark = pytest.mark.integration

ENC = {"name": "test-encoder", "dim": 16}
KB = "kb1"
WAIT_S = 10.0


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def artifacts() -> dict[str, Artifact]:
    """Three distinct tiny models of KB ``kb1`` (A, B, C) and one of another encoder."""
    from sidecar.scoring import fit_ood_model

    out: dict[str, Artifact] = {}
    for i, name in enumerate("ABC"):
        rng = np.random.default_rng(i)
        model = fit_ood_model(
            kb=KB,
            encoder=ENC,
            kb_embeddings=_unit(rng.standard_normal((40, 16))),
            id_embeddings=_unit(rng.standard_normal((20, 16))),
            detector="mahalanobis",
            criterion="evr",
            m=4,
        )
        out[name] = model_to_artifact(model)
    rng = np.random.default_rng(9)
    out["other_encoder"] = model_to_artifact(
        fit_ood_model(
            kb=KB,
            encoder={"name": "other-encoder", "dim": 8},
            kb_embeddings=_unit(rng.standard_normal((40, 8))),
            id_embeddings=_unit(rng.standard_normal((20, 8))),
            detector="mahalanobis",
            criterion="evr",
            m=4,
        )
    )
    return out


class Stores:
    """A sync store for the test's writes and an async one for the watcher, same data."""

    def __init__(self, sync: ModelStore, make_async: Callable[[], AsyncModelStore]) -> None:
        self.sync = sync
        self.make_async = make_async


@pytest.fixture(params=["redis", "directory"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "redis":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        sync: ModelStore = RedisStore(server.url, prefix="hs")
        yield Stores(sync, lambda: AsyncRedisStore(server.url, prefix="hs"))
    else:
        sync = DirectoryStore(tmp_path / "store")
        yield Stores(sync, lambda: AsyncDirectoryStore(DirectoryStore(tmp_path / "store")))
    sync.close()


@pytest.fixture
def redis_stores(redis_server: EmbeddedRedis) -> Iterator[Stores]:
    sync = RedisStore(redis_server.url, prefix="hs")
    yield Stores(sync, lambda: AsyncRedisStore(redis_server.url, prefix="hs"))
    sync.close()


class Running:
    def __init__(self, holder: ModelHolder, watcher: ModelWatcher) -> None:
        self.holder, self.watcher = holder, watcher

    async def wait_version(self, version: str) -> None:
        await self.holder.wait_for(lambda h: _version(h) == version, WAIT_S)

    async def wait_failures(self, n: int) -> None:
        await self.holder.wait_for(lambda h: h.status()[KB]["load_failures"] >= n, WAIT_S)


def _version(holder: ModelHolder) -> str | None:
    loaded = holder.get(KB)
    return loaded.version if loaded else None


@pytest.fixture
async def run_watcher() -> AsyncIterator[Callable[..., Any]]:
    started: list[tuple[ModelWatcher, AsyncModelStore]] = []

    async def start(stores: Stores, **kw: Any) -> Running:
        store = stores.make_async()
        holder = ModelHolder([KB])
        kw.setdefault("poll_interval_s", 30.0)  # events do the work unless a test says so
        watcher = ModelWatcher(store, holder, encoder=ENC, event_wait_s=0.5, **kw)
        await watcher.start()
        started.append((watcher, store))
        return Running(holder, watcher)

    yield start
    for watcher, store in started:
        await watcher.stop()
        await store.close()


async def test_start_loads_active_and_swaps_on_promote(
    stores: Stores, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    a, b = stores.sync.put(artifacts["A"]), stores.sync.put(artifacts["B"])
    stores.sync.promote(KB, a)
    r: Running = await run_watcher(stores)
    assert r.holder.ready() and _version(r.holder) == a
    before = r.holder.snapshot()
    with pytest.raises(TypeError):
        before[KB] = before[KB]  # type: ignore[index]

    stores.sync.promote(KB, b)
    await r.wait_version(b)
    assert before[KB].version == a  # an old snapshot never changes under a batch
    assert r.holder.previous(KB) is not None and r.holder.previous(KB).version == a
    status = r.holder.status()[KB]
    assert status["version"] == b and status["previous_version"] == a
    assert status["swaps"] == 2 and status["load_failures"] == 0
    probe = _unit(np.random.default_rng(5).standard_normal((4, 16)))
    assert r.holder.snapshot()[KB].model.score(probe).shape == (4,)


async def test_rollback_reuses_the_previous_model_without_fetch(
    stores: Stores, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    a, b = stores.sync.put(artifacts["A"]), stores.sync.put(artifacts["B"])
    stores.sync.promote(KB, a)
    r: Running = await run_watcher(stores)
    model_a = r.holder.get(KB).model  # type: ignore[union-attr]
    stores.sync.promote(KB, b)
    await r.wait_version(b)
    stores.sync.rollback(KB)
    await r.wait_version(a)
    assert r.holder.get(KB).model is model_a  # type: ignore[union-attr]


async def test_two_replicas_both_swap(
    stores: Stores, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    a, b = stores.sync.put(artifacts["A"]), stores.sync.put(artifacts["B"])
    stores.sync.promote(KB, a)
    r1: Running = await run_watcher(stores)
    r2: Running = await run_watcher(stores)
    stores.sync.promote(KB, b)
    await r1.wait_version(b)
    await r2.wait_version(b)


def _corrupt_chunk(stores: Stores, version: str) -> None:
    if isinstance(stores.sync, RedisStore):
        key = stores.sync.keys.chunk(KB, version, 0)
        data = bytearray(stores.sync.client.get(key) or b"")
        data[len(data) // 2] ^= 0xFF
        stores.sync.client.set(key, bytes(data))
    else:
        assert isinstance(stores.sync, DirectoryStore)
        path = stores.sync.root / KB / "versions" / version / "arrays.npz"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("bad", ["corrupt_bytes", "wrong_schema", "wrong_encoder", "bad_model"])
async def test_rejected_version_keeps_the_old_model(
    bad: str, stores: Stores, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    a = stores.sync.put(artifacts["A"])
    stores.sync.promote(KB, a)
    r: Running = await run_watcher(stores)
    if bad == "corrupt_bytes":
        v = stores.sync.put(artifacts["B"])
        _corrupt_chunk(stores, v)
    elif bad == "wrong_schema":
        art = artifacts["B"]
        v = stores.sync.put(Artifact({**art.manifest, "schema_version": 2}, art.arrays))
    elif bad == "wrong_encoder":
        v = stores.sync.put(artifacts["other_encoder"])
    else:  # arrays and checksums fine, but the model section is nonsense
        art = artifacts["B"]
        manifest = json.loads(json.dumps(art.manifest))
        manifest["model"]["kind"] = "no-such-detector"
        v = stores.sync.put(Artifact(manifest, art.arrays))
    stores.sync.promote(KB, v)
    await r.wait_failures(1)
    status = r.holder.status()[KB]
    assert _version(r.holder) == a and r.holder.ready()
    assert status["last_error"].startswith(v) and status["store_active"] == v
    # A rejected version is not retried on every poll, but a good promotion still lands.
    await r.watcher.sync()
    assert r.holder.status()[KB]["load_failures"] == 1
    c = stores.sync.put(artifacts["C"])
    stores.sync.promote(KB, c)
    await r.wait_version(c)
    assert r.holder.status()[KB]["last_error"] is None


async def test_with_a_key_only_sealed_pointers_to_signed_versions_are_served(
    redis_server: EmbeddedRedis, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    """A writer without the key can move the pointer but not seal it: the worker keeps
    its model, whether the version named is unsigned or a signed candidate that was never
    promoted. A key holder's pointer to an unsigned version is refused by its signature."""
    signer = RedisStore(redis_server.url, prefix="hs", hmac_key=b"secret")
    intruder = RedisStore(redis_server.url, prefix="hs")
    a, candidate = signer.put(artifacts["A"]), signer.put(artifacts["C"])
    signer.promote(KB, a)
    stores = Stores(
        signer, lambda: AsyncRedisStore(redis_server.url, prefix="hs", hmac_key=b"secret")
    )
    r: Running = await run_watcher(stores)
    assert _version(r.holder) == a
    unsigned = intruder.put(artifacts["B"])
    intruder.promote(KB, unsigned)
    await r.wait_failures(1)
    assert _version(r.holder) == a
    assert "PointerUnsealed" in r.holder.status()[KB]["last_error"]
    intruder.promote(KB, candidate)  # signed, but no key holder put it in service
    await r.wait_failures(2)
    assert _version(r.holder) == a
    assert r.holder.status()[KB]["last_error"].startswith(candidate)
    signer.promote(KB, unsigned)  # sealed, but the version itself is not signed
    await r.wait_failures(3)
    assert _version(r.holder) == a
    assert "SignatureInvalid" in r.holder.status()[KB]["last_error"]
    signer.promote(KB, candidate)
    await r.wait_version(candidate)
    signer.close(), intruder.close()


async def test_poll_catches_a_pointer_change_without_event(
    redis_stores: Stores, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    store = redis_stores.sync
    assert isinstance(store, RedisStore)
    a, b = store.put(artifacts["A"]), store.put(artifacts["B"])
    store.promote(KB, a)
    r: Running = await run_watcher(redis_stores, poll_interval_s=0.2)
    store.client.set(store.keys.active(KB), b)  # as if the event were lost
    await r.wait_version(b)


async def test_redis_restart_reconnects_and_converges(
    redis_server: EmbeddedRedis,
    redis_stores: Stores,
    artifacts: dict[str, Artifact],
    run_watcher: Callable[..., Any],
) -> None:
    store = redis_stores.sync
    a = store.put(artifacts["A"])
    store.promote(KB, a)
    r: Running = await run_watcher(redis_stores, poll_interval_s=0.5, backoff_max_s=0.5)
    assert _version(r.holder) == a

    async_store = r.watcher.store
    assert isinstance(async_store, AsyncRedisStore)
    await async_store.ping()
    redis_server.stop()
    await r.holder.wait_for(lambda h: h.store_error is not None, WAIT_S)
    with pytest.raises(StoreUnavailable):
        await async_store.ping()
    assert _version(r.holder) == a and r.holder.ready()  # keeps serving
    assert r.holder.status()[KB]["store_reachable"] is False

    redis_server.start()  # same port, empty: republish
    for name in "AB":
        store.put(artifacts[name])
    store.promote(KB, a)
    b = artifacts["B"].version
    store.promote(KB, b)
    await r.wait_version(b)
    await r.holder.wait_for(lambda h: h.store_error is None, WAIT_S)
    assert r.holder.status()[KB]["store_reachable"] is True


@pytest.mark.parametrize(
    "fields",
    [{"kb": KB, "version": "x", "ts": "now"}, {"version": "x", "ts": "1"}],
    ids=["time_not_a_number", "no_kb_field"],
)
async def test_a_foreign_event_entry_does_not_stop_event_driven_swaps(
    fields: dict[str, str],
    redis_stores: Stores,
    artifacts: dict[str, Artifact],
    run_watcher: Callable[..., Any],
) -> None:
    # An entry written to the KB's event stream by hand (or by another tool) used to be
    # read again on every pass (a bad time) or to set the cursor of KB '' (no kb field),
    # so that later promotions landed only through the poll, 30 s here.
    a, b = redis_stores.sync.put(artifacts["A"]), redis_stores.sync.put(artifacts["B"])
    sync = redis_stores.sync
    assert isinstance(sync, RedisStore)
    sync.promote(KB, a)
    r: Running = await run_watcher(redis_stores)
    sync.client.xadd(sync.keys.events(KB), fields)  # type: ignore[arg-type]
    sync.promote(KB, b)
    await r.wait_version(b)
    events = sync.events(KB)
    assert [e.kb for e in events] == [KB] * len(events)  # the stream's KB, not the field's


async def test_a_running_worker_is_not_moved_back_by_a_replayed_pointer(
    redis_server: EmbeddedRedis, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    """A writer without the key copies back the pointer and seal of an earlier move: the
    running worker stays on the newer model; a key holder re-seals what should serve."""
    signer = RedisStore(redis_server.url, prefix="hs", hmac_key=b"secret")
    a, b = signer.put(artifacts["A"]), signer.put(artifacts["B"])
    signer.promote(KB, a)
    keys = (signer.keys.active(KB), signer.keys.seal(KB))
    earlier = [signer.client.get(k) for k in keys]
    signer.promote(KB, b)
    stores = Stores(
        signer, lambda: AsyncRedisStore(redis_server.url, prefix="hs", hmac_key=b"secret")
    )
    r: Running = await run_watcher(stores)
    assert _version(r.holder) == b
    for k, v in zip(keys, earlier, strict=True):
        signer.client.set(k, v)
    signer.client.xadd(signer.keys.events(KB), {"kb": KB, "version": a, "action": "promote"})
    await r.wait_failures(1)
    assert _version(r.holder) == b
    assert "replayed" in r.holder.status()[KB]["last_error"]
    signer.promote(KB, a)  # a key holder does want A: a newer seal for it
    await r.wait_version(a)
    signer.close()


async def test_a_worker_with_a_read_only_redis_user_follows_sealed_moves(
    redis_server: EmbeddedRedis, artifacts: dict[str, Artifact], run_watcher: Callable[..., Any]
) -> None:
    """Workers only read the store: an ACL user with read commands alone (no scripts, no
    writes) loads, checks seals and swaps."""
    signer = RedisStore(redis_server.url, prefix="hs", hmac_key=b"secret")
    signer.client.execute_command(
        "ACL", "SETUSER", "worker", "on", ">worker-pw", "~*", "+@read", "+@connection"
    )
    a, b = signer.put(artifacts["A"]), signer.put(artifacts["B"])
    signer.promote(KB, a)
    host = redis_server.url.split("://", 1)[1]
    ro_url = f"redis://worker@{host}"
    stores = Stores(
        signer,
        lambda: AsyncRedisStore(ro_url, prefix="hs", hmac_key=b"secret", password="worker-pw"),
    )
    r: Running = await run_watcher(stores)
    assert _version(r.holder) == a
    signer.promote(KB, b)
    await r.wait_version(b)
    assert r.holder.status()[KB]["load_failures"] == 0
    signer.client.execute_command("ACL", "DELUSER", "worker")
    signer.close()
