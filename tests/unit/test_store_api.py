"""The model store's public surface and its pure helpers."""

from __future__ import annotations

import numpy as np
import pytest

import model_store
from model_store import (
    AsyncDirectoryStore,
    AsyncModelStore,
    AsyncRedisStore,
    DirectoryStore,
    InvalidName,
    ModelStore,
    ModelStoreError,
    RedisStore,
    StoreMisconfigured,
    StoreUnavailable,
    build_artifact,
)
from model_store._redis_common import Keys, safe_url, split_chunks
from model_store._store import check_kb, check_version, verified_artifact


def test_public_names_are_pinned() -> None:
    assert model_store.__all__ == [
        "SCHEMA_VERSION",
        "ActivePointer",
        "Artifact",
        "ArtifactCorrupt",
        "ArtifactNotFound",
        "ArtifactRejected",
        "AsyncDirectoryStore",
        "AsyncModelStore",
        "AsyncRedisStore",
        "DirectoryStore",
        "IncompatibleArtifact",
        "InvalidName",
        "ModelStore",
        "ModelStoreError",
        "PointerUnsealed",
        "RedisStore",
        "SignatureInvalid",
        "StoreAccessDenied",
        "StoreEvent",
        "StoreMisconfigured",
        "StoreUnavailable",
        "VersionInfo",
        "build_artifact",
        "check_kb",
        "content_digest",
        "decode",
        "encode",
        "load_dir",
        "safe_url",
        "save_dir",
        "verify_manifest",
    ]


def test_stores_satisfy_their_protocols(tmp_path) -> None:
    # Constructing a Redis client does not connect.
    assert isinstance(RedisStore("redis://127.0.0.1:1/0"), ModelStore)
    assert isinstance(DirectoryStore(tmp_path), ModelStore)
    assert isinstance(AsyncRedisStore("redis://127.0.0.1:1/0"), AsyncModelStore)
    assert isinstance(AsyncDirectoryStore(DirectoryStore(tmp_path)), AsyncModelStore)


def test_unreachable_redis_is_store_unavailable() -> None:
    from sidecar.local import free_port

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.5)
    with pytest.raises(StoreUnavailable) as info:
        store.kbs()
    assert info.value.retryable


@pytest.mark.parametrize("bad", ["", "a b", "../x", "x/y", "-lead", "a" * 200, "é"])
def test_bad_kb_names(bad: str) -> None:
    with pytest.raises(InvalidName):
        check_kb(bad)
    assert issubclass(InvalidName, ModelStoreError) and issubclass(InvalidName, ValueError)


def test_good_names() -> None:
    assert check_kb("support-docs_v2.en") == "support-docs_v2.en"
    assert check_version("0123456789abcdef") == "0123456789abcdef"
    with pytest.raises(InvalidName):
        check_version("0123456789ABCDEF")


def test_split_chunks_roundtrip_and_sizes() -> None:
    data = bytes(range(256)) * 41
    parts = split_chunks(data, 1000)
    assert b"".join(parts) == data
    assert all(len(p) <= 1000 for p in parts) and len(parts) == 11
    assert split_chunks(b"", 1000) == [b""]


def test_keys_and_safe_url() -> None:
    k = Keys("p")
    assert k.chunk("kb", "v", 3) == "p:kb:kb:v:v:chunk:3"
    assert k.kb_from_events_key(k.events("my.kb")) == "my.kb"
    assert safe_url("redis://:hunter2@host:6379/0") == "redis://***@host:6379/0"
    assert safe_url("redis://host:6379/0") == "redis://host:6379/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # redis-py takes the password up to the last '@'; so must the mask.
        ("redis://:p@ss@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
        ("redis://user:s3cret@host/2", "redis://***@host/2"),
        # Every query parameter becomes a client argument, password included.
        ("redis://host:6379/0?password=s3cret", "redis://host:6379/0?password=***"),
        (
            "rediss://host/0?ssl_password=s3cret&db=1&Password=s3cret",
            "rediss://host/0?ssl_password=***&db=1&Password=***",
        ),
        ("redis://host/0?pass%77ord=s3cret", "redis://host/0?pass%77ord=***"),
        # An unencoded '#' or '/' in a password moves urllib's idea of the host.
        ("redis://:s3#cret@host:1/0", "redis://***@host:1/0"),
        ("redis://:s3/cret@host:1/0", "redis://***@host:1/0"),
        ("redis://host/0?password=s3#cret", "redis://host/0?password=***"),
        ("unix://:s3cret@/run/redis.sock?db=0", "unix://***@/run/redis.sock?db=0"),
        ("s3cret@host", "***@host"),
        # Keys and tokens in a query string (an LLM endpoint's ?api_key=, a signed URL).
        ("http://h/v1?api_key=s3cret&model=m", "http://h/v1?api_key=***&model=m"),
        ("http://h/v1?token=s3cret&sig=s3cret", "http://h/v1?token=***&sig=***"),
    ],
)
def test_safe_url_hides_every_password(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert "s3cret" not in safe_url(url) and "ss@" not in safe_url(url)


@pytest.mark.parametrize("store_cls", [RedisStore, AsyncRedisStore])
@pytest.mark.parametrize(
    "url",
    [
        "http://:s3cret@host/0",
        "redis://:s3#cret@host/0",
        "redis://:s3cret@host/0?db=x",
        # redis-py takes these, as localhost, database 0 and database 12
        "redis://:s3cret@",
        "redis://:s3cret@/0",
        "redis://:s3cret@host/abc",
        "redis://:s3cret@host/1/2",
        "redis://:1234/s3cret@host:6379/0",  # redis-py: localhost, port 1234
        "unix://:s3cret@",
    ],
)
def test_unusable_redis_url_is_misconfigured(store_cls: type, url: str) -> None:
    with pytest.raises(StoreMisconfigured) as info:
        store_cls(url)
    assert not info.value.retryable and isinstance(info.value, ValueError)
    assert "invalid Redis URL" in str(info.value) and "s3cret" not in str(info.value)
    # Not chained: redis-py's own message may quote the password.
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://:s3cret@", "names no host"),
        ("redis://h:6379/abc", "database that is not a number"),
        ("unix://", "names no socket path"),
    ],
)
def test_a_redis_url_read_as_another_server_says_why(url: str, why: str) -> None:
    with pytest.raises(StoreMisconfigured, match=why):
        RedisStore(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h",
        "rediss://h:6380/",
        "redis://[::1]:6379/15",
        "redis://h:6379/0/",
        "redis://app@h/0",
        "redis://:p%2Fw@h/0",
        "redis://h/0?db=1",
    ],
)
def test_redis_urls_that_name_a_host_and_database_are_taken(url: str) -> None:
    RedisStore(url).close()


