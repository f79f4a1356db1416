"""The one-standard-error shortlist: which grid candidates validation cannot tell apart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.errors import ConfigError
from sidecar.training._metrics import auroc_standard_error

# How the search shortlists its candidates (see shortlist).
SELECTIONS = ("one_se", "best")


@dataclass(frozen=True)
class Ranked:
    """One fitted candidate's validation figures, as :func:`shortlist` sees them."""

    val_auroc: float
    dims: int
    n_id: int
    n_ood: int


def shortlist(rows: Sequence[Ranked], selection: str = "one_se") -> list[int]:
    """Positions in ``rows`` (grid order) of the candidates validation cannot tell apart,
    in the order validation prefers them; the first is the pick where validation decides
    alone (split calibration).

    ``"best"``: the highest validation AUROC alone (ties: fewer dimensions, then grid
    order). ``"one_se"``: every candidate whose validation AUROC is within one standard
    error (Hanley & McNeil) of the best one's, fewest dimensions first, then the higher
    AUROC, then grid order. A difference smaller than the validation split can measure
    does not buy extra dimensions: the smaller model is cheaper and, with few labelled
    queries, generalises better (the one-standard-error rule of Breiman et al., 1984).
    """
    if selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {SELECTIONS}, not {selection!r}")
    if not rows:
        raise ValueError("no candidates to pick from")
    best = max(range(len(rows)), key=lambda j: (rows[j].val_auroc, -rows[j].dims, -j))
    if selection == "best":
        return [best]
    top = rows[best]
    floor = top.val_auroc - auroc_standard_error(top.val_auroc, top.n_id, top.n_ood)
    near = [j for j, r in enumerate(rows) if r.val_auroc >= floor]
    return sorted(near, key=lambda j: (rows[j].dims, -rows[j].val_auroc, j))
