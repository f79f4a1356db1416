"""One explanation: a query, its sources, a predicate and a black box in; rules out."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.errors import ConfigError
from sidecar.explain._client import BlackBox
from sidecar.explain._evaluate import SubsetEvaluator
from sidecar.explain._lattice import RULE_TYPES, RuleType, full_mask, members
from sidecar.explain._miner import DualMiner, FamilyResult, MiningReport, MonoMiner
from sidecar.explain._predicates import Predicate
from sidecar.explain._prompt import Source, build_messages

log = logging.getLogger(__name__)

MinerName = Literal["mono", "dual"]


@dataclass
class Explanation:
    """Minimal rules over ``sources`` with the cost of finding them."""

    sources: list[Source]
    predicate: str
    black_box: str
    votes: int
    report: MiningReport
    answers: dict[int, list[str]] = field(default_factory=dict, repr=False)

    def rule_ids(self, rule: RuleType) -> list[list[str]]:
        """Each minimal rule as the ids of its sources."""
        return [[self.sources[i].id for i in members(m)] for m in self.report.rules(rule)]

    def to_dict(self) -> dict[str, Any]:
        n = len(self.sources)
        return {
            "predicate": self.predicate,
            "black_box": self.black_box,
            "votes": self.votes,
            "n_sources": n,
            "source_ids": [s.id for s in self.sources],
            "rules": {r: self.rule_ids(r) for r in self.report.families},
            "answer_all_sources": self.answers.get(full_mask(n), [None])[0],
            "answer_no_sources": self.answers.get(0, [None])[0],
            "stats": self.report.to_dict(),
        }

    def render(self, width: int = 60) -> str:
        """The rules for a terminal: one line per rule, one indented line per source."""
        lines = []
        for rule, fam in self.report.families.items():
            what = "keeping" if rule == "retention" else "dropping"
            lines.append(
                f"{rule} rules ({len(fam.rules)}; {what} these sources makes "
                f"'{self.predicate}' hold; {fam.nodes_evaluated}/{fam.nodes_total} "
                f"nodes evaluated, {fam.pruned_share:.0%} pruned):"
            )
            if not fam.rules:
                lines.append("  (none)")
            for m in fam.rules:
                if m == 0:
                    lines.append("  {} - holds whatever the sources")
                    continue
                ids = ", ".join(self.sources[i].id for i in members(m))
                lines.append(f"  {{{ids}}}")
                for i in members(m):
                    lines.append(f"    {self.sources[i].id}: {self.sources[i].snippet(width)}")
        r = self.report
        lines.append(
            f"black-box calls: {r.calls} subsets ({r.requests} requests), "
            f"cache hits: {r.cache_hits}, wall: {r.wall_s:.2f} s"
        )
        return "\n".join(lines)


def _merge(reports: list[MiningReport], miner: str, extra: dict[str, Any]) -> MiningReport:
    families: dict[RuleType, FamilyResult] = {}
    for rep in reports:
        families.update(rep.families)
    return MiningReport(
        miner=miner,
        n=reports[0].n,
        families=families,
        calls=sum(r.calls for r in reports),
        requests=sum(r.requests for r in reports),
        cache_hits=sum(r.cache_hits for r in reports),
        wall_s=sum(r.wall_s for r in reports),
        extra=extra,
    )


async def explain(
    query: str,
    sources: Sequence[Source],
    predicate: Predicate,
    black_box: BlackBox,
    *,
    rules: Sequence[RuleType] = RULE_TYPES,
    miner: MinerName = "dual",
    votes: int = 1,
    seed: int = 0,
    concurrency: int = 4,
    progress: Callable[[int, bool], None] | None = None,
) -> Explanation:
    """Mine the minimal rules of ``predicate`` over ``sources`` for ``query``.

    Vote ``i`` of a kept set asks the black box with seed ``seed + i``. ``mono`` with
    both rule types runs two Mono passes that share one evaluation cache. ``progress`` is
    called with ``(kept_mask, value)`` after each newly evaluated kept set.
    """
    wanted = tuple(dict.fromkeys(rules))
    if not wanted or any(r not in RULE_TYPES for r in wanted):
        raise ConfigError(f"rules must be a non-empty subset of {RULE_TYPES}, got {rules}")
    if miner not in ("mono", "dual"):
        raise ConfigError(f"miner must be 'mono' or 'dual', got {miner!r}")
    srcs = list(sources)
    answers: dict[int, list[str]] = {}

    async def sample(mask: int, i: int) -> bool:
        answer = await black_box.complete(build_messages(query, srcs, mask), seed=seed + i)
        votes_of = answers.setdefault(mask, [])
        # By vote, not by which call finished first: answer_all_sources is vote 0's.
        votes_of.extend([""] * (i + 1 - len(votes_of)))
        votes_of[i] = answer
        return await predicate(answer)

    evaluator = SubsetEvaluator(
        sample, votes=votes, seed=seed, concurrency=concurrency, on_evaluated=progress
    )
    n = len(srcs)
    if miner == "dual":
        report = await DualMiner(wanted).mine(n, evaluator)
    else:
        parts = [await MonoMiner(r).mine(n, evaluator) for r in wanted]
        report = _merge(parts, "mono", {})
    log.info(
        "explained over %s sources: %s calls, %s cache hits, %.2f s",
        n,
        report.calls,
        report.cache_hits,
        report.wall_s,
    )
    return Explanation(
        sources=srcs,
        predicate=predicate.spec,
        black_box=black_box.name,
        votes=votes,
        report=report,
        answers=answers,
    )
