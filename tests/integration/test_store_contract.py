"""The store contract, run against both stores: Redis (a real redis-server) and a directory."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_store import (
    ActivePointer,
    Artifact,
    ArtifactCorrupt,
    ArtifactNotFound,
    AsyncDirectoryStore,
    AsyncRedisStore,
    DirectoryStore,
    IncompatibleArtifact,
    InvalidName,
    ModelStore,
    PointerUnsealed,
    RedisStore,
    SignatureInvalid,
    build_artifact,
    content_digest,
)
from sidecar.local import EmbeddedRedis

pytestmark = pytest.mark.integration

ENC = {"name": "test-encoder", "dim": 8}
KB = "kb1"

StoreFactory = Callable[..., ModelStore]


def make_artifact(seed: int = 0, *, kb: str = KB, n: int = 16, dim: int = 8) -> Artifact:
    rng = np.random.default_rng(seed)
    return build_artifact(
        kb=kb,
        encoder=ENC,
        model={"kind": "test", "seed": seed},
        arrays={"w": rng.standard_normal((n, dim)).astype(np.float32), "b": np.arange(3)},
        metrics={"auroc": 0.5 + seed / 100},
    )


@pytest.fixture(params=["redis", "directory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[StoreFactory]:
    """Build stores over the same backing data (each call is a separate client)."""
    opened: list[ModelStore] = []
    server: EmbeddedRedis | None = (
        request.getfixturevalue("redis_server") if backend == "redis" else None
    )

    def factory(**kw: Any) -> ModelStore:
        store: ModelStore
        if server is not None:
            store = RedisStore(server.url, prefix="t", **kw)
        else:
            kw.pop("chunk_bytes", None)
            store = DirectoryStore(tmp_path / "store", **kw)
        opened.append(store)
        return store

    yield factory
    for s in opened:
        s.close()


def corrupt_arrays(store: ModelStore, kb: str, version: str) -> None:
    """Flip one byte of the stored arrays, as a disk or a rogue writer would."""
    if isinstance(store, RedisStore):
        key = store.keys.chunk(kb, version, 0)
        data = bytearray(store.client.get(key) or b"")
        data[len(data) // 2] ^= 0xFF
        store.client.set(key, bytes(data))
    else:
        assert isinstance(store, DirectoryStore)
        path = store.root / kb / "versions" / version / "arrays.npz"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


def rewrite_manifest(
    store: ModelStore, kb: str, version: str, change: Callable[[dict], None]
) -> None:
    if isinstance(store, RedisStore):
        key = store.keys.manifest(kb, version)
        manifest = json.loads(store.client.get(key) or b"{}")
        change(manifest)
        store.client.set(key, json.dumps(manifest).encode())
    else:
        assert isinstance(store, DirectoryStore)
        path = store.root / kb / "versions" / version / "manifest.json"
        manifest = json.loads(path.read_bytes())
        change(manifest)
        path.write_text(json.dumps(manifest))


def test_put_get_roundtrip_and_listing(make_store: StoreFactory) -> None:
    store = make_store()
    art = make_artifact(1)
    version = store.put(art)
    assert version == art.version
    got = store.get(KB, version, expected_encoder=ENC)
    assert got.version == version
    np.testing.assert_array_equal(got.arrays["w"], art.arrays["w"])
    np.testing.assert_array_equal(got.arrays["b"], art.arrays["b"])
    assert store.versions(KB) == [version]
    assert store.kbs() == [KB]
    assert store.manifest(KB, version)["metrics"] == {"auroc": 0.51}
    assert store.info(KB, version).size_bytes > 0
    assert store.active(KB) is None and store.previous(KB) is None and store.history(KB) == []


def test_put_is_idempotent(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.put(make_artifact(1)) == store.put(make_artifact(1))
    store.put(make_artifact(2))
    assert len(store.versions(KB)) == 2


def test_versions_are_listed_oldest_first(make_store: StoreFactory) -> None:
    store = make_store()
    versions = [store.put(make_artifact(s)) for s in range(4)]
    assert store.versions(KB) == versions


def test_chunked_artifact_roundtrip(make_store: StoreFactory) -> None:
    store = make_store(chunk_bytes=1024)  # the smallest chunks a Redis store writes
    art = make_artifact(3, n=200)  # 6.4 kB of floats: several chunks in Redis
    version = store.put(art)
    if isinstance(store, RedisStore):
        assert int(store.client.hget(store.keys.meta(KB, version), "chunks") or 0) > 3
    np.testing.assert_array_equal(store.get(KB, version).arrays["w"], art.arrays["w"])


def test_missing_things_are_not_found(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(ArtifactNotFound):
        store.get(KB, "0" * 16)
    with pytest.raises(ArtifactNotFound):
        store.promote(KB, "0" * 16)
    with pytest.raises(ArtifactNotFound):
        store.rollback(KB)
    assert store.versions("nope") == [] and store.active("nope") is None


def test_bad_names_are_refused(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(InvalidName):
        store.active("../etc")
    with pytest.raises(InvalidName):
        store.get(KB, "not-a-version")
    with pytest.raises(InvalidName):
        store.put(make_artifact(kb="a b"))


def test_promote_rollback_history_and_event_order(make_store: StoreFactory) -> None:
    store = make_store()
    a, b, c = (store.put(make_artifact(s)) for s in (1, 2, 3))
    e1 = store.promote(KB, a)
    assert e1 is not None and e1.previous is None and e1.action == "promote"
    store.promote(KB, b)
    store.promote(KB, c)
    assert store.promote(KB, c) is None  # already active: no event
    assert store.active(KB) == c and store.previous(KB) == b
    assert store.history(KB) == [c, b, a]

    back = store.rollback(KB)
    assert (back.version, back.previous, back.action) == (b, c, "rollback")
    assert store.active(KB) == b and store.previous(KB) == a
    store.rollback(KB)
    assert store.active(KB) == a
    with pytest.raises(ArtifactNotFound):
        store.rollback(KB)  # nothing before a

    events = store.events(KB)
    assert [(e.action, e.version, e.previous) for e in events] == [
        ("promote", a, None),
        ("promote", b, a),
        ("promote", c, b),
        ("rollback", b, c),
        ("rollback", a, b),
    ]
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert store.events(KB, after=events[2].id) == events[3:]
    assert store.events(KB, after=events[-1].id) == []


def test_gc_keeps_retention_active_and_previous(make_store: StoreFactory) -> None:
    store = make_store(retention=2)
    v = [store.put(make_artifact(s)) for s in range(6)]
    store.promote(KB, v[0])
    store.promote(KB, v[1])  # active v1, previous v0: both oldest, both kept
    deleted = store.gc(KB)
    assert sorted(deleted) == sorted(v[2:4])
    assert store.versions(KB) == [v[0], v[1], v[4], v[5]]
    with pytest.raises(ArtifactNotFound):
        store.get(KB, v[2])
    assert store.rollback(KB).version == v[0]  # the previous version survived
    # v1 was rolled away from: neither active nor previous, and beyond retention.
    assert store.gc(KB) == [v[1]]
    assert store.versions(KB) == [v[0], v[4], v[5]]
    if isinstance(store, RedisStore):  # no orphaned data keys left behind
        assert not list(store.client.scan_iter(f"t:kb:{KB}:v:{v[2]}:*"))


def test_gc_and_a_put_of_the_same_content_leave_a_whole_version(
    redis_server: EmbeddedRedis,
) -> None:
    # Another job publishes the very content gc is removing, just after gc unlisted it:
    # gc used to delete the data keys afterwards, leaving that put's version listed and
    # empty (every worker refused it). Unlisting and deleting are now one script.
    store = RedisStore(redis_server.url, prefix="t", retention=1)
    other = RedisStore(redis_server.url, prefix="t")
    old, new = make_artifact(1), make_artifact(2)
    v_old = store.put(old)
    store.promote(KB, store.put(new))
    store.promote(KB, store.put(make_artifact(3)))  # v_old: neither active nor previous
    real = store._unlist

    def unlist_then_republish(*a: Any, **kw: Any) -> Any:
        done = real(*a, **kw)
        other.put(old)  # sees v_old unlisted, so it writes and lists it again
        return done

    store._unlist = unlist_then_republish  # type: ignore[method-assign]
    try:
        assert store.gc(KB) == [v_old]
        assert v_old in store.versions(KB)  # listed again by the other job ...
        assert store.get(KB, v_old).version == v_old  # ... and whole
    finally:
        store.close()
        other.close()


def test_redis_gc_deletes_no_more_chunks_than_a_version_can_have(
    redis_server: EmbeddedRedis,
) -> None:
    # The meta hash is unsigned: a chunk count rewritten to 1e6 (or inf) made gc's script
    # loop that often inside Redis, where no client could be served and SCRIPT KILL fails.
    from model_store._store import MAX_CHUNKS

    store = RedisStore(redis_server.url, prefix="t", retention=0)
    try:
        version = store.put(make_artifact(1))
        store.client.hset(store.keys.meta(KB, version), "chunks", "1e6")
        store.client.config_resetstat()
        assert store.gc(KB) == [version]
        stats = store.client.info("commandstats")
        # DELs issued from the script count as DEL calls
        assert stats["cmdstat_del"]["calls"] <= MAX_CHUNKS + 2
        assert not list(store.client.scan_iter(f"t:kb:{KB}:v:{version}:*"))
    finally:
        store.close()


def test_corrupt_bytes_are_refused(make_store: StoreFactory) -> None:
    store = make_store()
    version = store.put(make_artifact(1))
    corrupt_arrays(store, KB, version)
    with pytest.raises(ArtifactCorrupt):
        store.get(KB, version)


def test_wrong_array_checksum_in_manifest_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    version = store.put(make_artifact(1))

    def tamper(m: dict) -> None:
        m["arrays"]["w"]["sha256"] = "0" * 64

    rewrite_manifest(store, KB, version, tamper)
    with pytest.raises(ArtifactCorrupt):
        store.get(KB, version)


def test_rewritten_manifest_no_longer_matches_its_version(make_store: StoreFactory) -> None:
    store = make_store()
    version = store.put(make_artifact(1))

    def tamper(m: dict) -> None:
        m["model"]["seed"] = 99  # a plausible edit: checksums still match the arrays

    def reseal(m: dict) -> None:
        m["content_sha256"] = content_digest(m)  # consistent again, but another version

    rewrite_manifest(store, KB, version, tamper)
    with pytest.raises(ArtifactCorrupt, match="content_sha256"):
        store.get(KB, version)
    rewrite_manifest(store, KB, version, reseal)
    with pytest.raises(ArtifactCorrupt, match="hashes to"):
        store.get(KB, version)


def test_wrong_schema_version_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    art = make_artifact(1)
    future = Artifact({**art.manifest, "schema_version": 99}, art.arrays)
    version = store.put(future)
    with pytest.raises(IncompatibleArtifact, match="schema"):
        store.get(KB, version)


def test_wrong_encoder_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    version = store.put(make_artifact(1))
    with pytest.raises(IncompatibleArtifact, match="encoder"):
        store.get(KB, version, expected_encoder={"name": "other", "dim": 8})
    with pytest.raises(IncompatibleArtifact):
        store.get(KB, version, expected_encoder={"name": ENC["name"], "dim": 16})


def test_hmac_signed_on_put_and_required_on_get(make_store: StoreFactory) -> None:
    signer = make_store(hmac_key=b"k1")
    signed = signer.put(make_artifact(1))
    assert signer.get(KB, signed).manifest["signature"]
    assert signed == make_artifact(1).version  # the signature does not change the version
    with pytest.raises(SignatureInvalid):
        make_store(hmac_key=b"other").get(KB, signed)

    intruder = make_store()  # a writer without the key
    unsigned = intruder.put(make_artifact(2))
    with pytest.raises(SignatureInvalid, match="unsigned"):
        signer.get(KB, unsigned)


@pytest.mark.parametrize("key", [None, b"k1"], ids=["unsigned", "sealed"])
def test_racing_promoters_leave_one_consistent_history(
    make_store: StoreFactory, key: bytes | None
) -> None:
    """With a key every promoter also seals: the seal that wins is the last move's."""
    setup = make_store(hmac_key=key)
    versions = [setup.put(make_artifact(s)) for s in range(4)]
    n_threads, rounds = 4, 25
    barrier = threading.Barrier(n_threads)
    results: list[list[Any]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []

    def promoter(i: int) -> None:
        store = make_store(hmac_key=key)  # its own connection / lock file handle
        try:
            barrier.wait()
            for r in range(rounds):
                results[i].append(store.promote(KB, versions[(i + r) % len(versions)]))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=promoter, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    made = [e for r in results for e in r if e is not None]
    events = setup.events(KB)
    # Every successful promote is exactly one event, and the events form one chain.
    assert sorted(e.id for e in made) == sorted(e.id for e in events)
    assert events[0].previous is None
    # With a key, promoting the active version seals it anew: an event that moves nothing.
    assert all(e.version == e.previous for e in events if e.action == "seal")
    moves = [e for e in events if e.action != "seal"]
    for before, after in itertools.pairwise(moves):
        assert after.previous == before.version
        assert after.version != before.version
    assert setup.active(KB) == events[-1].version
    history = setup.history(KB)
    assert history == [e.version for e in reversed(moves)][: len(history)]
    pointer = setup.active_pointer(KB)
    assert pointer is not None and pointer.version == events[-1].version
    assert (pointer.seq is None) == (key is None)


def write_history(store: ModelStore, kb: str, history: list[str]) -> None:
    """Overwrite the history stack, as an older release's gc could have left it."""
    if isinstance(store, RedisStore):
        key = store.keys.history(kb)
        store.client.delete(key)
        store.client.rpush(key, *history)
    else:
        assert isinstance(store, DirectoryStore)
        path = store.root / kb / "state.json"
        state = json.loads(path.read_bytes())
        path.write_text(json.dumps({**state, "history": history}))


def test_gc_collapses_the_duplicates_it_leaves_in_the_history(make_store: StoreFactory) -> None:
    store = make_store(retention=2)
    a, b, c = (store.put(make_artifact(s)) for s in (1, 2, 3))
    for v in (b, a, b, c):
        store.promote(KB, v)
    assert store.history(KB) == [c, b, a, b]
    assert store.gc(KB) == [a]  # the oldest, neither active nor previous
    # Without a, "b a b" would become "b b" and the second rollback would go b -> b.
    assert store.history(KB) == [c, b]
    assert (store.rollback(KB).previous, store.active(KB)) == (c, b)
    with pytest.raises(ArtifactNotFound):
        store.rollback(KB)
    assert store.active(KB) == b


def test_rollback_and_gc_skip_duplicates_already_in_the_history(
    make_store: StoreFactory,
) -> None:
    store = make_store(retention=1)
    a, b, c = (store.put(make_artifact(s)) for s in (1, 2, 3))
    store.promote(KB, a)
    store.promote(KB, c)
    write_history(store, KB, [c, c, a])  # a history as the old gc could leave it
    assert store.previous(KB) == a
    assert store.gc(KB) == [b]  # a is the real previous version: kept
    back = store.rollback(KB)
    assert (back.version, back.previous) == (a, c)
    assert store.active(KB) == a and store.history(KB) == [a]


def test_deflated_arrays_are_refused(make_store: StoreFactory) -> None:
    # The stored metadata (size, sha256) is unsigned: a writer who can rewrite the arrays
    # can rewrite it too, so only the check against the manifest may stop a zip bomb.
    store = make_store()
    art = make_artifact(1, n=4096)
    version = store.put(art)
    buf = io.BytesIO()
    np.savez_compressed(buf, w=art.arrays["w"], b=art.arrays["b"])
    data = buf.getvalue()
    size, sha256 = len(data), hashlib.sha256(data).hexdigest()
    if isinstance(store, RedisStore):
        store.client.set(store.keys.chunk(KB, version, 0), data)
        store.client.hset(
            store.keys.meta(KB, version), mapping={"size": size, "sha256": sha256, "chunks": 1}
        )
    else:
        assert isinstance(store, DirectoryStore)
        vdir = store.root / KB / "versions" / version
        (vdir / "arrays.npz").write_bytes(data)
        old = json.loads((vdir / "meta.json").read_bytes())
        (vdir / "meta.json").write_text(json.dumps({**old, "size": size, "sha256": sha256}))
    with pytest.raises(ArtifactCorrupt, match="compressed"):
        store.get(KB, version)


@pytest.mark.parametrize("meta", [{"size": "many"}, {"size": None}, {"size": 10**12}])
def test_rewritten_metadata_is_corrupt(make_store: StoreFactory, meta: dict[str, Any]) -> None:
    store = make_store()
    version = store.put(make_artifact(1))
    if isinstance(store, RedisStore):
        store.client.hset(store.keys.meta(KB, version), mapping={"size": str(meta["size"])})
    else:
        assert isinstance(store, DirectoryStore)
        path = store.root / KB / "versions" / version / "meta.json"
        path.write_text(json.dumps({**json.loads(path.read_bytes()), **meta}))
    with pytest.raises(ArtifactCorrupt):
        store.get(KB, version)
    if not isinstance(meta["size"], int):  # a listing needs the size to be a number
        with pytest.raises(ArtifactCorrupt):
            store.info(KB, version)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [(10**6, "cannot hold"), (0, "cannot hold"), ("x", "not a number"), ("half", "cannot hold")],
)
async def test_redis_chunk_count_must_fit_the_recorded_size(
    redis_server: EmbeddedRedis, chunks: object, message: str
) -> None:
    # Only Redis splits the arrays; an unbounded count would be one GET per chunk.
    store = RedisStore(redis_server.url, prefix="t")
    reader = AsyncRedisStore(redis_server.url, prefix="t")
    try:
        version = store.put(make_artifact(1))
        if chunks == "half":  # one chunk per 2 bytes: no writer makes chunks under 1 KiB
            chunks = int(store.client.hget(store.keys.meta(KB, version), "size") or 0) // 2
        store.client.hset(store.keys.meta(KB, version), "chunks", str(chunks))
        with pytest.raises(ArtifactCorrupt, match=message):
            store.get(KB, version)
        with pytest.raises(ArtifactCorrupt, match=message):
            await reader.get(KB, version)
    finally:
        await reader.close()
        store.close()


