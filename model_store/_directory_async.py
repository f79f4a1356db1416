"""The read side of the directory store for asyncio (the stream processor's model watcher).

Same files and checks as :class:`model_store.DirectoryStore`, whose file I/O runs in
threads. ``wait_events`` polls each KB's event log and reads it again only when its size
or modification time changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from model_store._artifact import Artifact
from model_store._directory import DirectoryStore
from model_store._errors import StoreUnavailable
from model_store._seal import ActivePointer, SeqGuard
from model_store._store import StoreEvent


class AsyncDirectoryStore:
    """Asyncio view of a :class:`DirectoryStore`: file I/O in threads, events by polling."""

    def __init__(self, store: DirectoryStore, *, event_poll_s: float = 0.1) -> None:
        self.store = store
        self.event_poll_s = event_poll_s
        # Per KB: the event log's mark and the cursor of the last read that found nothing new.
        self._read_at: dict[str, tuple[tuple[int, int] | None, str]] = {}
        self._seqs = SeqGuard()

    def __repr__(self) -> str:
        return f"AsyncDirectoryStore({str(self.store.root)!r})"

    async def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        return await asyncio.to_thread(
            self.store.get, kb, version, expected_encoder=expected_encoder
        )

    async def active(self, kb: str) -> str | None:
        return await asyncio.to_thread(self.store.active, kb)

    async def active_pointer(self, kb: str) -> ActivePointer | None:
        return self._seqs.check(kb, await asyncio.to_thread(self.store.active_pointer, kb))

    async def previous(self, kb: str) -> str | None:
        return await asyncio.to_thread(self.store.previous, kb)

    async def last_event_id(self, kb: str) -> str:
        events = await asyncio.to_thread(self.store.events, kb)
        return events[-1].id if events else "0"

    async def wait_events(self, after: Mapping[str, str], timeout_s: float) -> Sequence[StoreEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            found: list[StoreEvent] = []
            for kb, last in after.items():
                # The log is read again only when it changed: read every poll, a long log
                # cost tens of ms a read.
                mark = (await asyncio.to_thread(self.store.events_mark, kb), last)
                if self._read_at.get(kb) == mark:
                    continue
                new = await asyncio.to_thread(self.store.events, kb, last)
                if new:  # asked again from the same cursor, they are found again
                    self._read_at.pop(kb, None)
                    found.extend(new)
                else:  # marked only once a read succeeded and found nothing
                    self._read_at[kb] = mark
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            await asyncio.sleep(min(self.event_poll_s, remaining))

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the store directory is there."""
        if not await asyncio.to_thread(self.store.root.is_dir):
            raise StoreUnavailable(f"store directory {self.store.root} is gone")

    async def close(self) -> None:
        self.store.close()
