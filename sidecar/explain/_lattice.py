"""Subsets of sources as bitmasks, rule semantics, and the brute-force reference.

Source ``i`` (0-based, in retrieval order) is bit ``1 << i``. A *kept set* ``t`` is the
set of sources the black box sees. ``p(t)`` is the predicate on the black box's answer.

* Retention rule ``S``: ``p(t)`` for every kept set ``t ⊇ S``.
* Omission rule ``S``: ``p(t)`` for every kept set ``t ⊆ full \\ S`` (all of ``S`` dropped).

Both families are closed under supersets of ``S``; only minimal rules are reported.
The brute-force functions here are the slow, obviously-correct reference the miners are
tested against; they read a complete truth table of ``p`` over all ``2**n`` kept sets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

RuleType = Literal["retention", "omission"]
RULE_TYPES: tuple[RuleType, ...] = ("retention", "omission")


def full_mask(n: int) -> int:
    """The set of all ``n`` sources."""
    return (1 << n) - 1


def members(mask: int) -> tuple[int, ...]:
    """Indices of the sources in ``mask``, ascending."""
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def to_mask(indices: Iterator[int] | tuple[int, ...] | list[int] | frozenset[int]) -> int:
    """The bitmask of a collection of source indices."""
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def submasks(mask: int) -> Iterator[int]:
    """Every subset of ``mask``, ``mask`` itself and the empty set included."""
    sub = mask
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & mask


def kept_set(rule: RuleType, node: int, n: int) -> int:
    """The kept set whose answer decides lattice node ``node`` of ``rule``.

    A retention node is read as the kept set itself; an omission node as its complement.
    """
    return node if rule == "retention" else full_mask(n) & ~node


def holds(rule: RuleType, rule_mask: int, n: int, table: Mapping[int, bool]) -> bool:
    """Whether ``rule_mask`` is a rule of type ``rule`` under the truth table ``table``."""
    full = full_mask(n)
    if rule == "retention":
        # every t ⊇ S: t = S | u for u ⊆ full \ S
        return all(table[rule_mask | u] for u in submasks(full & ~rule_mask))
    return all(table[t] for t in submasks(full & ~rule_mask))


def brute_force_rules(rule: RuleType, n: int, table: Mapping[int, bool]) -> list[int]:
    """Minimal rules of type ``rule`` by checking every one of the ``2**n`` candidates.

    Parameters
    ----------
    rule : "retention" or "omission"
    n : int
        Number of sources.
    table : mapping of kept-set mask to bool, with all ``2**n`` keys
        ``p(f(t))`` for every kept set ``t``.

    Returns
    -------
    list of int
        The minimal rules as masks, sorted by (size, mask).
    """
    valid = {s for s in range(1 << n) if holds(rule, s, n, table)}
    minimal = [s for s in valid if not any(sub in valid for sub in submasks(s) if sub != s)]
    return sort_masks(minimal)


def sort_masks(masks: list[int] | set[int]) -> list[int]:
    """Masks ordered by size, then by value (a stable, readable order for reports)."""
    return sorted(masks, key=lambda m: (m.bit_count(), m))
