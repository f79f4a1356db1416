"""Readers for the training job's inputs: a KB and query sets as JSONL.

KB lines are ``{"id": ..., "text": ...}``; query lines are ``{"text": ...}``, optionally with
a ``"group"`` (string or integer) naming the queries that paraphrase each other and a
``"language"`` (a BCP-47 tag such as ``"nl"`` or ``"pt-BR"``, read where per-language
thresholds ask for the queries' languages; see :mod:`sidecar._language_tags`). Other keys
are ignored. Every error names the file and the 1-based line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sidecar._input_files import input_file
from sidecar._language_tags import language_code
from sidecar.errors import DataError

DEMO_KB = "demo_kb.jsonl"
DEMO_ID_QUERIES = "demo_id_queries.jsonl"
DEMO_OOD_QUERIES = "demo_ood_queries.jsonl"


@dataclass(frozen=True)
class KBDocument:
    """One KB document."""

    id: str
    text: str


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    input_file(path, "a JSONL file", missing=f"file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc})") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.rstrip("\r\n"))  # positions within this line, not past it
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        except ValueError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.args[0]})") from exc
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        text = rec.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{path}:{lineno}: missing or empty string field 'text'")
        out.append((lineno, rec))
    if not out:
        raise DataError(f"{path}: no records")
    return out


def read_kb(path: str | Path) -> list[KBDocument]:
    """Read KB documents; ``id`` is required and unique (strings or integers)."""
    p = Path(path)
    docs, seen = [], set()
    for lineno, rec in _records(p):
        doc_id = rec.get("id")
        if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or str(doc_id) == "":
            raise DataError(f"{p}:{lineno}: missing field 'id' (string or integer)")
        if str(doc_id) in seen:
            raise DataError(f"{p}:{lineno}: duplicate id {doc_id!r}")
        seen.add(str(doc_id))
        docs.append(KBDocument(str(doc_id), rec["text"].strip()))
    return docs


def read_queries(path: str | Path) -> list[str]:
    """Read query texts (field ``text``)."""
    return [rec["text"].strip() for _, rec in _records(Path(path))]


@dataclass(frozen=True)
class QueryRows:
    """Query lines as read: texts, a group number per text (None when no line has a
    ``group``) and, when asked for, the language code each line gives (None for a line
    without one; the list None when they were not read)."""

    texts: list[str]
    groups: list[int] | None
    languages: list[str | None] | None = None


def read_query_rows(path: str | Path, *, languages: bool = False) -> QueryRows:
    """Query texts, their groups (:func:`read_query_groups`) and, with ``languages``,
    each line's ``language`` as a language code (``"nl"`` for ``"nl-NL"``); a value that
    is not a language tag is a :class:`~sidecar.errors.DataError` naming its line."""
    p = Path(path)
    records = _records(p)
    langs: list[str | None] | None = None
    if languages:
        langs = []
        for lineno, rec in records:
            value = rec.get("language")
            try:
                langs.append(None if value is None else language_code(value))
            except DataError as exc:
                raise DataError(f"{p}:{lineno}: {exc}") from None
    return QueryRows([rec["text"].strip() for _, rec in records], _groups(p, records), langs)


def read_query_groups(path: str | Path) -> tuple[list[str], list[int] | None]:
    """Query texts and a group number per text (None when no line has a ``group``).

    Lines with the same ``group`` share a number (an integer ``3`` and a string ``"3"``
    name the same group); a line without one is a group of its own.
    """
    rows = read_query_rows(path)
    return rows.texts, rows.groups


def _groups(p: Path, records: list[tuple[int, dict[str, Any]]]) -> list[int] | None:
    if not any("group" in rec for _, rec in records):
        return None
    number: dict[str, int] = {}
    groups = []
    for lineno, rec in records:
        g = rec.get("group")
        if g is None:
            groups.append(len(number))
            number[f"line {lineno}"] = len(number)  # a key no named group can take
            continue
        if not isinstance(g, str | int) or isinstance(g, bool) or str(g) == "":
            raise DataError(f"{p}:{lineno}: field 'group' must be a string or an integer")
        groups.append(number.setdefault(f"group {g}", len(number)))
    return groups


def demo_path(name: str) -> Path:
    """Path of a built-in demo file in ``sidecar/data``."""
    return Path(str(resources.files("sidecar") / "data" / name))
