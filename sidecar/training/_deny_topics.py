"""Denied-topic lists: the built-in one, or a text file of one topic per line."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sidecar._input_files import input_file
from sidecar.errors import DataError
from sidecar.scoring import read_topic_lines

BUILTIN_DENY_TOPICS = "builtin"
# The file behind BUILTIN_DENY_TOPICS, in sidecar/data.
_BUILTIN_FILE = "deny_topics.txt"
# More topics than this is a corpus, not a list (each one is a dot product per query).
MAX_DENY_TOPICS = 1000
MAX_TOPIC_CHARS = 500


def read_deny_topics(spec: str | Path) -> tuple[str, ...]:
    """The topics of ``spec``: ``"builtin"`` (the packaged list) or a UTF-8 text file with
    one topic per line (blank lines and ``#`` comments skipped).

    Raises
    ------
    DataError
        A missing or unreadable file, one that is not UTF-8, or one without a topic, with
        too many, or with a topic longer than ``MAX_TOPIC_CHARS``.
    """
    if str(spec) == BUILTIN_DENY_TOPICS:
        text = resources.files("sidecar").joinpath("data", _BUILTIN_FILE).read_text("utf-8")
        return read_topic_lines(text.splitlines())
    path = input_file(spec, "a text file of topics", missing=f"denied-topic file not found: {spec}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    topics = read_topic_lines(lines)
    if not topics:
        raise DataError(f"{path} holds no topic (one per line; '#' starts a comment)")
    if len(topics) > MAX_DENY_TOPICS:
        raise DataError(f"{path} holds {len(topics)} topics; at most {MAX_DENY_TOPICS}")
    long = [t for t in topics if len(t) > MAX_TOPIC_CHARS]
    if long:
        raise DataError(
            f"{path}: a topic is a short description, at most {MAX_TOPIC_CHARS} characters; "
            f"{long[0][:40]!r}... has {len(long[0])}"
        )
    return topics