@pytest.fixture
async def redis_rw(redis_server: EmbeddedRedis) -> AsyncIterator[tuple[RedisStore, Any]]:
    """A Redis store to write with and the async reader a worker uses, same data."""
    store = RedisStore(redis_server.url, prefix="t")
    reader = AsyncRedisStore(redis_server.url, prefix="t")
    yield store, reader
    await reader.close()
    store.close()


async def test_a_redis_manifest_past_its_bound_is_not_fetched(
    redis_rw: tuple[RedisStore, Any],
) -> None:
    from model_store._artifact import MANIFEST_MAX_BYTES

    store, reader = redis_rw
    version = store.put(make_artifact(1))
    store.client.append(store.keys.manifest(KB, version), b" " * MANIFEST_MAX_BYTES)
    for get in (store.get, store.info):
        with pytest.raises(ArtifactCorrupt, match="at most"):
            get(KB, version)
    with pytest.raises(ArtifactCorrupt, match="at most"):
        await reader.get(KB, version)


async def test_redis_chunks_longer_than_recorded_are_not_fetched(
    redis_server: EmbeddedRedis,
) -> None:
    # Someone who can write Redis rewrites a chunk to many times its size: the readers
    # compare stored lengths (STRLEN) with the recorded size before any GET.
    store = RedisStore(redis_server.url, prefix="t")
    reader = AsyncRedisStore(redis_server.url, prefix="t")
    try:
        version = store.put(make_artifact(1))
        chunk = store.keys.chunk(KB, version, 0)
        store.client.append(chunk, b"\0" * 4_000_000)
        with pytest.raises(ArtifactCorrupt, match=r"chunks hold \d+ bytes"):
            store.get(KB, version)
        with pytest.raises(ArtifactCorrupt, match=r"chunks hold \d+ bytes"):
            await reader.get(KB, version)
        store.client.delete(chunk)
        with pytest.raises(ArtifactCorrupt, match="missing chunks"):
            await reader.get(KB, version)
    finally:
        await reader.close()
        store.close()


