"""Readers of the benchmark files under ``shared/data``: JSON, text lines and CSV columns.

Every failure names the file: a missing file (so ``--split test`` on a machine without the
test files says what to add), text that is not UTF-8, a CSV that cannot be parsed, and
CLINC150 JSON of another shape than the loaders rely on (:mod:`sidecar.evaluation._datasets`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar._input_files import input_file
from sidecar.errors import DataError


def need(path: Path) -> Path:
    return input_file(path, "a benchmark file", missing=f"missing benchmark file: {path}")


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn a decoding or CSV failure while reading ``path`` into a DataError naming it."""
    try:
        yield
    except UnicodeDecodeError as exc:
        # The offset is within the decoder's chunk, not the file: name the reason only.
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except csv.Error as exc:
        raise DataError(f"{path}: not a readable CSV file ({exc})") from exc


def read_text(path: Path) -> str:
    with reading(path):
        return need(path).read_text(encoding="utf-8")


def read_json(path: Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path} is not valid JSON: {exc}") from exc


def read_lines(path: Path) -> list[str]:
    text = read_text(path)
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def is_pair(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)


def read_pairs(
    path: Path, keys: Sequence[str], *, optional: Sequence[str] = (), why: str = ""
) -> dict[str, list[tuple[str, str]]]:
    """The ``keys`` (and those of ``optional`` present) of a CLINC150 ``data_*.json``.

    Each is a list of ``[text, intent]`` pairs of strings; anything else raises DataError
    naming the file, the key and the first bad entry, before any loader code trips on it.
    """
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object of split -> list of [text, intent] pairs")
    absent = [repr(key) for key in keys if key not in data]
    if absent:
        raise DataError(
            f"{path} has no {' / '.join(absent)} key{'s' if len(absent) > 1 else ''}{why}"
        )
    out = {}
    for key in [*keys, *(k for k in optional if k in data)]:
        rows = data[key]
        if not isinstance(rows, list):
            raise DataError(f"{path}: {key!r} must be a list of [text, intent] pairs")
        bad = next((n for n, row in enumerate(rows) if not is_pair(row)), None)
        if bad is not None:
            raise DataError(
                f"{path}: {key!r}[{bad}] is {json.dumps(rows[bad])[:60]}, "
                "not a [text, intent] pair of strings"
            )
        out[key] = [(t, i) for t, i in rows]
    return out


def read_domains(path: Path) -> dict[str, list[str]]:
    """CLINC150 ``domains.json``: an object of domain -> list of intent names."""
    domains = read_json(path)
    if not isinstance(domains, dict) or not all(
        isinstance(v, list) and all(isinstance(i, str) for i in v) for v in domains.values()
    ):
        raise DataError(f"{path}: expected an object of domain -> list of intent names")
    return domains


def read_csv_column(
    path: Path, column: str, where: Callable[[dict[str, str]], bool] | None = None
) -> list[str]:
    with need(path).open(newline="", encoding="utf-8") as fh, reading(path):
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise DataError(f"{path} has no column {column!r} (columns: {reader.fieldnames})")
        return [
            row[column].strip()
            for row in reader
            if (row.get(column) or "").strip() and (where is None or where(row))
        ]


def read_csv_rows(
    path: Path, columns: Sequence[str], where: Callable[[dict[str, str]], bool] | None = None
) -> list[tuple[str, ...]]:
    """The stripped ``columns`` of every row (``where`` it holds), in file order."""
    with need(path).open(newline="", encoding="utf-8") as fh, reading(path):
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise DataError(f"{path} has no column {missing} (columns: {reader.fieldnames})")
        return [
            tuple((row.get(c) or "").strip() for c in columns)
            for row in reader
            if where is None or where(row)
        ]
