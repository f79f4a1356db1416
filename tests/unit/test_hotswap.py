"""ModelHolder and ModelWatcher with small fakes of the project's own protocols."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import sidecar.hotswap as hotswap
from model_store import (
    ActivePointer,
    Artifact,
    ArtifactNotFound,
    ModelStoreError,
    PointerUnsealed,
    StoreEvent,
    StoreUnavailable,
    build_artifact,
)
from sidecar.errors import EncoderMismatch
from sidecar.hotswap import LoadedModel, ModelHolder, ModelWatcher
from sidecar.persistence import warm_up

ENC = {"name": "fake", "dim": 4}


class FakeModel:
    def __init__(self, artifact: Artifact) -> None:
        self.version = artifact.version
        self.encoder = artifact.encoder
        self.fail = bool(artifact.model.get("fail"))
        self.threshold = float(artifact.model.get("threshold", 0.0))

    def score(self, E: np.ndarray) -> np.ndarray:
        if self.fail:
            raise RuntimeError("broken model")
        return np.zeros(len(E))

    def predict(self, E: np.ndarray) -> np.ndarray:
        return self.score(E) > 0

    def check_encoder(self, name: str, dim: int, probes: np.ndarray | None = None) -> None:
        if (name, dim) != (self.encoder["name"], self.encoder["dim"]):
            raise EncoderMismatch(f"{name}/{dim}")


def artifact(seed: int, **model: Any) -> Artifact:
    return build_artifact(
        kb="kb", encoder=ENC, model={"seed": seed, **model}, arrays={"w": np.zeros(2)}
    )


class FakeStore:
    """In-memory AsyncModelStore; ``down`` makes every call raise StoreUnavailable."""

    def __init__(self) -> None:
        self.artifacts: dict[str, Artifact] = {}
        self.pointer: dict[str, str] = {}
        self.log: list[StoreEvent] = []
        self.down = False
        self.refusing: Exception | None = None  # raised by every call while set
        self.unsealed: PointerUnsealed | None = None  # raised by active_pointer while set
        self.gets = 0
        self._new = asyncio.Event()

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("fake store is down")
        if self.refusing is not None:
            raise self.refusing

    def promote(self, art: Artifact) -> None:
        self.artifacts[art.version] = art
        prev = self.pointer.get("kb")
        self.pointer["kb"] = art.version
        self.log.append(StoreEvent(str(len(self.log) + 1), "kb", art.version, prev, "promote", 0))
        self._new.set()

    async def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        self._check()
        self.gets += 1
        if version not in self.artifacts:
            raise ArtifactNotFound(version)
        return self.artifacts[version]

    async def active(self, kb: str) -> str | None:
        self._check()
        return self.pointer.get(kb)

    async def active_pointer(self, kb: str) -> ActivePointer | None:
        self._check()
        if self.unsealed is not None:
            raise self.unsealed
        version = await self.active(kb)
        return ActivePointer(version) if version is not None else None

    async def previous(self, kb: str) -> str | None:
        return None

    async def last_event_id(self, kb: str) -> str:
        self._check()
        return self.log[-1].id if self.log else "0"

    async def wait_events(self, after: Mapping[str, str], timeout_s: float) -> Sequence[StoreEvent]:
        self._check()
        new = [e for e in self.log if int(e.id) > int(after.get(e.kb, "0"))]
        if not new:
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), timeout_s)
            except TimeoutError:
                return []
            self._check()
            new = [e for e in self.log if int(e.id) > int(after.get(e.kb, "0"))]
        return new

    async def close(self) -> None:
        pass


def watcher(store: FakeStore, holder: ModelHolder, **kw: Any) -> ModelWatcher:
    kw.setdefault("poll_interval_s", 60.0)
    kw.setdefault("loader", FakeModel)
    return ModelWatcher(store, holder, encoder=ENC, event_wait_s=0.05, backoff_max_s=0.05, **kw)


def test_public_names_are_pinned() -> None:
    assert hotswap.__all__ == [
        "LoadedModel",
        "ModelHolder",
        "ModelWatcher",
        "SwappableModel",
    ]


def test_holder_swaps_one_reference_and_keeps_previous() -> None:
    holder = ModelHolder(["kb", "other"])
    assert not holder.ready() and holder.get("kb") is None
    a = LoadedModel("kb", "a" * 16, object(), 1.0)
    b = LoadedModel("kb", "b" * 16, object(), 2.0)
    holder.install(a)
    snap = holder.snapshot()
    holder.install(b)
    assert snap["kb"] is a and holder.snapshot()["kb"] is b  # old snapshots never change
    assert holder.previous("kb") is a
    with pytest.raises(TypeError):
        holder.snapshot()["kb"] = a  # type: ignore[index]
    assert not holder.ready()  # "other" has no model
    holder.install(LoadedModel("other", "c" * 16, object(), 3.0))
    assert holder.ready()
    st = holder.status()["kb"]
    assert (st["version"], st["previous_version"], st["swaps"]) == (b.version, a.version, 2)


def test_holder_failure_shows_in_status_until_a_good_swap() -> None:
    holder = ModelHolder(["kb"])
    holder.install(LoadedModel("kb", "a" * 16, object(), 1.0))
    holder.record_failure("kb", "b" * 16, "ArtifactCorrupt: bad")
    st = holder.status()["kb"]
    assert st["load_failures"] == 1 and st["last_error"] == "bbbbbbbbbbbbbbbb: ArtifactCorrupt: bad"
    assert st["version"] == "a" * 16
    holder.install(LoadedModel("kb", "c" * 16, object(), 2.0))
    assert holder.status()["kb"]["last_error"] is None
    assert holder.status()["kb"]["load_failures"] == 1
    # the failed version itself loading on a retry ends the error too
    holder.record_failure("kb", "d" * 16, "ArtifactNotFound: not there yet")
    holder.install(LoadedModel("kb", "d" * 16, object(), 3.0))
    assert holder.status()["kb"]["last_error"] is None


async def test_watcher_loads_swaps_and_refuses_broken_models() -> None:
    store, holder = FakeStore(), ModelHolder(["kb"])
    a, b, bad = artifact(1), artifact(2), artifact(3, fail=True)
    store.promote(a)
    w = watcher(store, holder)
    await w.start()
    try:
        assert holder.ready() and holder.get("kb").version == a.version  # type: ignore[union-attr]
        store.promote(bad)  # warm-up raises: refused, a stays
        await holder.wait_for(lambda h: h.status()["kb"]["load_failures"] == 1, 5)
        assert holder.get("kb").version == a.version  # type: ignore[union-attr]
        assert "broken model" in holder.status()["kb"]["last_error"]
        store.promote(b)
        await holder.wait_for(lambda h: h.get("kb").version == b.version, 5)  # type: ignore[union-attr]
        gets = store.gets
        store.promote(a)  # back to the previous model: no fetch
        await holder.wait_for(lambda h: h.get("kb").version == a.version, 5)  # type: ignore[union-attr]
        assert store.gets == gets
    finally:
        await w.stop()


async def test_watcher_keeps_its_model_while_the_pointer_is_unsealed() -> None:
    """A pointer the store refuses (no valid seal under the key, or a replayed one): the
    version it names is neither fetched nor installed, the refusal shows in the status
    once, and the key holder's next move (with its event) is taken."""
    store, holder = FakeStore(), ModelHolder(["kb"])
    a, b = artifact(1), artifact(2)
    store.promote(a)
    w = watcher(store, holder)
    await w.start()
    try:
        assert holder.get("kb").version == a.version  # type: ignore[union-attr]
        store.unsealed = PointerUnsealed("KB 'kb': the seal does not match the signing key")
        gets = store.gets
        store.promote(b)  # a writer without the key moved the pointer
        await holder.wait_for(lambda h: h.status()["kb"]["load_failures"] == 1, 5)
        assert holder.get("kb").version == a.version  # type: ignore[union-attr]
        assert store.gets == gets  # the unsealed version was never fetched
        error = holder.status()["kb"]["last_error"]
        assert error.startswith(b.version) and "PointerUnsealed" in error
        await w.sync()  # the poll finds the same refusal: not counted again
        assert holder.status()["kb"]["load_failures"] == 1
        store.unsealed = None
        store.promote(b)  # sealed by a key holder
        await holder.wait_for(lambda h: h.get("kb").version == b.version, 5)  # type: ignore[union-attr]
    finally:
        await w.stop()