async def test_async_redis_previous_skips_duplicates(redis_server: EmbeddedRedis) -> None:
    store = RedisStore(redis_server.url, prefix="t")
    reader = AsyncRedisStore(redis_server.url, prefix="t")
    try:
        a, c = store.put(make_artifact(1)), store.put(make_artifact(3))
        store.promote(KB, a)
        store.promote(KB, c)
        write_history(store, KB, [c, c, a])
        assert await reader.previous(KB) == a  # where a rollback would go, not c again
    finally:
        await reader.close()
        store.close()


def pointer_state(store: ModelStore) -> Any:
    """The pointer as stored (version and seal), as a writer could copy it."""
    if isinstance(store, RedisStore):
        return [store.client.get(k) for k in (store.keys.active(KB), store.keys.seal(KB))]
    assert isinstance(store, DirectoryStore)
    return (store.root / KB / "state.json").read_bytes()


def put_pointer_state(store: ModelStore, state: Any) -> None:
    if isinstance(store, RedisStore):
        store.client.set(store.keys.active(KB), state[0])
        store.client.set(store.keys.seal(KB), state[1])
    else:
        assert isinstance(store, DirectoryStore)
        (store.root / KB / "state.json").write_bytes(state)


def break_seal(store: ModelStore) -> None:
    """Overwrite the pointer's seal with bytes that are not one (in Redis, not even text)."""
    if isinstance(store, RedisStore):
        store.client.set(store.keys.seal(KB), b"\xff{")
    else:
        state = json.loads(pointer_state(store))
        put_pointer_state(store, json.dumps({**state, "seal": "{"}).encode())