def test_verified_artifact_checks_size_sha_and_version() -> None:
    from model_store import ArtifactCorrupt, encode

    art = build_artifact(
        kb="kb", encoder={"name": "e", "dim": 2}, model={"kind": "x"}, arrays={"a": np.ones(3)}
    )
    manifest, data = encode(art)
    import hashlib

    meta = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    kw = {"hmac_key": None, "expected_encoder": None}
    assert verified_artifact("kb", art.version, manifest, data, meta, **kw).version == art.version
    with pytest.raises(ArtifactCorrupt, match="bytes"):
        verified_artifact("kb", art.version, manifest, data[:-1], meta, **kw)
    with pytest.raises(ArtifactCorrupt, match="checksum"):
        verified_artifact("kb", art.version, manifest, data, {**meta, "sha256": "0"}, **kw)
    with pytest.raises(ArtifactCorrupt, match="hashes to"):
        verified_artifact("kb", "0" * 16, manifest, data, meta, **kw)
    with pytest.raises(ArtifactCorrupt, match="hashes to"):
        verified_artifact("other", art.version, manifest, data, meta, **kw)


def _stored(tmp_path) -> tuple[DirectoryStore, str, object]:
    store = DirectoryStore(tmp_path / "store")
    art = build_artifact(
        kb="kb", encoder={"name": "e", "dim": 2}, model={"kind": "x"}, arrays={"a": np.ones(3)}
    )
    return store, store.put(art), art


def test_directory_store_reads_no_more_than_an_artifact_can_hold(tmp_path) -> None:
    import os

    from model_store import ArtifactCorrupt, load_dir, save_dir

    store, version, art = _stored(tmp_path)
    arrays = tmp_path / "store" / "kb" / "versions" / version / "arrays.npz"
    with open(arrays, "r+b") as f:  # sparse: 1 GiB on paper, nothing on disk
        f.truncate(1 << 30)
    with pytest.raises(ArtifactCorrupt, match="at most"):
        store.get("kb", version)  # refused before it is read, not after
    arrays.unlink()
    os.mkfifo(arrays)  # a FIFO never ends: it must not be read at all
    with pytest.raises(ArtifactCorrupt, match="not a regular file"):
        store.get("kb", version)
    exported = save_dir(art, tmp_path / "export")
    (exported / "arrays.npz").unlink()
    (exported / "arrays.npz").symlink_to("/dev/zero")
    with pytest.raises(ArtifactCorrupt, match="not a regular file"):
        load_dir(exported)
    folder = save_dir(art, tmp_path / "folder")  # named, not "Is a directory: 3"
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").mkdir()
    with pytest.raises(ArtifactCorrupt, match=r"manifest\.json is a directory$"):
        load_dir(folder)
    linked = save_dir(art, tmp_path / "linked")  # a link to a regular file is followed
    (linked / "arrays.npz").rename(tmp_path / "elsewhere.npz")
    (linked / "arrays.npz").symlink_to(tmp_path / "elsewhere.npz")
    assert load_dir(linked).version == version


