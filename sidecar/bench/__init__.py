"""Every ``sidecar bench ...`` measurement and its report code.

Operators size deployments with these, so they ship with the product. One entry point
per command, each taking a frozen config and writing (and returning) its JSON report:
the detectors' speed (:func:`run_detectors_bench`), training at scale
(:func:`run_train_scale_bench`), recalibration on live queries
(:func:`run_recalibration_bench`), the rule miners against brute force
(:func:`run_rules_bench`), the worker end to end on the embedded broker
(:func:`run_e2e_bench`, with :func:`measure_encoder` as its encoder-only child,
:func:`run_e2e_batch_sweep` over batch sizes, :func:`run_e2e_encoder_comparison` over
encoders, :func:`run_e2e_embeddings_bench` for queries that carry their embedding,
:func:`run_e2e_pinning_comparison` for the CPUs shared or split), a live model swap
under load (:func:`run_swap_bench`), the training inputs streamed from PostgreSQL and
Parquet (:func:`run_train_sources_bench`), adversarial
prompts against every benchmark KB (:func:`run_adversarial_bench`) and the worker through
crashes and outages (:func:`run_faults_bench`, its scenarios in :data:`FAULT_SCENARIOS`).
"""

from sidecar.bench._adversarial import AdversarialBenchConfig, run_adversarial_bench
from sidecar.bench._detectors import DetectorsBenchConfig, run_detectors_bench
from sidecar.bench._e2e import (
    E2EBenchConfig,
    run_e2e_batch_sweep,
    run_e2e_bench,
    run_e2e_encoder_comparison,
)
from sidecar.bench._e2e_embeddings import run_e2e_embeddings_bench
from sidecar.bench._e2e_encoder import measure_encoder
from sidecar.bench._e2e_pinning import run_e2e_pinning_comparison
from sidecar.bench._faults import FAULT_SCENARIOS, FaultsBenchConfig, run_faults_bench
from sidecar.bench._recalibration import RecalibrationBenchConfig, run_recalibration_bench
from sidecar.bench._rules_run import RulesBenchConfig, run_rules_bench
from sidecar.bench._swap import SwapBenchConfig, run_swap_bench
from sidecar.bench._train_scale import TrainScaleBenchConfig, run_train_scale_bench
from sidecar.bench._train_sources import TrainSourcesBenchConfig, run_train_sources_bench

__all__ = [
    "FAULT_SCENARIOS",
    "AdversarialBenchConfig",
    "DetectorsBenchConfig",
    "E2EBenchConfig",
    "FaultsBenchConfig",
    "RecalibrationBenchConfig",
    "RulesBenchConfig",
    "SwapBenchConfig",
    "TrainScaleBenchConfig",
    "TrainSourcesBenchConfig",
    "measure_encoder",
    "run_adversarial_bench",
    "run_detectors_bench",
    "run_e2e_batch_sweep",
    "run_e2e_bench",
    "run_e2e_embeddings_bench",
    "run_e2e_encoder_comparison",
    "run_e2e_pinning_comparison",
    "run_faults_bench",
    "run_recalibration_bench",
    "run_rules_bench",
    "run_swap_bench",
    "run_train_scale_bench",
    "run_train_sources_bench",
]
