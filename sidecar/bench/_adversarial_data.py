"""The AdvBench prompts and what each KB's model trains on once they are taken out."""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import DataError
from sidecar.evaluation import KBTask

ADVBENCH_COLUMN = "goal"

_WORDS = re.compile(r"\w+")


def _norm(text: str) -> str:
    """Comparison key of a text: lower-cased, punctuation and spacing ignored (the key
    the evaluation loaders keep training and evaluation texts apart with)."""
    return " ".join(_WORDS.findall(text.lower()))


def read_prompts(path: Path, column: str = ADVBENCH_COLUMN, limit: int | None = None) -> list[str]:
    """The distinct non-empty values of ``column`` in the CSV at ``path``, in file order
    (the first ``limit`` of them when given).

    Raises
    ------
    DataError
        The file is missing, not UTF-8, has no such column, or holds no prompt.
    """
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            if column not in (reader.fieldnames or []):
                raise DataError(f"{path} has no column {column!r} (columns: {reader.fieldnames})")
            values = [(row.get(column) or "").strip() for row in reader]
    except FileNotFoundError:
        raise DataError(f"adversarial prompts not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except (OSError, csv.Error) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    prompts = list(dict.fromkeys(v for v in values if v))
    if not prompts:
        raise DataError(f"{path} holds no prompt in column {column!r}")
    return prompts[:limit] if limit is not None else prompts


@dataclass(frozen=True)
class _Training:
    """What one KB's model trains on once the prompts are taken out."""

    kb: list[str]
    id_queries: list[str]
    id_groups: list[int] | None
    ood_queries: list[str]
    removed: dict[str, int]
    # Held-out dev queries (None on a cross-fitted KB, whose dev queries all train).
    id_eval: list[str] | None
    ood_eval: list[str] | None


def _labels(groups: Sequence[int] | None, n: int, start: int) -> list[int]:
    """``groups`` (or one group per row) shifted to start at ``start``."""
    if groups is None:
        return list(range(start, start + n))
    base = min(groups) if len(groups) else 0
    return [start + g - base for g in groups]


def training_texts(task: KBTask, prompts: Sequence[str]) -> _Training:
    """The KB documents and labelled queries ``task``'s model trains on, none equal to a
    prompt; on a cross-fitted task (covid) its dev evaluation queries train too, since no
    fold is judged here (the prompts among its OOD queries are what is taken out)."""
    held = {_norm(p) for p in prompts}
    removed = {"kb": 0, "id": 0, "ood": 0}

    def keep(kind: str, texts: Sequence[str]) -> list[bool]:
        mask = [_norm(t) not in held for t in texts]
        removed[kind] += mask.count(False)
        return mask

    id_texts, ood_texts = list(task.id_train), list(task.ood_train)
    groups: list[int] | None = None if task.id_train_groups is None else list(task.id_train_groups)
    id_eval: list[str] | None = list(task.id_eval)
    ood_eval: list[str] | None = [t for t in task.ood_eval if _norm(t) not in held]
    if task.cross_fit > 1:
        if groups is not None or task.id_eval_groups is not None:
            a = _labels(groups, len(id_texts), 0)
            groups = a + _labels(task.id_eval_groups, len(task.id_eval), max(a, default=-1) + 1)
        id_texts += task.id_eval
        ood_texts += task.ood_eval
        id_eval = ood_eval = None
    kb_mask, id_mask, ood_mask = (
        keep("kb", task.kb_texts),
        keep("id", id_texts),
        keep("ood", ood_texts),
    )
    return _Training(
        kb=[t for t, k in zip(task.kb_texts, kb_mask, strict=True) if k],
        id_queries=[t for t, k in zip(id_texts, id_mask, strict=True) if k],
        id_groups=None
        if groups is None
        else [g for g, k in zip(groups, id_mask, strict=True) if k],
        ood_queries=list(dict.fromkeys(t for t, k in zip(ood_texts, ood_mask, strict=True) if k)),
        removed=removed,
        id_eval=id_eval,
        ood_eval=ood_eval,
    )
