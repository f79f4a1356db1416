"""Command-line entry point: ``sidecar ...``."""

from sidecar.cli._root import bench, main

# Command modules register themselves on ``main`` / ``bench`` when imported.
from sidecar.cli import (  # noqa: E402, F401  (imported for registration)
    _bench_detectors,
    _bench_e2e,
    _bench_rules,
    _bench_swap,
    _demo,
    _eval,
    _explain,
    _models,
    _train,
    _worker,
)

__all__ = ["bench", "main"]