def _lonely_rollback(make_store: StoreFactory) -> None:
    """A keyed rollback of a KB with one version in its history."""
    signer = make_store(hmac_key=b"k1")
    signer.promote("kb2", signer.put(make_artifact(5, kb="kb2")))
    signer.rollback("kb2")


def test_a_signing_key_seals_every_pointer_move(make_store: StoreFactory) -> None:
    signer = make_store(hmac_key=b"k1")
    v1, v2 = signer.put(make_artifact(1)), signer.put(make_artifact(2))
    assert signer.active_pointer(KB) is None
    signer.promote(KB, v1)
    p1 = signer.active_pointer(KB)
    assert p1 is not None and p1.version == v1 and p1.seq is not None
    signer.promote(KB, v2)
    p2 = signer.active_pointer(KB)
    assert p2 is not None and p2.version == v2 and p2.seq is not None and p2.seq > p1.seq
    assert signer.rollback(KB).version == v1
    p3 = signer.active_pointer(KB)
    assert p3 is not None and p3.version == v1 and p3.seq is not None and p3.seq > p2.seq
    again = signer.promote(KB, v1)  # the active version: a newer seal, nothing moves
    assert again is not None and again.action == "seal" and signer.history(KB)[0] == v1
    p4 = signer.active_pointer(KB)
    assert p4 is not None and p4.version == v1 and p4.seq is not None and p4.seq > p3.seq
    with pytest.raises(ArtifactNotFound, match="no previous version"):
        _lonely_rollback(make_store)
    # Without a key the pointer is taken as it is; under another key the seal fails.
    assert make_store().active_pointer(KB) == ActivePointer(v1)
    with pytest.raises(PointerUnsealed, match="does not match the signing key"):
        make_store(hmac_key=b"other").active_pointer(KB)


