"""The watcher that keeps a :class:`ModelHolder` in line with the store's active pointers:
it reads the store's events, polls the pointers, and loads, checks and installs models."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from model_store import (
    Artifact,
    ArtifactNotFound,
    ArtifactRejected,
    AsyncModelStore,
    StoreUnavailable,
)
from sidecar.errors import EncoderUnavailable
from sidecar.hotswap._holder import LoadedModel, ModelHolder
from sidecar.hotswap._model import ModelLoader, SwappableModel, default_loader
from sidecar.persistence import check_threshold, warm_up

# The package's logger, as before hotswap became a package: log lines keep its name.
log = logging.getLogger("sidecar.hotswap")


@dataclass
class ModelWatcher:
    """Keeps a :class:`ModelHolder` in line with the store's active pointers.

    Parameters
    ----------
    store : AsyncModelStore
    holder : ModelHolder
    encoder : dict
        ``{"name", "dim"}`` of the encoder this process runs; other artifacts are refused.
    encoder_probes : ndarray, optional
        The running encoder's embeddings of the probe sentences
        (``sidecar.scoring.embed_probes``); a model that recorded others is refused.
    probe_encoder : async callable, optional
        For an encoder whose weights can change behind it (an embedding server): asked
        for the probe embeddings before every install, instead of ``encoder_probes``; the
        width of its answer becomes the expected ``dim``. While it raises
        ``EncoderUnavailable`` no model is installed, and the install is tried again at
        the next sync.
    poll_interval_s : float
        Safety-net poll of the active pointers.
    warmup : bool
        Score one dummy vector before installing a model.
    loader : callable, optional
        ``Artifact -> model``; defaults to ``sidecar.scoring.OODModel.from_artifact``.
    event_wait_s : float
        Longest single blocking read of the event streams.
    backoff_max_s : float
        Ceiling of the reconnect backoff while the store is unreachable.
    """

    store: AsyncModelStore
    holder: ModelHolder
    _: KW_ONLY
    encoder: Mapping[str, Any]
    encoder_probes: np.ndarray | None = None
    probe_encoder: Callable[[], Awaitable[np.ndarray]] | None = None
    poll_interval_s: float = 5.0
    warmup: bool = True
    loader: ModelLoader | None = None
    event_wait_s: float = 1.0
    backoff_max_s: float = 5.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)
    _lock: asyncio.Lock | None = field(default=None, init=False, repr=False)
    _rejected: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _after: dict[str, str] | None = field(default=None, init=False, repr=False)
    _stopping: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.encoder = {"name": str(self.encoder["name"]), "dim": int(self.encoder["dim"])}

    async def start(self) -> None:
        """Load each KB's active version, then watch events and poll in the background."""
        self._stopping = False
        try:
            await self._resubscribe()
        except StoreUnavailable as exc:
            # _after stays None: the event loop resubscribes and loads on its first pass.
            self._store_down(exc)
            log.warning("model store unreachable at start, will retry: %s", exc)
        except Exception:
            # Any other store error (a refused command, a wrong key type): the event loop
            # resubscribes and retries with backoff, so the loops must start regardless.
            self._after = None
            log.exception("first model load failed, will retry")
        self._tasks = [
            asyncio.create_task(self._event_loop(), name="model-watcher-events"),
            asyncio.create_task(self._poll_loop(), name="model-watcher-poll"),
        ]

    async def stop(self) -> None:
        """Stop the background tasks (the holder keeps its models)."""
        # The flag ends the loops even where a client library turned the cancellation
        # into a connection error that the loop then handled.
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        while tasks:
            _, pending = await asyncio.wait(tasks, timeout=1.0)
            for t in pending:
                t.cancel()
            tasks = list(pending)

    async def sync(self, kbs: Sequence[str] | None = None) -> None:
        """Compare active pointers with the holder and swap where they differ.

        Raises :class:`StoreUnavailable` when the store cannot be reached. Another store
        error for one KB (a refused command, an unreadable pointer file) does not keep the
        KBs after it from their swaps: it is raised once every KB was tried.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        failed: Exception | None = None
        async with self._lock:
            for kb in kbs if kbs is not None else self.holder.kbs:
                try:
                    await self._sync_kb(kb)
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    log.warning("KB %s: the store failed: %s", kb, exc)
                    failed = failed or exc
        self._store_up()
        if failed is not None:
            raise failed

    async def recheck(self) -> None:
        """Forget the versions refused so far and sync every KB: the encoder changed (an
        embedding server that answers again, or with other vectors)."""
        self._rejected.clear()
        await self.sync()

    # -- internals ------------------------------------------------------------------------

    async def _sync_kb(self, kb: str) -> None:
        try:
            pointer = await self.store.active_pointer(kb)
        except ArtifactRejected as exc:
            # Not moved by a key holder, replayed, or no version id: nothing is fetched.
            await self._refuse_pointer(kb, exc)
            return
        active = pointer.version if pointer is not None else None
        self.holder.note_store_active(kb, active)
        current = self.holder.get(kb)
        if active is None or (current is not None and current.version == active):
            return
        if self._rejected.get(kb) == active:
            return  # already refused; retried after the next event or reconnect
        previous = self.holder.previous(kb)
        t0 = time.perf_counter()
        try:
            if previous is not None and previous.version == active:
                await self._check_probes(previous.model)
                log.info("KB %s: back to the previous version %s (no fetch)", kb, active)
                self.holder.install(dataclasses.replace(previous, loaded_at=time.time()))
                return
            loaded = await self._load(kb, active)
        except StoreUnavailable:
            raise
        except EncoderUnavailable as exc:
            # Not the version's fault: not remembered as refused, tried again next sync.
            self.holder.record_failure(kb, active, f"{type(exc).__name__}: {exc}")
            log.warning("KB %s: version %s waits for the encoder: %s", kb, active, exc)
            return
        except ArtifactNotFound as exc:  # e.g. deleted between pointer read and fetch
            self.holder.record_failure(kb, active, str(exc))
            log.warning(
                "KB %s: version %s not found, keeping the current model: %s", kb, active, exc
            )
            return
        except ArtifactRejected as exc:
            self._refuse(kb, active, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a model that cannot be built or scored must not serve
            log.debug("load of %s/%s failed", kb, active, exc_info=True)
            self._refuse(kb, active, f"{type(exc).__name__}: {exc}")
            return
        # A rollback or promotion that landed while this version loaded wins: installing
        # it anyway would serve it until the event of that change is read.
        now_active = await self.store.active(kb)
        if now_active != active:
            log.info(
                "KB %s: the active version moved to %s while %s loaded; not installing it",
                kb,
                now_active,
                active,
            )
            return
        self.holder.install(loaded)
        log.info(
            "KB %s: loaded version %s in %.0f ms", kb, active, (time.perf_counter() - t0) * 1000
        )

    async def _refuse_pointer(self, kb: str, exc: ArtifactRejected) -> None:
        named = await self.store.active(kb)
        self.holder.note_store_active(kb, named)
        marker = f"unsealed:{named}:{exc}"
        if self._rejected.get(kb) == marker:
            return  # said once; a key holder's next move comes with an event
        self.holder.record_failure(kb, named or "-", f"{type(exc).__name__}: {exc}")
        self._rejected[kb] = marker
        log.error("KB %s: refused the active pointer, keeping the current model: %s", kb, exc)

    def _refuse(self, kb: str, version: str, reason: str) -> None:
        self._rejected[kb] = version
        self.holder.record_failure(kb, version, reason)
        log.error("KB %s: refused version %s, keeping the current model: %s", kb, version, reason)

    async def _load(self, kb: str, version: str) -> LoadedModel:
        probes = await self._running_probes()
        artifact = await self.store.get(kb, version, expected_encoder=self.encoder)
        model = await asyncio.to_thread(self._build, artifact, probes)
        return LoadedModel(kb=kb, version=version, model=model, loaded_at=time.time())

    async def _running_probes(self) -> np.ndarray | None:
        """The running encoder's probe embeddings: asked for now where they can change."""
        if self.probe_encoder is None:
            return self.encoder_probes
        probes = np.asarray(await self.probe_encoder())
        self.encoder = {"name": self.encoder["name"], "dim": int(probes.shape[1])}
        return probes

    async def _check_probes(self, model: SwappableModel) -> None:
        """Check a model that is already built against the encoder's probes of now."""
        if self.probe_encoder is not None:
            probes = await self._running_probes()
            model.check_encoder(str(self.encoder["name"]), int(self.encoder["dim"]), probes)

    def _build(self, artifact: Artifact, probes: np.ndarray | None) -> SwappableModel:
        """Build, check and warm a model (runs in a worker thread)."""
        model = (self.loader or default_loader)(artifact)
        name, dim = str(self.encoder["name"]), int(self.encoder["dim"])
        model.check_encoder(name, dim, probes=probes)
        if self.warmup:
            warm_up(model, dim)
        else:
            check_threshold(model)
        return model

    async def _resubscribe(self) -> None:
        """(Re)connect: note where each stream ends, then sync every KB.

        A store outage during the sync drops the cursors again, so that the event loop
        resubscribes and syncs at once rather than wait on events while nothing is
        loaded; events that land during the sync are read afterwards from the cursors.
        """
        self._after = {kb: await self.store.last_event_id(kb) for kb in self.holder.kbs}
        self._rejected.clear()
        try:
            await self.sync()
        except StoreUnavailable:
            self._after = None
            raise

    async def _event_loop(self) -> None:
        backoff = 0.05
        while not self._stopping:
            try:
                if self._after is None:
                    await self._resubscribe()
                events = await self.store.wait_events(self._after or {}, self.event_wait_s)
                self._store_up()
                backoff = 0.05
                touched: list[str] = []
                for e in events:
                    if self._after is not None:
                        self._after[e.kb] = e.id
                    self._rejected.pop(e.kb, None)
                    if e.kb not in touched:
                        touched.append(e.kb)
                if touched:
                    await self.sync(touched)
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                self._store_down(exc)
                self._after = None  # resubscribe and sync after reconnecting
                await asyncio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, self.backoff_max_s)
            except Exception:
                log.exception("model watcher event loop failed; continuing")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)

    async def _poll_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                self._store_down(exc)
            except Exception:
                log.exception("model watcher poll failed; continuing")

    def _store_down(self, exc: BaseException) -> None:
        if self.holder.store_error is None:
            log.warning("model store unreachable, serving the current models: %s", exc)
        self.holder.note_store_error(str(exc))

    def _store_up(self) -> None:
        if self.holder.store_error is not None:
            log.info("model store reachable again")
            self.holder.note_store_error(None)
