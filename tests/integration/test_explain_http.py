"""Rule mining through the chat-completions client against a real local HTTP server.

The server (:class:`FakeChatLLM`) answers only from the source markers in the prompt it
gets, so the rules it yields are a declared truth table; its request log shows exactly
which kept sets were sent.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.fake_llm import FakeChatLLM

from sidecar.errors import BlackBoxError, BlackBoxRefused
from sidecar.explain import (
    ChatCompletionsClient,
    Source,
    brute_force_rules,
    explain,
    parse_predicate,
)
from sidecar.explain._lattice import full_mask, holds
from sidecar.settings import ExplainSettings

pytestmark = pytest.mark.integration

N = 5
SOURCES = [
    Source("kb-veltria", "Veltria's capital is Morvane, a port on the Amber Sea."),
    Source("kb-cats", "Cats sleep for most of the day."),
    Source("kb-travel", "Travellers to Veltria land in its capital."),
    Source("kb-morvane", "Morvane is the largest city of its country."),
    Source("kb-rain", "It rains often in the north."),
]
QUERY = "What is the capital of Veltria?"


def truth(kept: int) -> bool:
    """Declared ground truth: S1 alone, or S3 and S4 together, give the right answer."""
    return bool(kept & 0b00001) or kept & 0b01100 == 0b01100


def _client(server: FakeChatLLM, **kw: Any) -> ChatCompletionsClient:
    settings = ExplainSettings(base_url=server.base_url, model="fake", **kw)
    return ChatCompletionsClient(settings, backoff_s=0.01)


def _table(fn: Any = truth) -> dict[int, bool]:
    return {t: bool(fn(t)) for t in range(1 << N)}


def _needed(table: dict[int, bool]) -> set[int]:
    """Kept sets whose lattice node has only valid parents, in either family."""
    full = full_mask(N)
    out = set()
    for node in range(1 << N):
        for rule, kept in (("retention", node), ("omission", full & ~node)):
            parents = [node | 1 << i for i in range(N) if not node >> i & 1]
            if all(holds(rule, p, N, table) for p in parents):  # type: ignore[arg-type]
                out.add(kept)
    return out


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _explain(client: ChatCompletionsClient, **kw: Any) -> Any:
    try:
        return await explain(QUERY, SOURCES, parse_predicate("contains:Morvane"), client, **kw)
    finally:
        await client.aclose()


@pytest.mark.parametrize("miner", ["dual", "mono"])
def test_mined_rules_equal_declared_table_and_pruned_sets_never_sent(miner: str) -> None:
    table = _table()
    with FakeChatLLM(truth) as server:
        result = _run(_explain(_client(server), miner=miner, concurrency=3))
    assert result.report.rules("retention") == brute_force_rules("retention", N, table)
    assert result.report.rules("omission") == brute_force_rules("omission", N, table)
    assert result.rule_ids("retention") == [["kb-veltria"], ["kb-travel", "kb-morvane"]]
    assert result.rule_ids("omission") == []  # with no sources the model does not know
    sent = [r.kept for r in server.answered()]
    assert len(sent) == len(set(sent)) == result.report.calls  # no subset sent twice
    assert set(sent) == _needed(table)  # exactly the unpruned kept sets, nothing else
    assert len(sent) < 1 << N


def test_omission_rules_when_the_model_knows_without_sources() -> None:
    # wrong answer ("not Morvane") unless S2 (a misleading source) is kept
    def misled(kept: int) -> bool:
        return not kept & 0b00010

    with FakeChatLLM(misled) as server:
        result = _run(_explain(_client(server)))
    assert result.rule_ids("omission") == [["kb-cats"]]
    assert result.rule_ids("retention") == []
    assert set(r.kept for r in server.answered()) == _needed(_table(misled))


def test_votes_use_distinct_seeds_and_majority_matches_the_servers_answers() -> None:
    votes = 5
    with FakeChatLLM(truth, noise=0.25, noise_seed=7) as server:
        result = _run(_explain(_client(server, seed=100), votes=votes, seed=100))
        per_kept = Counter(r.kept for r in server.answered())
        assert all(c == votes for c in per_kept.values())
        seeds = {(r.kept, r.seed) for r in server.answered()}
        assert len(seeds) == votes * len(per_kept)
        assert {s for _, s in seeds} == set(range(100, 100 + votes))

        def voted(kept: int) -> bool:
            yes = sum("Morvane" in server._answer(kept, s) for s in range(100, 100 + votes))
            return yes > votes // 2

        table = _table(voted)
    assert result.report.rules("retention") == brute_force_rules("retention", N, table)
    assert result.report.rules("omission") == brute_force_rules("omission", N, table)
    assert result.report.requests == votes * result.report.calls


def test_faults_are_retried_and_rules_stay_exact() -> None:
    table = _table()
    with FakeChatLLM(truth, stall_s=1.0) as server:
        server.inject("429", "500", "timeout", "badjson", "429")
        result = _run(_explain(_client(server, timeout_s=0.3, max_retries=6), concurrency=1))
        faults = [r.fault for r in server.log if r.fault]
    assert faults == ["429", "500", "timeout", "badjson", "429"]
    assert result.report.rules("retention") == brute_force_rules("retention", N, table)
    sent = [r.kept for r in server.answered()]
    assert len(sent) == len(set(sent))


def test_black_box_error_after_retries_and_no_retry_on_404() -> None:
    with FakeChatLLM(truth) as server:
        server.inject("500", "500", "500")
        client = _client(server, max_retries=2)
        with pytest.raises(BlackBoxError, match=r"HTTP 500.*3 attempts"):
            _run(_explain(client, concurrency=1))
        bad = ChatCompletionsClient(
            ExplainSettings(base_url=server.base_url + "/nowhere", max_retries=3)
        )

        async def ask_once() -> str:
            try:
                return await bad.complete([{"role": "user", "content": "hi"}], seed=0)
            finally:
                await bad.aclose()

        with pytest.raises(BlackBoxRefused, match="404") as refused:
            _run(ask_once())
        assert bad.requests_sent == 1  # a 4xx other than 408/409/429 is not retried
        assert not refused.value.retryable  # nor does the CLI say retrying may help


def test_disk_cache_resumes_without_asking_again(tmp_path: Path) -> None:
    with FakeChatLLM(truth) as server:
        first = _run(_explain(_client(server, cache_dir=tmp_path)))
        asked = len(server.log)
        second_client = _client(server, cache_dir=tmp_path)
        second = _run(_explain(second_client))
        assert len(server.log) == asked  # everything came from the cache
    assert second_client.cache_hits == first.report.calls
    assert second.to_dict()["rules"] == first.to_dict()["rules"]
    entry = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert entry["model"] == "fake" and "answer" in entry


def test_judge_predicate_goes_through_the_same_client() -> None:
    table = _table()
    with FakeChatLLM(truth) as server:
        client = _client(server)

        async def go() -> Any:
            try:
                judge = parse_predicate("judge:Does the answer name Morvane?", black_box=client)
                return await explain(QUERY, SOURCES, judge, client)
            finally:
                await client.aclose()

        result = _run(go())
        judged = [r for r in server.log if r.judge]
    assert result.report.rules("retention") == brute_force_rules("retention", N, table)
    assert len(judged) == result.report.calls
