"""Exact minimal retention and omission rules by a pruned top-down lattice walk.

The lattice of one rule type has a node per subset ``S`` of the ``n`` sources; the
parents of ``S`` are ``S ∪ {i}``. Since both rule families are closed under supersets,
``S`` is a rule iff ``p`` holds at its kept set *and* every parent is a rule. So the walk
goes breadth-first from the full set down, evaluates a node only when all its parents are
valid (an invalid node prunes every descendant), and reports the valid nodes none of
whose children is valid: exactly the minimal rules.

* :class:`MonoMiner` walks one rule type.
* :class:`DualMiner` walks both in one pass: at step ``k`` it needs retention nodes of
  size ``n - k`` (kept set = the node) and omission nodes of size ``n - k`` (kept set = the
  complement, of size ``k``), and evaluates the union once through the shared
  :class:`~sidecar.explain._evaluate.SubsetEvaluator`. Each walk's decisions depend only
  on ``p``, so Dual sends exactly the kept sets that two Mono passes sharing a cache would
  send, never more, and fewer than two independent passes whenever the walks overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.errors import ConfigError
from sidecar.explain._evaluate import SubsetEvaluator
from sidecar.explain._lattice import (
    RULE_TYPES,
    RuleType,
    full_mask,
    kept_set,
    members,
    sort_masks,
)

log = logging.getLogger(__name__)

MAX_SOURCES = 20


@dataclass
class FamilyResult:
    """Minimal rules of one type and how much of its lattice was walked."""

    rule: RuleType
    n: int
    rules: list[int]
    nodes_evaluated: int
    levels_walked: int

    @property
    def nodes_total(self) -> int:
        return 1 << self.n

    @property
    def nodes_pruned(self) -> int:
        return self.nodes_total - self.nodes_evaluated

    @property
    def pruned_share(self) -> float:
        return self.nodes_pruned / self.nodes_total

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "rules": [list(members(m)) for m in self.rules],
            "nodes_total": self.nodes_total,
            "nodes_evaluated": self.nodes_evaluated,
            "nodes_pruned": self.nodes_pruned,
            "pruned_share": round(self.pruned_share, 4),
            "levels_walked": self.levels_walked,
        }


@dataclass
class MiningReport:
    """What one miner run found and cost (counters are deltas over this run)."""

    miner: str
    n: int
    families: dict[RuleType, FamilyResult]
    calls: int
    requests: int
    cache_hits: int
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def rules(self, rule: RuleType) -> list[int]:
        return self.families[rule].rules

    def to_dict(self) -> dict[str, Any]:
        return {
            "miner": self.miner,
            "n": self.n,
            "families": {r: f.to_dict() for r, f in self.families.items()},
            "black_box_calls": self.calls,
            "black_box_requests": self.requests,
            "cache_hits": self.cache_hits,
            "wall_s": round(self.wall_s, 4),
            **self.extra,
        }


class _Walk:
    """The breadth-first state of one rule type's lattice."""

    def __init__(self, rule: RuleType, n: int) -> None:
        self.rule = rule
        self.n = n
        self.level = n
        self.candidates: list[int] = [full_mask(n)]
        self.valid_prev: set[int] = set()  # valid nodes of the level above the candidates
        self.minimal: list[int] = []
        self.nodes_evaluated = 0
        self.levels_walked = 0

    @property
    def done(self) -> bool:
        return not self.candidates

    def pending(self) -> list[int]:
        """Kept sets that decide the current candidates."""
        return [kept_set(self.rule, node, self.n) for node in self.candidates]

    def advance(self, values: Mapping[int, bool]) -> None:
        """Take the predicate values of the current level and build the next one."""
        valid = {node for node in self.candidates if values[kept_set(self.rule, node, self.n)]}
        self.nodes_evaluated += len(self.candidates)
        self.levels_walked += 1
        # A valid node of the level above is minimal iff none of its children is valid.
        for node in self.valid_prev:
            if not any(node & ~(1 << i) in valid for i in members(node)):
                self.minimal.append(node)
        self.valid_prev = valid
        self.level -= 1
        self.candidates = self._children(valid) if self.level >= 0 else []
        if not self.candidates:
            self.minimal.extend(valid)  # their children are all invalid or pruned

    def _children(self, valid: set[int]) -> list[int]:
        full = full_mask(self.n)
        out: set[int] = set()
        for node in valid:
            for i in members(node):
                child = node & ~(1 << i)
                if child in out:
                    continue
                missing = full & ~child
                if all(child | (1 << j) in valid for j in members(missing)):
                    out.add(child)
        return sorted(out)

    def result(self) -> FamilyResult:
        return FamilyResult(
            rule=self.rule,
            n=self.n,
            rules=sort_masks(self.minimal),
            nodes_evaluated=self.nodes_evaluated,
            levels_walked=self.levels_walked,
        )


def _check_n(n: int) -> None:
    if not 0 <= n <= MAX_SOURCES:
        raise ConfigError(f"rule mining supports 0..{MAX_SOURCES} sources, got {n}")


async def _run(miner: str, walks: list[_Walk], evaluator: SubsetEvaluator) -> MiningReport:
    n = walks[0].n
    before = (evaluator.stats.calls, evaluator.stats.requests, evaluator.stats.cache_hits)
    start = time.perf_counter()
    while not all(w.done for w in walks):
        active = [w for w in walks if not w.done]
        wanted = [mask for w in active for mask in w.pending()]
        values = await evaluator.evaluate(wanted)
        for w in active:
            w.advance(values)
        log.debug("%s: level step done, %s kept sets asked", miner, len(wanted))
    wall = time.perf_counter() - start
    return MiningReport(
        miner=miner,
        n=n,
        families={w.rule: w.result() for w in walks},
        calls=evaluator.stats.calls - before[0],
        requests=evaluator.stats.requests - before[1],
        cache_hits=evaluator.stats.cache_hits - before[2],
        wall_s=wall,
    )


class MonoMiner:
    """One rule type per pass.

    Parameters
    ----------
    rule : "retention" or "omission"
    """

    def __init__(self, rule: RuleType) -> None:
        if rule not in RULE_TYPES:
            raise ConfigError(f"unknown rule type {rule!r}; expected one of {RULE_TYPES}")
        self.rule = rule

    async def mine(self, n: int, evaluator: SubsetEvaluator) -> MiningReport:
        """Minimal rules over ``n`` sources, asking ``evaluator`` for kept-set values."""
        _check_n(n)
        return await _run(f"mono-{self.rule}", [_Walk(self.rule, n)], evaluator)


class DualMiner:
    """Both rule types in one pass over a shared evaluation cache.

    Parameters
    ----------
    rules : tuple of rule types
        Which families to report (both by default; one makes it a Mono walk).
    """

    def __init__(self, rules: tuple[RuleType, ...] = RULE_TYPES) -> None:
        bad = [r for r in rules if r not in RULE_TYPES]
        if bad or not rules:
            raise ConfigError(f"rule types must be a non-empty subset of {RULE_TYPES}")
        self.rules = tuple(dict.fromkeys(rules))

    async def mine(self, n: int, evaluator: SubsetEvaluator) -> MiningReport:
        """Minimal rules of every requested type over ``n`` sources, in one walk."""
        _check_n(n)
        return await _run("dual", [_Walk(r, n) for r in self.rules], evaluator)
