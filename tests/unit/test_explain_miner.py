"""Exactness of the Mono and Dual miners against brute force over all 2**n kept sets."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import ConfigError
from sidecar.explain._evaluate import SubsetEvaluator
from sidecar.explain._lattice import (
    brute_force_rules,
    full_mask,
    holds,
    kept_set,
    submasks,
    to_mask,
)
from sidecar.explain._miner import DualMiner, MonoMiner


def _evaluator(table: dict[int, bool], **kw: int) -> SubsetEvaluator:
    async def sample(mask: int, i: int) -> bool:
        return table[mask]

    return SubsetEvaluator(sample, **kw)


@st.composite
def tables(draw: st.DrawFn, max_n: int = 10) -> tuple[int, dict[int, bool]]:
    """Random truth tables: arbitrary (non-monotone), monotone (DNF) or near-constant."""
    n = draw(st.integers(0, max_n))
    kind = draw(st.sampled_from(["random", "dnf_up", "dnf_down", "mostly_true"]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    size = 1 << n
    if kind == "random":
        p = rng.random()
        table = {t: rng.random() < p for t in range(size)}
    elif kind == "mostly_true":
        table = {t: rng.random() < 0.97 for t in range(size)}
    else:
        terms = [
            to_mask([i for i in range(n) if rng.random() < 0.3]) for _ in range(rng.randint(0, 3))
        ]
        up = {t: any(t & term == term for term in terms) for t in range(size)}
        table = up if kind == "dnf_up" else {t: not v for t, v in up.items()}
        for t in range(size):  # a little noise makes them non-monotone
            if rng.random() < 0.02:
                table[t] = not table[t]
    return n, table


def _mine_all(n: int, table: dict[int, bool]) -> dict[str, object]:
    async def go() -> dict[str, object]:
        mono_r = await MonoMiner("retention").mine(n, _evaluator(table))
        mono_o = await MonoMiner("omission").mine(n, _evaluator(table))
        shared = _evaluator(table)
        shared_r = await MonoMiner("retention").mine(n, shared)
        shared_o = await MonoMiner("omission").mine(n, shared)
        dual = await DualMiner().mine(n, _evaluator(table, concurrency=3))
        return {
            "mono_r": mono_r,
            "mono_o": mono_o,
            "shared_calls": shared_r.calls + shared_o.calls,
            "dual": dual,
        }

    return asyncio.run(go())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_mono_and_dual_equal_brute_force(case: tuple[int, dict[int, bool]]) -> None:
    n, table = case
    out = _mine_all(n, table)
    mono_r, mono_o, dual = out["mono_r"], out["mono_o"], out["dual"]
    want_r = brute_force_rules("retention", n, table)
    want_o = brute_force_rules("omission", n, table)
    assert mono_r.rules("retention") == want_r  # type: ignore[attr-defined]
    assert mono_o.rules("omission") == want_o  # type: ignore[attr-defined]
    assert dual.rules("retention") == want_r  # type: ignore[attr-defined]
    assert dual.rules("omission") == want_o  # type: ignore[attr-defined]
    for report in (mono_r, mono_o, dual):
        assert report.calls <= 1 << n  # type: ignore[attr-defined]
    assert dual.calls <= out["shared_calls"]  # type: ignore[attr-defined]
    assert dual.calls <= mono_r.calls + mono_o.calls  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(tables(max_n=8))
def test_walk_evaluates_only_nodes_whose_parents_are_valid(
    case: tuple[int, dict[int, bool]],
) -> None:
    n, table = case
    for rule in ("retention", "omission"):
        ev = _evaluator(table)
        report = asyncio.run(MonoMiner(rule).mine(n, ev))  # type: ignore[arg-type]
        assert len(ev.order) == len(set(ev.order)) == report.calls
        for t in ev.order:
            node = t if rule == "retention" else full_mask(n) & ~t
            # every strict ancestor of an evaluated node is a rule, hence had p true
            for i in range(n):
                if not node >> i & 1:
                    assert holds(rule, node | 1 << i, n, table)  # type: ignore[arg-type]
        fam = report.families[rule]  # type: ignore[index]
        assert fam.nodes_evaluated + fam.nodes_pruned == 1 << n


def test_known_table_retention_and_omission() -> None:
    # p(t) = source 0 kept, or both 1 and 2 kept
    n = 3
    table = {t: bool(t & 1) or (t & 6) == 6 for t in range(8)}
    dual = asyncio.run(DualMiner().mine(n, _evaluator(table)))
    assert dual.rules("retention") == [0b001, 0b110]
    # p false for the empty kept set: no omission rule at all, one call decides it
    assert dual.rules("omission") == []
    assert dual.families["omission"].nodes_evaluated == 1
    assert dual.families["omission"].pruned_share == pytest.approx(7 / 8)


def test_constant_true_gives_empty_rule_and_false_gives_none() -> None:
    n = 4
    yes = asyncio.run(DualMiner().mine(n, _evaluator({t: True for t in range(16)})))
    assert yes.rules("retention") == [0] and yes.rules("omission") == [0]
    assert yes.calls == 16
    no = asyncio.run(DualMiner().mine(n, _evaluator({t: False for t in range(16)})))
    assert no.rules("retention") == [] and no.rules("omission") == []
    assert no.calls == 2  # the full set and the empty set


def test_dual_saves_calls_where_walks_overlap() -> None:
    n = 4
    table = {t: True for t in range(16)}
    r = asyncio.run(MonoMiner("retention").mine(n, _evaluator(table)))
    o = asyncio.run(MonoMiner("omission").mine(n, _evaluator(table)))
    d = asyncio.run(DualMiner().mine(n, _evaluator(table)))
    assert d.calls == 16 < r.calls + o.calls == 32
    assert d.cache_hits == 16


def test_kept_set_reads_omission_nodes_as_complements() -> None:
    assert kept_set("retention", 0b0101, 4) == 0b0101
    assert kept_set("omission", 0b0101, 4) == 0b1010
    assert sorted(submasks(0b101)) == [0, 1, 4, 5]


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        MonoMiner("both")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        DualMiner(())
    with pytest.raises(ConfigError):
        asyncio.run(MonoMiner("retention").mine(40, _evaluator({})))
