"""Durable file writes for the directory store: written and fsynced, then renamed into
place, the directory synced after the rename.

Every temporary name starts with :data:`TMP_PREFIX`, so that listings skip them and gc
can sweep what an interrupted write left.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, whole."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
    write_synced(tmp, data)
    os.replace(tmp, path)
    sync_dir(path.parent)
