"""The spread over seeds of an evaluation's mean figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sidecar.training import METRIC_KEYS

# The figures whose spread over seeds a multi-seed evaluation reports (timings move with
# the machine, not the seed).
SPREAD_KEYS = tuple(k for k in METRIC_KEYS if k != "us_per_query")


def seed_spread(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median, min and max over evaluation reports that differ only in their seed.

    The seed draws the splits (and, for cross-fitted benchmarks, the folds), so the
    spread is how much one figure depends on which queries landed where.
    ``{"seeds": [...], "mean": {DETECTOR: {KEY: {"median", "min", "max", "values"}}}}``.
    """
    if not reports:
        raise ValueError("no reports")
    dets = [d for d in reports[0]["mean"] if all(d in r["mean"] for r in reports)]
    out: dict[str, Any] = {"seeds": [r["seed"] for r in reports], "mean": {}}
    for d in dets:
        row = {}
        for key in SPREAD_KEYS:
            vals = [float(r["mean"][d][key]) for r in reports if key in r["mean"][d]]
            if len(vals) == len(reports):
                row[key] = {
                    "median": float(np.median(vals)),
                    "min": min(vals),
                    "max": max(vals),
                    "values": vals,
                }
        out["mean"][d] = row
    return out