def test_directory_events_skip_lines_that_are_not_events(tmp_path) -> None:
    store, version, _ = _stored(tmp_path)
    store.promote("kb", version)
    log = tmp_path / "store" / "kb" / "events.jsonl"
    with open(log, "ab") as f:
        f.write(b'{"id": 7}\n[]\n{"id": "x", "version": 1, "action": "a", "ts": 0}\n')
        f.write(b'{"id": 9, "kb": "kb", "vers')  # torn by a crash: no newline
    assert [e.id for e in store.events("kb")] == ["1"]
    second = store.put(
        build_artifact(
            kb="kb", encoder={"name": "e", "dim": 2}, model={"kind": "y"}, arrays={"a": np.ones(3)}
        )
    )
    event = store.promote("kb", second)
    assert event is not None  # the new event gets a line of its own, after the torn one
    assert [(e.id, e.version) for e in store.events("kb")] == [("1", version), ("2", second)]


async def test_directory_watch_reads_the_event_log_only_when_it_changed(tmp_path) -> None:
    store, version, _ = _stored(tmp_path)
    reads: list[str] = []
    real = store.events

    def counted(kb: str, after: str | None = None):  # type: ignore[no-untyped-def]
        reads.append(kb)
        return real(kb, after)

    store.events = counted  # type: ignore[method-assign]
    watcher = AsyncDirectoryStore(store, event_poll_s=0.01)
    assert await watcher.wait_events({"kb": "0"}, 0.1) == []
    assert len(reads) == 1  # ten polls, one read: the log did not change
    store.promote("kb", version)
    (event,) = await watcher.wait_events({"kb": "0"}, 1.0)
    assert event.version == version and len(reads) == 2
    # the same cursor again finds the same event, as a Redis stream gives it again
    assert [e.id for e in await watcher.wait_events({"kb": "0"}, 0.1)] == [event.id]

    # a read that failed marks nothing: the retry reads the log
    def failing(kb: str, after: str | None = None):  # type: ignore[no-untyped-def]
        raise OSError(5, "Input/output error")

    store.events = failing  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await watcher.wait_events({"kb": event.id}, 0.1)
    store.events = counted  # type: ignore[method-assign]
    before = len(reads)
    assert await watcher.wait_events({"kb": event.id}, 0.05) == []
    assert len(reads) > before


def test_directory_gc_sweeps_what_an_interrupted_put_left(tmp_path) -> None:
    import os
    import time

    store, _, _ = _stored(tmp_path)
    versions = tmp_path / "store" / "kb" / "versions"
    stale, fresh = versions / ".tmp-0123.abc", versions / ".tmp-4567.def"
    for d in (stale, fresh):
        d.mkdir()
        (d / "arrays.npz").write_bytes(b"half")
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    assert store.gc("kb") == []  # no version to delete, but the leftover goes
    assert not stale.exists() and fresh.exists()


def test_directory_sweep_reaches_a_kb_whose_first_put_was_killed(tmp_path) -> None:
    import os
    import time

    store, _, _ = _stored(tmp_path)
    versions = tmp_path / "store" / "new-kb" / "versions"
    stale = versions / ".tmp-89ab.cde"
    stale.mkdir(parents=True)
    (stale / "arrays.npz").write_bytes(b"half")
    hours_ago = time.time() - 7200
    os.utime(stale, (hours_ago, hours_ago))
    (tmp_path / "store" / "not a kb").mkdir()  # a folder this store did not make
    assert store.kbs() == ["kb"]  # listed nowhere...
    assert store.sweep() == 1 and not stale.exists()  # ...but swept
    assert store.sweep() == 0


def test_a_directory_put_that_fails_leaves_no_kb_and_no_half_version(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from model_store import _directory

    store, version, _ = _stored(tmp_path)
    writes = []

    def disk_full(path, data: bytes) -> None:  # type: ignore[no-untyped-def]
        writes.append(path)
        if len(writes) == 2:  # the arrays are on disk, the manifest is not
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    real = _directory.write_synced
    monkeypatch.setattr(_directory, "write_synced", disk_full)
    other = build_artifact(
        kb="other", encoder={"name": "e", "dim": 2}, model={"kind": "x"}, arrays={"a": np.ones(3)}
    )
    with pytest.raises(OSError, match="No space left"):
        store.put(other)
    assert len(writes) == 2
    # Nothing of the failed put is listed or left on disk; the stored KB is untouched.
    assert store.kbs() == ["kb"] and store.versions("other") == []
    assert list((tmp_path / "store" / "other" / "versions").iterdir()) == []
    assert store.versions("kb") == [version]


def test_directory_commands_on_an_unknown_kb_leave_no_folder(tmp_path) -> None:
    from model_store import ArtifactNotFound

    store = DirectoryStore(tmp_path / "store")
    with pytest.raises(ArtifactNotFound, match="no previous version"):
        store.rollback("ghost")
    with pytest.raises(ArtifactNotFound, match="no version"):
        store.promote("ghost", "0123456789abcdef")
    assert store.gc("ghost") == []
    assert list((tmp_path / "store").iterdir()) == []
