"""The rules benchmark's building blocks on tiny inputs."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from sidecar.explain._bench import (
    SimulatedHotpotLLM,
    compare_miners,
    hotpot_record,
    load_hotpot,
    summarise,
    synthetic_table,
)


def test_compare_miners_is_exact_on_every_synthetic_kind() -> None:
    recs = []
    for kind in ("monotone", "antitone", "monotone_noisy", "random"):
        table = synthetic_table(kind, 6, random.Random(kind))

        async def sample(mask: int, i: int, table: dict[int, bool] = table) -> bool:
            return table[mask]

        rec = asyncio.run(compare_miners(6, sample, brute=True))
        assert rec["exact"] is True
        assert rec["evaluations"]["dual"] <= rec["evaluations"]["two_mono_shared_cache"]
        assert 0 < rec["dual_vs_two_mono_calls"] <= 1
        recs.append(rec)
    assert summarise(recs)["exact"] == "4/4"


def test_monotone_tables_are_monotone() -> None:
    table = synthetic_table("monotone", 5, random.Random(3))
    assert all(table[t | 1 << i] >= table[t] for t in range(32) for i in range(5))


def test_hotpot_loader_and_simulated_black_box(shared_data: Path) -> None:
    path = shared_data / "hotpotqa" / "hotpotqa_train_hipporag100.jsonl"
    items = load_hotpot(path, limit=2, n_sources=4)
    assert len(items) == 2 and all(len(it.sources) == 4 for it in items)
    assert all(len(it.supporting) == 2 for it in items)
    rec = asyncio.run(hotpot_record(items[0], SimulatedHotpotLLM(items[0], 0), brute=True))
    assert rec["exact"] is True
    assert rec["answer_all_sources"] == items[0].answer
    support = sum(1 << i for i in items[0].supporting)
    # the simulated box answers from supporting paragraphs only
    assert all(sum(1 << i for i in r) & support == sum(1 << i for i in r)
               for r in rec["rules"]["retention"])  # fmt: skip
