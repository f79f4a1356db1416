"""The shared, memoised, concurrent evaluation of ``p(f(t))`` over kept sets.

Every miner asks one :class:`SubsetEvaluator` for the predicate value of kept sets. It
evaluates each distinct kept set at most once (a cached or in-flight subset is never
sampled again), runs a whole lattice level concurrently under a semaphore, and takes a
seeded majority vote over ``votes`` samples for stochastic black boxes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

#: ``sample(kept_mask, sample_index) -> bool``: the predicate on one black-box answer.
SampleFn = Callable[[int, int], Awaitable[bool]]


@dataclass
class EvaluatorStats:
    """Counters since the evaluator was built.

    ``calls`` counts distinct kept sets sent to the black box; ``requests`` counts single
    samples (``calls * votes``); ``lookups - calls`` are served from the cache.
    """

    calls: int = 0
    requests: int = 0
    lookups: int = 0

    @property
    def cache_hits(self) -> int:
        return self.lookups - self.calls


class SubsetEvaluator:
    """Memoised predicate values of kept sets, with bounded concurrency and voting.

    Parameters
    ----------
    sample : SampleFn
        ``await sample(mask, i)`` returns the predicate on the ``i``-th sampled answer
        for the kept set ``mask`` (``i`` in ``range(votes)``; the black box maps it to a
        seed).
    votes : int
        Samples per kept set; the majority decides, ties are broken by a coin seeded with
        ``(seed, mask)`` so reruns agree.
    seed : int
        Seed of the tie-breaking coin.
    concurrency : int
        Most samples in flight at once.
    on_evaluated : callable ``(mask, value) -> None``, optional
        Called once per newly evaluated kept set (progress bars, audit logs).
    """

    def __init__(
        self,
        sample: SampleFn,
        *,
        votes: int = 1,
        seed: int = 0,
        concurrency: int = 4,
        on_evaluated: Callable[[int, bool], None] | None = None,
    ) -> None:
        if votes < 1 or concurrency < 1:
            raise ConfigError("votes and concurrency must be at least 1")
        self._sample = sample
        self._on_evaluated = on_evaluated
        self.votes = votes
        self.seed = seed
        self.concurrency = concurrency
        self.stats = EvaluatorStats()
        self._cache: dict[int, bool] = {}
        self._inflight: dict[int, asyncio.Future[bool]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        #: kept sets in the order their evaluation started (for audits and tests)
        self.order: list[int] = []

    @property
    def cache(self) -> dict[int, bool]:
        """A copy of the memoised values: kept-set mask -> predicate."""
        return dict(self._cache)

    async def evaluate(self, masks: Iterable[int]) -> dict[int, bool]:
        """Predicate values for ``masks``, evaluating the uncached ones concurrently.

        Duplicates in ``masks`` count as lookups but are evaluated once.
        """
        wanted = list(masks)
        self.stats.lookups += len(wanted)
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        waits: dict[int, asyncio.Future[bool]] = {}
        for mask in wanted:
            if mask in self._cache or mask in waits:
                continue
            fut = self._inflight.get(mask)
            if fut is None:
                fut = asyncio.ensure_future(self._evaluate_one(mask))
                self._inflight[mask] = fut
                self.stats.calls += 1
                self.order.append(mask)
            waits[mask] = fut
        if waits:
            try:
                await asyncio.gather(*waits.values())
            except BaseException:
                for fut in waits.values():  # one failed: stop asking for the rest
                    fut.cancel()
                raise
        return {mask: self._cache[mask] for mask in wanted}

    async def _evaluate_one(self, mask: int) -> bool:
        assert self._semaphore is not None
        try:

            async def one(i: int) -> bool:
                assert self._semaphore is not None
                async with self._semaphore:
                    self.stats.requests += 1
                    return bool(await self._sample(mask, i))

            results = await asyncio.gather(*(one(i) for i in range(self.votes)))
            value = self._majority(mask, results)
            self._cache[mask] = value
            if self._on_evaluated is not None:
                self._on_evaluated(mask, value)
            return value
        finally:
            self._inflight.pop(mask, None)

    def _majority(self, mask: int, results: list[bool]) -> bool:
        yes = sum(results)
        no = len(results) - yes
        if yes != no:
            return yes > no
        coin = random.Random(f"{self.seed}:{mask}").random() < 0.5
        log.debug("tie in %s votes for kept set %s, coin says %s", len(results), mask, coin)
        return coin