def test_a_pointer_moved_without_the_key_is_refused_until_a_key_holder_seals_it(
    make_store: StoreFactory,
) -> None:
    signer, intruder = make_store(hmac_key=b"k1"), make_store()
    v1, v2 = signer.put(make_artifact(1)), signer.put(make_artifact(2))
    signer.promote(KB, v1)
    sealed = signer.active_pointer(KB)
    assert intruder.promote(KB, v2) is not None  # it can move the pointer ...
    assert signer.active(KB) == v2
    with pytest.raises(PointerUnsealed, match=f"names {v2} but its seal"):
        signer.active_pointer(KB)  # ... but not seal it
    break_seal(signer)
    with pytest.raises(PointerUnsealed, match="not JSON"):
        signer.active_pointer(KB)
    event = signer.promote(KB, v2)  # a key holder vouches for the version in service
    assert event is not None and event.action == "seal" and event.version == v2
    resealed = signer.active_pointer(KB)
    assert resealed is not None and resealed.version == v2
    assert sealed is not None and resealed.seq is not None and resealed.seq > sealed.seq  # type: ignore[operator]
    assert [e.action for e in signer.events(KB)][-1] == "seal"


async def test_a_running_reader_refuses_a_replayed_pointer(make_store: StoreFactory) -> None:
    """A pointer state copied back from before (a valid seal of an older move) does not
    move a reader that already accepted a newer one; a reader that starts afresh cannot
    tell, and gets a version a key holder once made active."""
    signer = make_store(hmac_key=b"k1")
    v1, v2 = signer.put(make_artifact(1)), signer.put(make_artifact(2))
    signer.promote(KB, v1)
    old = pointer_state(signer)
    signer.promote(KB, v2)

    def reader() -> Any:
        if isinstance(signer, RedisStore):
            return AsyncRedisStore(signer.url, prefix="t", hmac_key=b"k1")
        assert isinstance(signer, DirectoryStore)
        return AsyncDirectoryStore(DirectoryStore(signer.root, hmac_key=b"k1"))

    running, fresh = reader(), reader()
    try:
        now = await running.active_pointer(KB)
        assert now is not None and now.version == v2
        put_pointer_state(signer, old)
        with pytest.raises(PointerUnsealed, match="replayed"):
            await running.active_pointer(KB)
        replayed = await fresh.active_pointer(KB)
        assert replayed is not None and replayed.version == v1
    finally:
        await running.close()
        await fresh.close()


