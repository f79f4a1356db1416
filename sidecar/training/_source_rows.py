"""Rows of a KB or a query set read in batches from a table or a file, checked and gathered.

The PostgreSQL and Parquet readers yield :class:`RowBatch` objects (ids, texts, optional
groups and embeddings) one batch at a time; :class:`RowCollector` checks each batch as it
comes (empty text, missing or duplicate id, an embedding of another width, NaN) and keeps
only what training needs, so that reading costs one batch of memory beyond the result.
Every error names the input and the row (1-based, with its id where the source has one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar.errors import DataError

# The columns read; any others are ignored.
ID, TEXT, GROUP, EMBEDDING = "id", "text", "group", "embedding"

# Embeddings are gathered in blocks of this size. Above 32 MiB glibc's malloc maps every
# block on its own and unmaps it when freed, so each block copied into the result gives
# its memory back at once; smaller chunks would stay in the heap, doubling the peak.
_BLOCK_BYTES = 64 * 2**20


@dataclass
class RowBatch:
    """Consecutive rows of one input: ``embeddings`` is None or (len(texts), dim) float32;
    ``ids`` and ``groups`` are None where the source has no such column."""

    texts: Sequence[Any]
    ids: Sequence[Any] | None = None
    groups: Sequence[Any] | None = None
    embeddings: np.ndarray | None = None


@dataclass(frozen=True)
class SourceRows:
    """One input read whole: texts (stripped), their ids (KB) and group numbers (queries,
    None when no row names a group), the stored embeddings, (n, dim) float32, or None,
    and the language code each query row gives (None: not read, or not given)."""

    given: str
    texts: list[str]
    ids: list[str]
    groups: list[int] | None
    embeddings: np.ndarray | None
    languages: list[str | None] | None = None


class RowCollector:
    """Checks batches of rows and gathers them.

    Parameters
    ----------
    given : str
        The input as messages name it ("--kb-sql public.docs", a path).
    kb : bool
        KB rows: an ``id`` is required and unique. Query rows may have a ``group``.
    """

    def __init__(self, given: str, *, kb: bool) -> None:
        self.given, self.kb = given, kb
        self.texts: list[str] = []
        self.ids: list[str] = []
        self._seen: set[str] = set()
        self._groups: list[Any] = []
        self._blocks: list[np.ndarray | None] = []
        self._filled = 0  # rows used in the last block
        self._dim: int | None = None
        self._has_embeddings: bool | None = None

    @property
    def rows(self) -> int:
        return len(self.texts)

    def _where(self, i: int, ids: Sequence[Any] | None) -> str:
        row = f"{self.given}: row {self.rows + i + 1}"
        if ids is not None and ids[i] is not None:
            return f"{row} (id {str(ids[i])!r})"
        return row

    def add(self, batch: RowBatch) -> None:
        """Check ``batch`` and keep its rows: :class:`~sidecar.errors.DataError` at the
        first bad row."""
        n = len(batch.texts)
        for name, col in (("ids", batch.ids), ("groups", batch.groups)):
            if col is not None and len(col) != n:
                raise ValueError(f"a batch with {n} texts and {len(col)} {name}")
        texts = self._texts(batch)
        ids = self._ids(batch) if self.kb else []
        if self._has_embeddings is None:
            self._has_embeddings = batch.embeddings is not None
        elif self._has_embeddings != (batch.embeddings is not None):
            raise ValueError("some batches came with embeddings and some without")
        if batch.embeddings is not None:
            self._check_embeddings(batch.embeddings, batch.ids)
        if batch.groups is not None and not self.kb:
            self._check_groups(batch.groups, batch.ids)
            self._groups.extend(batch.groups)
        elif not self.kb:
            self._groups.extend([None] * n)
        self.texts.extend(texts)
        self.ids.extend(ids)
        if batch.embeddings is not None:
            self._keep(batch.embeddings)

    def _keep(self, emb: np.ndarray) -> None:
        """Copy ``emb`` into the blocks, opening new ones as they fill."""
        assert self._dim is not None
        done = 0
        while done < len(emb):
            last = self._blocks[-1] if self._blocks else None
            if last is None or self._filled == len(last):
                rows = max(1, _BLOCK_BYTES // (4 * self._dim))
                last = np.empty((rows, self._dim), dtype=np.float32)
                self._blocks.append(last)
                self._filled = 0
            n = min(len(emb) - done, len(last) - self._filled)
            last[self._filled : self._filled + n] = emb[done : done + n]
            self._filled += n
            done += n

    def _texts(self, batch: RowBatch) -> list[str]:
        out = []
        for i, text in enumerate(batch.texts):
            if not isinstance(text, str) or not text.strip():
                what = "NULL" if text is None else "empty" if isinstance(text, str) else "not text"
                raise DataError(f"{self._where(i, batch.ids)}: 'text' is {what}")
            out.append(text.strip())
        return out

    def _ids(self, batch: RowBatch) -> list[str]:
        if batch.ids is None:
            raise DataError(f"{self.given}: no 'id' column; a KB row needs an id")
        out = []
        for i, raw in enumerate(batch.ids):
            doc_id = "" if raw is None or isinstance(raw, bool) else str(raw)
            if doc_id == "":
                raise DataError(f"{self._where(i, None)}: 'id' is NULL or empty")
            if doc_id in self._seen:
                raise DataError(f"{self._where(i, None)}: duplicate id {doc_id!r}")
            self._seen.add(doc_id)
            out.append(doc_id)
        return out

    def _check_groups(self, groups: Sequence[Any], ids: Sequence[Any] | None) -> None:
        for i, g in enumerate(groups):
            if g is None:
                continue
            if not isinstance(g, str | int) or isinstance(g, bool) or str(g) == "":
                raise DataError(
                    f"{self._where(i, ids)}: 'group' must be a string or an integer, got "
                    f"{type(g).__name__}"
                )

    def _check_embeddings(self, emb: np.ndarray, ids: Sequence[Any] | None) -> None:
        if emb.ndim != 2 or emb.dtype.kind != "f":
            raise ValueError(f"embeddings of a batch must be a 2-D float array, got {emb.shape}")
        if self._dim is None:
            self._dim = int(emb.shape[1])
            if self._dim == 0:
                raise DataError(f"{self._where(0, ids)}: 'embedding' is empty")
        if emb.shape[1] != self._dim:
            raise DataError(
                f"{self.given}: 'embedding' has {emb.shape[1]} dims in some rows and "
                f"{self._dim} in others"
            )
        for bad, why in (
            (~np.isfinite(emb).all(axis=1), "holds NaN or infinite values"),
            (~emb.any(axis=1), "is all zeros (no encoder gives that)"),
        ):
            if bad.any():
                first = int(np.argmax(bad))
                more = int(bad.sum()) - 1
                also = f" ({more} more rows of this batch too)" if more else ""
                raise DataError(f"{self._where(first, ids)}: 'embedding' {why}{also}")

    def finish(self) -> SourceRows:
        """The rows gathered; the embedding blocks are joined into one array and freed
        one by one, so the peak is the result plus one block, not twice the result."""
        if not self.texts:
            raise DataError(f"{self.given}: no rows")
        embeddings = None
        if self._has_embeddings:
            assert self._dim is not None
            n = len(self.texts)
            first = self._blocks[0]
            if len(self._blocks) == 1 and first is not None:
                embeddings = np.array(first[:n])  # a copy: the unused rows are not kept
            else:
                embeddings = np.empty((n, self._dim), dtype=np.float32)
                pos = 0
                for k, block in enumerate(self._blocks):
                    assert block is not None
                    rows = min(len(block), n - pos)
                    embeddings[pos : pos + rows] = block[:rows]
                    pos += rows
                    self._blocks[k] = None  # unmapped now: its memory goes back
            self._blocks = []
        return SourceRows(
            given=self.given,
            texts=self.texts,
            ids=self.ids,
            groups=None if self.kb else group_numbers(self._groups),
            embeddings=embeddings,
        )


def group_numbers(groups: Sequence[Any]) -> list[int] | None:
    """One number per row, shared by rows with the same group (``3`` and ``"3"`` are one
    group); a row without a group is a group of its own. None when no row has one."""
    if all(g is None for g in groups):
        return None
    number: dict[str, int] = {}
    out = []
    for i, g in enumerate(groups):
        key = f"row {i}" if g is None else f"group {g}"  # a row key no named group can take
        out.append(number.setdefault(key, len(number)))
    return out


def stack_vectors(vectors: Sequence[Any], given: str, first_row: int) -> np.ndarray:
    """Per-row vectors (1-D arrays, or None for NULL) as one (n, dim) float32 array;
    rows of different widths or NULLs are a :class:`~sidecar.errors.DataError`."""
    widths = set()
    for i, v in enumerate(vectors):
        if v is None:
            raise DataError(
                f"{given}: row {first_row + i + 1}: 'embedding' is NULL: filter such rows "
                "out (WHERE embedding IS NOT NULL), or leave the column out to embed every "
                "text here"
            )
        widths.add(len(v))
    if len(widths) > 1:
        raise DataError(
            f"{given}: 'embedding' has rows of {len(widths)} widths "
            f"({', '.join(map(str, sorted(widths)[:4]))}) from row {first_row + 1} on"
        )
    if not vectors:
        return np.empty((0, 0), dtype=np.float32)
    return np.stack([np.asarray(v, dtype=np.float32) for v in vectors])
