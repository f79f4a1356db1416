"""The directory store's event log: one JSON object per line, appended and fsynced, read
past torn or foreign lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

from model_store._store import StoreEvent

EVENTS_FILE = "events.jsonl"


def append_event(path: Path, event: StoreEvent) -> None:
    """Append ``event`` as one line and fsync it (the caller holds the KB's lock)."""
    with open(path, "ab+") as f:
        # A line torn by a crash gets its own: this event must not be glued to it.
        end, torn = f.seek(0, os.SEEK_END), False
        if end:
            f.seek(end - 1)
            torn = f.read(1) != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(event.to_json()).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def event_log_mark(path: Path) -> tuple[int, int] | None:
    """Size and modification time of the log (None when there is none): the log only
    grows, so an unchanged mark means no new event."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def read_events(path: Path, kb: str, after: str | None = None) -> list[StoreEvent]:
    """The events of ``kb``'s log with an id above ``after``, oldest first."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    start = int(after) if after else 0
    out: list[StoreEvent] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            e = json.loads(line)
            event = StoreEvent(
                str(int(e["id"])),
                kb,
                str(e["version"]),
                e.get("previous"),
                str(e["action"]),
                float(e["ts"]),
            )
        except (ValueError, TypeError, KeyError, IndexError):
            # A line still being appended, or one that is not an event (written by
            # hand, torn by a crash): skipped, as a reader must get past it.
            continue
        if int(event.id) > start:
            out.append(event)
    return out