def test_a_key_holder_reseals_whatever_a_writer_without_the_key_left_in_the_seal(
    make_store: StoreFactory,
) -> None:
    """A seal of another type, not text, or huge: readers refuse it without a crash and
    a key holder's next move replaces it."""
    signer = make_store(hmac_key=b"k1")
    v1 = signer.put(make_artifact(1))
    signer.promote(KB, v1)
    if isinstance(signer, RedisStore):
        seal_key = signer.keys.seal(KB)
        for bad in ("hash", b"\xff\xfe" * 10, b"[" * 3000, b"x" * 100_000):
            signer.client.delete(seal_key)
            if bad == "hash":
                signer.client.hset(seal_key, "a", "b")
            else:
                signer.client.set(seal_key, bad)
            with pytest.raises(PointerUnsealed):
                signer.active_pointer(KB)
            assert signer.promote(KB, v1) is not None
            assert signer.active_pointer(KB) is not None
        signer.client.set(signer.keys.active(KB), b"\xff" * 16)  # not even text
        with pytest.raises(PointerUnsealed):
            signer.active_pointer(KB)
        signer.promote(KB, v1)
    else:
        assert isinstance(signer, DirectoryStore)
        for bad in (5, {"kb": KB}, "[" * 3000):
            state = json.loads(pointer_state(signer))
            put_pointer_state(signer, json.dumps({**state, "seal": bad}).encode())
            with pytest.raises(PointerUnsealed):
                signer.active_pointer(KB)
            assert signer.promote(KB, v1) is not None
    pointer = signer.active_pointer(KB)
    assert pointer is not None and pointer.version == v1


