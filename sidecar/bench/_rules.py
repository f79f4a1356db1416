"""``sidecar bench rules``: exactness and pruning of the miners, synthetic and HotpotQA.

Each record compares, on one black box, Mono retention, Mono omission (each with a fresh
evaluation cache), the two Mono passes sharing one cache, Dual, and (where ``n`` is small
enough) brute force over all ``2**n`` kept sets. Answers are memoised underneath, so a
real LLM answers each (prompt, seed) once however many miners ask.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar._input_files import input_file
from sidecar.errors import DataError
from sidecar.explain import (
    RULE_TYPES,
    BlackBox,
    Contains,
    DualMiner,
    Messages,
    MonoMiner,
    Source,
    SubsetEvaluator,
    brute_force_rules,
    build_messages,
    full_mask,
    members,
    to_mask,
)

PAPER_PRUNED_SHARE = {"omission": 0.70, "retention": 0.50}

SampleFn = Callable[[int, int], Awaitable[bool]]


def synthetic_table(kind: str, n: int, rng: random.Random) -> dict[int, bool]:
    """A seeded truth table over ``2**n`` kept sets.

    ``monotone``: the answer is right iff some support set (1-3 sets of 1-3 sources) is
    kept, like "the answer contains the gold answer". ``antitone``: its negation, like
    "the answer is wrong". ``monotone_noisy``: ``monotone`` with 3% of the cells flipped
    (a stochastic LLM). ``random``: an independent coin per cell, with a bias drawn per
    table in [0.3, 0.95].
    """
    size = 1 << n
    if kind == "random":
        bias = rng.uniform(0.3, 0.95)
        return {t: rng.random() < bias for t in range(size)}
    terms = [
        to_mask(rng.sample(range(n), rng.randint(1, min(3, n)))) for _ in range(rng.randint(1, 3))
    ]
    table = {t: any(t & m == m for m in terms) for t in range(size)}
    if kind == "monotone_noisy":
        for t in range(size):
            if rng.random() < 0.03:
                table[t] = not table[t]
    elif kind == "antitone":
        table = {t: not v for t, v in table.items()}
    elif kind != "monotone":
        raise ValueError(f"unknown table kind {kind!r}")
    return table


async def compare_miners(n: int, sample: SampleFn, *, brute: bool) -> dict[str, Any]:
    """Run every miner on one black box; return one record's numbers."""

    def fresh() -> SubsetEvaluator:
        return SubsetEvaluator(sample, concurrency=8)

    mono = {r: await MonoMiner(r).mine(n, fresh()) for r in RULE_TYPES}
    shared = fresh()
    shared_calls = 0
    for r in RULE_TYPES:
        shared_calls += (await MonoMiner(r).mine(n, shared)).calls
    dual = await DualMiner().mine(n, fresh())
    two_mono = mono["retention"].calls + mono["omission"].calls
    rec: dict[str, Any] = {
        "n": n,
        "lattice_nodes": 1 << n,
        "rules": {r: [list(members(m)) for m in dual.rules(r)] for r in RULE_TYPES},
        "evaluations": {
            "mono": {r: mono[r].calls for r in RULE_TYPES},
            "dual": dual.calls,
            "two_mono_shared_cache": shared_calls,
        },
        "pruned_share": {
            "mono": {r: round(mono[r].families[r].pruned_share, 4) for r in RULE_TYPES},
            "dual": {r: round(dual.families[r].pruned_share, 4) for r in RULE_TYPES},
        },
        "dual_vs_two_mono_calls": round(dual.calls / two_mono, 4),
        "dual_vs_two_mono_shared_cache": round(dual.calls / shared_calls, 4),
        "wall_s": {"dual": round(dual.wall_s, 4)},
        "exact": None,
    }
    same = all(mono[r].rules(r) == dual.rules(r) for r in RULE_TYPES)
    if brute:
        ev = fresh()
        table = await ev.evaluate(range(1 << n))
        want = {r: brute_force_rules(r, n, table) for r in RULE_TYPES}
        rec["exact"] = same and all(dual.rules(r) == want[r] for r in RULE_TYPES)
        rec["evaluations"]["brute_force"] = 1 << n
    else:
        rec["mono_equals_dual"] = same
    return rec


def summarise(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Medians over records of pruned shares and the Dual / two-Mono ratio."""
    recs = list(records)
    if not recs:
        return {}

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 4)

    out: dict[str, Any] = {"records": len(recs)}
    for r in RULE_TYPES:
        shares = [x["pruned_share"]["mono"][r] for x in recs]
        out[f"pruned_share_{r}_median"] = med(shares)
        out[f"pruned_share_{r}_max"] = round(max(shares), 4)
    out["dual_vs_two_mono_calls_median"] = med([x["dual_vs_two_mono_calls"] for x in recs])
    exact = [x["exact"] for x in recs if x["exact"] is not None]
    out["exact"] = f"{sum(exact)}/{len(exact)}" if exact else "n/a"
    return out


# --- HotpotQA ---------------------------------------------------------------------------


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


async def hotpot_record(
    item: HotpotItem, black_box: BlackBox, *, brute: bool, seed: int = 0
) -> dict[str, Any]:
    """One HotpotQA question through every miner; the predicate: answer contains gold."""
    memo = MemoBlackBox(black_box)
    predicate = Contains(item.answer)

    async def sample(mask: int, i: int) -> bool:
        answer = await memo.complete(build_messages(item.question, item.sources, mask), seed=seed)
        return await predicate(answer)

    start = time.perf_counter()
    rec = await compare_miners(len(item.sources), sample, brute=brute)
    n = len(item.sources)
    full_answer = await memo.complete(
        build_messages(item.question, item.sources, full_mask(n)), seed=seed
    )
    rec.update(
        qid=item.qid,
        gold=item.answer,
        answer_all_sources=full_answer,
        supporting=item.supporting,
        distinct_llm_answers=memo.asked,
        wall_s_total=round(time.perf_counter() - start, 2),
    )
    return rec