async def test_watcher_refuses_other_encoder() -> None:
    store, holder = FakeStore(), ModelHolder(["kb"])
    store.promote(build_artifact(kb="kb", encoder={"name": "x", "dim": 4}, model={}, arrays={}))
    w = watcher(store, holder)
    await w.start()
    try:
        assert not holder.ready()
        assert "EncoderMismatch" in holder.status()["kb"]["last_error"]
    finally:
        await w.stop()


async def test_watcher_survives_a_store_outage_at_start() -> None:
    store, holder = FakeStore(), ModelHolder(["kb"])
    store.promote(artifact(1))
    store.down = True
    w = watcher(store, holder)
    await w.start()  # does not raise
    try:
        assert not holder.ready() and holder.store_error is not None
        assert holder.status()["kb"]["store_reachable"] is False
        store.down = False
        await holder.wait_for(lambda h: h.ready() and h.store_error is None, 5)
    finally:
        await w.stop()


async def test_a_store_blip_during_the_first_load_does_not_wait_for_the_poll() -> None:
    # The streams' ends were read, then the pointer read failed: the watcher used to keep
    # those cursors and wait on events (there were none), so nothing loaded until the
    # poll (60 s here) while the worker answered every query with its fail mode.
    class BlipStore(FakeStore):
        blips = 1

        async def active(self, kb: str) -> str | None:
            if self.blips:
                self.blips -= 1
                raise StoreUnavailable("blip")
            return await super().active(kb)

    store, holder = BlipStore(), ModelHolder(["kb"])
    store.promote(artifact(1))
    w = watcher(store, holder)
    await w.start()
    try:
        assert not holder.ready() and store.blips == 0
        await holder.wait_for(lambda h: h.ready() and h.store_error is None, 5)
    finally:
        await w.stop()


