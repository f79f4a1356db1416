"""Files a user names as input: refused in one line when they cannot be read as a file.

A directory, a device (``/dev/zero`` would be read until memory runs out) or a socket is
refused naming what it is, before anything reads it. A pipe is read as a file, so process
substitution (``--kb <(zcat kb.jsonl.gz)``) works, except where the reader needs to seek.
"""

from __future__ import annotations

import stat
from pathlib import Path

from sidecar.errors import DataError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def input_file(path: str | Path, expected: str, *, missing: str, pipes: bool = True) -> Path:
    """``path`` as a :class:`Path` if it can be read as ``expected`` (e.g. "a JSONL file").

    Parameters
    ----------
    path : str or Path
    expected : str
        What the caller reads there, for the message.
    missing : str
        The message when nothing is at ``path`` (callers name the option or dataset).
    pipes : bool
        Accept a named pipe (readers that read once, front to back).

    Raises
    ------
    DataError
        Nothing there, or a directory, device, socket (or a pipe where ``pipes`` is False).
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise DataError(missing) from None
    except OSError as exc:
        raise DataError(f"{p}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if stat.S_ISREG(mode) or (pipes and stat.S_ISFIFO(mode)):
        return p
    raise DataError(f"{p} is a {_kind(mode)}, expected {expected}")
