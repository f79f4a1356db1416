"""The rule miners compared on one black box, for ``sidecar bench rules``: exactness and pruning.

Each record compares, on one black box, Mono retention, Mono omission (each with a fresh
evaluation cache), the two Mono passes sharing one cache, Dual, and (where ``n`` is small
enough) brute force over all ``2**n`` kept sets. Answers are memoised underneath, so a
real LLM answers each (prompt, seed) once however many miners ask.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sidecar.bench._hotpot import HotpotItem, MemoBlackBox
from sidecar.explain import (
    RULE_TYPES,
    BlackBox,
    Contains,
    DualMiner,
    MonoMiner,
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
