"""The models in service: one immutable mapping ``kb -> LoadedModel``, swapped by
replacing one reference, with each KB's previous model kept for rollback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# The package's logger, as before hotswap became a package: log lines keep its name.
log = logging.getLogger("sidecar.hotswap")


@dataclass(frozen=True)
class LoadedModel:
    """A model in service: which KB, which store version, since when (unix seconds)."""

    kb: str
    version: str
    model: Any  # a SwappableModel; ``Any`` so callers keep the concrete type's methods
    loaded_at: float


@dataclass
class _KbStatus:
    swaps: int = 0
    load_failures: int = 0
    last_error: str | None = None
    failed_version: str | None = None
    store_active: str | None = None


class ModelHolder:
    """The models in service, one per KB, swapped by replacing one reference.

    Parameters
    ----------
    kbs : sequence of str
        The KBs this process serves; :meth:`ready` needs a model for each.
    """

    def __init__(self, kbs: Sequence[str]) -> None:
        self.kbs = tuple(kbs)
        self._current: Mapping[str, LoadedModel] = MappingProxyType({})
        self._previous: dict[str, LoadedModel] = {}
        self._status = {kb: _KbStatus() for kb in self.kbs}
        self.store_error: str | None = None
        self._changed: asyncio.Event | None = None

    def snapshot(self) -> Mapping[str, LoadedModel]:
        """The current immutable mapping ``kb -> LoadedModel``; read it once per batch."""
        return self._current

    def get(self, kb: str) -> LoadedModel | None:
        return self._current.get(kb)

    def previous(self, kb: str) -> LoadedModel | None:
        """The model that served ``kb`` before the current one (kept for rollback)."""
        return self._previous.get(kb)

    def ready(self) -> bool:
        """True when every served KB has a model."""
        current = self._current
        return all(kb in current for kb in self.kbs)

    def install(self, loaded: LoadedModel) -> None:
        """Put ``loaded`` in service for its KB (one reference assignment)."""
        old = self._current.get(loaded.kb)
        if old is not None and old.version != loaded.version:
            self._previous[loaded.kb] = old
        new = dict(self._current)
        new[loaded.kb] = loaded
        self._current = MappingProxyType(new)  # the swap
        st = self._status.setdefault(loaded.kb, _KbStatus())
        st.swaps += 1
        # A good install ends the error: a retried version now serves, or another took the
        # failed one's place.
        st.last_error = st.failed_version = None
        log.info(
            "KB %s now served by version %s (was %s)",
            loaded.kb,
            loaded.version,
            old.version if old else None,
        )
        self._notify()

    def record_failure(self, kb: str, version: str, reason: str) -> None:
        """A load of ``version`` failed; the current model stays."""
        st = self._status.setdefault(kb, _KbStatus())
        st.load_failures += 1
        st.last_error = f"{version}: {reason}"
        st.failed_version = version
        self._notify()

    def note_store_active(self, kb: str, version: str | None) -> None:
        self._status.setdefault(kb, _KbStatus()).store_active = version

    def note_store_error(self, error: str | None) -> None:
        changed = (error is None) != (self.store_error is None)
        self.store_error = error
        if changed:
            self._notify()

    def status(self) -> dict[str, Any]:
        """Per KB: version, previous_version, loaded_at, last_error, load_failures, swaps."""
        out: dict[str, Any] = {}
        current = self._current
        for kb in sorted(set(self.kbs) | set(self._status)):
            st = self._status.get(kb, _KbStatus())
            cur, prev = current.get(kb), self._previous.get(kb)
            out[kb] = {
                "version": cur.version if cur else None,
                "previous_version": prev.version if prev else None,
                "loaded_at": cur.loaded_at if cur else None,
                "store_active": st.store_active,
                "last_error": st.last_error,
                "load_failures": st.load_failures,
                "swaps": st.swaps,
                "store_reachable": self.store_error is None,
            }
        return out

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_for(self, predicate: Callable[[ModelHolder], bool], timeout_s: float) -> None:
        """Wait until ``predicate(self)`` holds after a swap or failure (``TimeoutError``)."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()