async def test_a_rollback_during_a_load_keeps_the_loading_version_out() -> None:
    store, holder = FakeStore(), ModelHolder(["kb"])
    a, b = artifact(1), artifact(2)
    store.promote(a)
    built: list[str] = []

    def loader(art: Artifact) -> FakeModel:
        built.append(art.version)
        if art.version == b.version:
            store.pointer["kb"] = a.version  # rolled back while b was being built
        return FakeModel(art)

    w = watcher(store, holder, loader=loader)
    await w.start()
    try:
        store.promote(b)
        await w.sync()
        assert built == [a.version, b.version]  # b was loaded, then the pointer moved
        assert holder.get("kb").version == a.version  # type: ignore[union-attr]
        assert holder.status()["kb"]["swaps"] == 1  # b never served a query
    finally:
        await w.stop()


async def test_a_kb_the_store_fails_for_does_not_hold_up_the_others() -> None:
    # One KB's pointer cannot be read (a refused command, an unreadable state file): the
    # KB served after it used to get neither its first load nor its swaps.
    class OneBroken(FakeStore):
        async def active(self, kb: str) -> str | None:
            if kb == "broken":
                raise ModelStoreError("WRONGTYPE Operation against a key")
            return await super().active(kb)

    store, holder = OneBroken(), ModelHolder(["broken", "kb"])
    first, second = artifact(1), artifact(2)
    store.promote(first)
    w = watcher(store, holder)
    await w.start()
    try:
        assert holder.get("kb").version == first.version  # type: ignore[union-attr]
        store.promote(second)
        await holder.wait_for(lambda h: h.get("kb").version == second.version, 5)
    finally:
        await w.stop()


async def test_watcher_keeps_trying_after_another_store_error_at_start() -> None:
    # Not "unreachable" but a refused command (e.g. Redis NOPERM): the loops must still
    # start, or no model would ever load.
    store, holder = FakeStore(), ModelHolder(["kb"])
    store.promote(artifact(1))
    store.refusing = ModelStoreError("NOPERM this user has no permissions")
    w = watcher(store, holder)
    await w.start()  # does not raise
    try:
        assert not holder.ready()
        store.refusing = None
        await holder.wait_for(lambda h: h.ready(), 5)
    finally:
        await w.stop()


async def test_watcher_refuses_a_model_whose_threshold_is_not_finite() -> None:
    # score > NaN is never true: such a model would let every query through as ID.
    store, holder = FakeStore(), ModelHolder(["kb"])
    good = artifact(1)
    store.promote(good)
    w = watcher(store, holder)
    await w.start()
    try:
        store.promote(artifact(2, threshold="nan"))
        await holder.wait_for(lambda h: h.status()["kb"]["load_failures"] == 1, 5)
        assert holder.get("kb").version == good.version  # type: ignore[union-attr]
        assert "not finite" in holder.status()["kb"]["last_error"]
    finally:
        await w.stop()


class SwallowingStore(FakeStore):
    """A client that turns cancellation into a connection error (some drivers do)."""

    async def wait_events(self, after: Mapping[str, str], timeout_s: float) -> Sequence[StoreEvent]:
        try:
            await asyncio.sleep(timeout_s)
        except asyncio.CancelledError:
            raise StoreUnavailable("connection closed while reading") from None
        return []


async def test_stop_ends_even_when_the_client_swallows_cancellation() -> None:
    store, holder = SwallowingStore(), ModelHolder(["kb"])
    store.promote(artifact(1))
    w = ModelWatcher(
        store,
        holder,
        encoder=ENC,
        loader=FakeModel,
        poll_interval_s=60,
        event_wait_s=10.0,
        backoff_max_s=0.05,
    )
    await w.start()
    async with asyncio.timeout(5):
        await w.stop()
    assert holder.ready()  # stopping keeps the models


def test_warm_up_turns_a_scoring_failure_into_a_refusal() -> None:
    from model_store import ArtifactRejected

    broken = FakeModel(artifact(9, fail=True))
    with pytest.raises(ArtifactRejected, match="cannot score a probe query: broken model"):
        warm_up(broken, 4)
    warm_up(FakeModel(artifact(10)), 4)  # one that scores passes
