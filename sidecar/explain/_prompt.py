"""Sources and the RAG prompt over a kept subset of them.

The prompt is the same for every kept set except for the sources: the kept ones appear
in their original retrieval order, each marked ``[S<k>]`` with its 1-based position in the
full list (so a source keeps its marker when others are dropped). The empty kept set gets
a fixed "no sources" block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar._input_files import input_file
from sidecar.errors import DataError
from sidecar.explain._lattice import members

Messages = list[dict[str, str]]

SYSTEM_PROMPT = (
    "You answer the user's question using only the numbered sources given. "
    "Answer briefly, in one sentence."
)
NO_SOURCES = "No sources are available for this question."


@dataclass(frozen=True)
class Source:
    """One retrieved passage: an id for reports and the text the model sees."""

    id: str
    text: str

    def snippet(self, width: int = 60) -> str:
        text = " ".join(self.text.split())
        return text if len(text) <= width else text[: width - 1] + "…"


def marker(index: int) -> str:
    """The marker of source ``index`` (0-based) in every prompt: ``[S1]`` for the first."""
    return f"[S{index + 1}]"


def build_messages(query: str, sources: Sequence[Source], kept: int) -> Messages:
    """Chat messages for ``query`` with only the sources in the ``kept`` mask.

    Parameters
    ----------
    query : str
    sources : sequence of Source, length n
    kept : int
        Bitmask over ``range(n)``; bit ``i`` keeps ``sources[i]``.
    """
    idx = [i for i in members(kept) if i < len(sources)]
    if idx:
        block = "\n\n".join(f"{marker(i)} {sources[i].text}" for i in idx)
        body = f"Sources:\n{block}"
    else:
        body = NO_SOURCES
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{body}\n\nQuestion: {query}\nAnswer:"},
    ]


def sources_from_records(
    records: Sequence[Any], *, origin: Sequence[str] | None = None
) -> list[Source]:
    """Validate ``[{"id": ..., "text": ...}, ...]`` (``id`` optional: ``S<k>``).

    ``origin[k]`` (e.g. ``"sources.jsonl:3"``) says where record ``k`` came from; an
    error about it starts with that.
    """

    def where(k: int) -> str:
        return f"{origin[k]}: " if origin is not None else ""

    out: list[Source] = []
    seen: dict[str, int] = {}
    for k, rec in enumerate(records):
        if isinstance(rec, str):
            rec = {"text": rec}
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            raise DataError(f"{where(k)}source {k + 1} must be an object with a string 'text'")
        source = Source(id=str(rec.get("id", f"S{k + 1}")), text=rec["text"])
        if source.id in seen:
            j = seen[source.id]
            first = origin[j] if origin is not None else f"source {j + 1}"
            raise DataError(
                f"{where(k)}source ids must be unique: {source.id!r} is also at {first}"
            )
        seen[source.id] = k
        out.append(source)
    return out


def load_sources(path: Path) -> list[Source]:
    """Read a UTF-8 JSONL file of sources, one ``{"id": ..., "text": ...}`` object a line.

    A missing path, a directory or a device raises :class:`DataError` naming it, as does
    bad content (naming the file and the line); a file that cannot be opened, the
    ``OSError``.
    """
    records, origin = [], []
    found = input_file(path, "a JSONL file of sources", missing=f"sources file not found: {path}")
    with found.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                ) from exc
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
            origin.append(f"{path}:{lineno}")
    if not records:
        raise DataError(f"{path}: no sources")
    return sources_from_records(records, origin=origin)
