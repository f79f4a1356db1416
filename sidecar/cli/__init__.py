"""Command-line entry point: ``sidecar ...``."""

# Command modules register themselves on ``main`` / ``bench`` when imported.
from sidecar.cli import (  # noqa: F401  (imported for registration)
    _bench_adversarial,
    _bench_detectors,
    _bench_e2e,
    _bench_faults,
    _bench_recalibration,
    _bench_rules,
    _bench_swap,
    _bench_train_scale,
    _bench_train_sources,
    _calibrate,
    _check,
    _check_encoder,
    _demo,
    _eval,
    _explain,
    _models,
    _prepare,
    _score,
    _settings,
    _train,
    _worker,
)
from sidecar.cli._root import bench, main

__all__ = ["bench", "main"]