def test_a_move_without_the_key_does_not_reset_the_sequence(make_store: StoreFactory) -> None:
    """The last key holder's seal still counts after a move without the key: a key holder
    whose clock is behind the one before it still seals past it, so running workers take
    its move."""
    from model_store._seal import make_seal

    signer, intruder = make_store(hmac_key=b"k1"), make_store()
    v1, v2, v3 = (signer.put(make_artifact(i)) for i in (1, 2, 3))
    signer.promote(KB, v1)
    ahead = time_us() + 10**10  # sealed by a writer whose clock ran hours ahead
    if isinstance(signer, RedisStore):
        signer.client.set(signer.keys.seal(KB), make_seal(b"k1", KB, v1, ahead))
    else:
        state = json.loads(pointer_state(signer))
        put_pointer_state(
            signer, json.dumps({**state, "seal": make_seal(b"k1", KB, v1, ahead)}).encode()
        )
    intruder.promote(KB, v2)
    signer.promote(KB, v3)
    pointer = signer.active_pointer(KB)
    assert pointer is not None and pointer.version == v3 and pointer.seq == ahead + 1


def time_us() -> int:
    import time

    return time.time_ns() // 1000


def test_redis_writers_that_race_for_the_seal_sign_again(redis_server: EmbeddedRedis) -> None:
    """The promote script applies a seal only over the one its writer read (by hash)."""
    store = RedisStore(redis_server.url, prefix="t", hmac_key=b"k1")
    v1 = store.put(make_artifact(1))
    reply = store._promote(
        keys=store.keys.pointer_keys(KB),
        args=[v1, "0", KB, 100, 100, "1", "not the hash of the seal", "x"],
    )
    assert reply == [b"raced"]
    assert store.active(KB) is None
    store.promote(KB, v1)  # reads the seal's hash afresh
    assert store.active_pointer(KB) is not None
    store.close()


