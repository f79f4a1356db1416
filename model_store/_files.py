"""Durable file writes for the directory store: written and fsynced, then renamed into
place, the directory synced after the rename.

Every temporary name starts with :data:`TMP_PREFIX`, so that listings skip them and gc
can sweep what an interrupted write left.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
# Written last into a version folder: a folder without it is no stored version.
META_FILE = "meta.json"
# A temporary directory this old is a leftover of an interrupted put() or gc.
_LEFTOVER_AGE_S = 3600.0


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


def sweep_leftovers(versions: Path) -> int:
    """Remove what an interrupted put() or gc left behind in a KB's ``versions`` folder: a
    ``.tmp-`` directory an hour old (puts write under the KB's lock, which gc holds; the hour
    is a margin). Returns how many went."""
    cutoff = time.time() - _LEFTOVER_AGE_S
    removed = 0
    for p in versions.glob(f"{TMP_PREFIX}*"):
        try:
            if p.is_dir() and p.stat().st_mtime < cutoff:
                shutil.rmtree(p, ignore_errors=True)
                log.info("gc removed the leftover %s", p)
                removed += 1
        except OSError:
            continue
    return removed


def holds_version(versions: Path) -> bool:
    """Whether a KB's ``versions`` folder lists a stored version (not a put's temp dir)."""
    return any(
        p.is_dir() and not p.name.startswith(TMP_PREFIX) and (p / META_FILE).is_file()
        for p in versions.iterdir()
    )
