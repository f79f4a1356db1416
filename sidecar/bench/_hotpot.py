"""HotpotQA questions for ``sidecar bench rules``: the reader and the stand-in black boxes.

Each question's paragraphs become the sources the miners keep or drop; the simulated black
box answers from HotpotQA's supporting facts, the memo keeps a real LLM from answering one
(prompt, seed) twice.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from sidecar._input_files import input_file
from sidecar.errors import DataError
from sidecar.explain import BlackBox, Messages, Source, to_mask


@dataclass
class HotpotItem:
    qid: str
    question: str
    answer: str
    sources: list[Source]
    supporting: list[int]  # indices into sources


_HOTPOT_FIELDS = ("_id", "question", "answer", "supporting_facts", "context")


def load_hotpot(path: Path, *, limit: int, n_sources: int, skip: int = 0) -> list[HotpotItem]:
    """Questions with ``n_sources`` paragraphs each: supporting ones plus distractors,
    in the dataset's order.

    Blank lines are ignored; a file that is not UTF-8, a line that is not a record, or no
    record at all (after ``skip``) raises DataError naming the file (and the line).
    """
    items: list[HotpotItem] = []
    records = 0
    try:
        found = input_file(path, "a HotpotQA JSONL file", missing=f"file not found: {path}")
        with found.open(encoding="utf-8") as fh:
            for k, line in enumerate(fh):
                if not line.strip():
                    continue
                records += 1
                if records <= skip:
                    continue
                if len(items) >= limit:
                    break
                items.append(_hotpot_item(path, k + 1, line, n_sources))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    if limit and not items:
        after = f" after skipping {skip}" if skip else ""
        raise DataError(f"{path}: holds no HotpotQA records{after}")
    return items


def _hotpot_item(path: Path, lineno: int, line: str, n_sources: int) -> HotpotItem:
    where = f"{path}:{lineno}: not a HotpotQA record"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} ({exc})") from exc
    if not isinstance(doc, dict):
        raise DataError(f"{where} (a JSON {type(doc).__name__}, not an object)")
    missing = [f for f in _HOTPOT_FIELDS if f not in doc]
    if missing:
        raise DataError(f"{where}: no field {', '.join(map(repr, missing))}")
    if not isinstance(doc["question"], str) or not isinstance(doc["answer"], str):
        raise DataError(f"{where}: 'question' and 'answer' must be strings")
    try:
        titles = {t for t, _ in doc["supporting_facts"]}
        paras = [(t, "".join(sents).strip()) for t, sents in doc["context"]]
    except (TypeError, ValueError) as exc:
        # e.g. a fact that is not a [title, sentence] pair, or a paragraph that is no list
        raise DataError(f"{where}: bad 'supporting_facts' or 'context' ({exc})") from exc
    support = [i for i, (t, _) in enumerate(paras) if t in titles]
    others = [i for i, (t, _) in enumerate(paras) if t not in titles]
    keep = sorted(support + others[: max(0, n_sources - len(support))])[:n_sources]
    sources = [Source(paras[i][0], f"{paras[i][0]}: {paras[i][1]}") for i in keep]
    supporting = [j for j, i in enumerate(keep) if i in support]
    return HotpotItem(str(doc["_id"]), doc["question"], doc["answer"], sources, supporting)


class SimulatedHotpotLLM:
    """A stand-in black box on HotpotQA structure (NOT a language model).

    It answers with the gold answer iff every supporting paragraph is kept, or, with a
    seeded per-question chance of 30%, iff any one of them is (a model that can guess the
    bridge entity); otherwise a distractor title.
    """

    def __init__(self, item: HotpotItem, seed: int) -> None:
        self.item = item
        rng = random.Random(f"{seed}:{item.qid}")
        self.lenient = rng.random() < 0.3
        self.support = to_mask(item.supporting)

    @property
    def name(self) -> str:
        return "simulated-hotpotqa"

    async def complete(self, messages: Messages, *, seed: int) -> str:
        text = messages[-1]["content"]
        kept = to_mask(i for i, s in enumerate(self.item.sources) if f"] {s.text}" in text)
        ok = (kept & self.support) == self.support or (self.lenient and kept & self.support)
        return self.item.answer if ok else "I cannot tell."

    async def aclose(self) -> None:
        return None


class MemoBlackBox:
    """Answers memoised in memory by (prompt, seed): each is asked of ``inner`` once."""

    def __init__(self, inner: BlackBox) -> None:
        self.inner = inner
        self._memo: dict[str, str] = {}
        self.asked = 0

    @property
    def name(self) -> str:
        return self.inner.name

    async def complete(self, messages: Messages, *, seed: int) -> str:
        key = json.dumps([messages, seed])
        if key not in self._memo:
            self.asked += 1
            self._memo[key] = await self.inner.complete(messages, seed=seed)
        return self._memo[key]

    async def aclose(self) -> None:
        await self.inner.aclose()


def count_records(path: Path) -> int:
    """The non-blank lines of a JSONL file (what load_hotpot counts as records)."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        return sum(1 for line in fh if line.strip())