def test_what_a_writer_without_the_key_leaves_in_the_pointer_is_refused_briefly(
    make_store: StoreFactory,
) -> None:
    """A pointer that is no version id (megabytes, not text, another type) is refused with
    a short message, and a key holder's move replaces it."""
    signer = make_store(hmac_key=b"k1")
    v1 = signer.put(make_artifact(1))
    signer.promote(KB, v1)
    if isinstance(signer, RedisStore):
        signer.client.set(signer.keys.active(KB), b"\xff" * 2_000_000)
        assert len(signer.active(KB) or "") <= 64  # a listing reads no more
    else:
        state = json.loads(pointer_state(signer))
        put_pointer_state(signer, json.dumps({**state, "active": "f" * 2_000_000}).encode())
    with pytest.raises(ArtifactCorrupt, match="no version id") as refused:
        signer.active_pointer(KB)
    assert len(str(refused.value)) < 200
    assert signer.promote(KB, v1) is not None
    pointer = signer.active_pointer(KB)
    assert pointer is not None and pointer.version == v1


def test_a_directory_state_that_is_not_a_store_state_is_corrupt(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store", hmac_key=b"k1")
    store.promote(KB, store.put(make_artifact(1)))
    state_file = tmp_path / "store" / KB / "state.json"
    for bad in ("[" * 100_000, json.dumps({"active": None, "history": [], "seq": "7"})):
        state_file.write_text(bad)
        with pytest.raises(ArtifactCorrupt, match=r"state\.json"):
            store.active_pointer(KB)


def test_a_redis_move_writes_nothing_when_a_key_it_appends_to_has_another_type(
    redis_server: EmbeddedRedis,
) -> None:
    store = RedisStore(redis_server.url, prefix="t", hmac_key=b"k1")
    v1, v2 = store.put(make_artifact(1)), store.put(make_artifact(2))
    store.promote(KB, v1)
    store.client.delete(store.keys.events(KB))
    store.client.set(store.keys.events(KB), "not a stream")
    before = pointer_state(store)
    with pytest.raises(ArtifactCorrupt, match="another Redis type"):
        store.promote(KB, v2)
    assert pointer_state(store) == before and store.history(KB) == [v1]
    store.client.rpush(store.keys.history(KB), b"\xff\xfe")  # and not text: still listed
    assert store.history(KB)[0] == v1
    store.close()
