"""Every ``sidecar bench ...`` measurement and its report code.

Operators size deployments with these, so they ship with the product: the worker end to
end on the embedded broker (:func:`run_e2e`), a live model swap under load
(:func:`run_swap`), the detectors' speed, training at scale, recalibration, and the rule
miners against brute force. Each writes a JSON report.
"""

from sidecar.bench._detectors import DetectorsBenchConfig, run_detectors_bench
from sidecar.bench._e2e import E2EBenchConfig, run_e2e_bench
from sidecar.bench._e2e_encoder import measure_encoder
from sidecar.bench._e2e_report import median_report
from sidecar.bench._hotpot import MemoBlackBox, SimulatedHotpotLLM, load_hotpot
from sidecar.bench._recalibration import (
    RecalibrationBenchConfig,
    recalibration_study,
    run_recalibration_bench,
)
from sidecar.bench._rules import (
    PAPER_PRUNED_SHARE,
    compare_miners,
    hotpot_record,
    summarise,
    synthetic_table,
)
from sidecar.bench._rules_run import RulesBenchConfig, run_rules_bench
from sidecar.bench._swap import SwapBenchConfig, run_swap_bench
from sidecar.bench._swap_report import aggregate_runs
from sidecar.bench._timing import cpu_facts, machine_facts, timeit, us_per_query
from sidecar.bench._train_scale import TrainScaleBenchConfig, run_train_scale_bench

__all__ = [
    "PAPER_PRUNED_SHARE",
    "DetectorsBenchConfig",
    "E2EBenchConfig",
    "MemoBlackBox",
    "RecalibrationBenchConfig",
    "RulesBenchConfig",
    "SimulatedHotpotLLM",
    "SwapBenchConfig",
    "TrainScaleBenchConfig",
    "aggregate_runs",
    "compare_miners",
    "cpu_facts",
    "hotpot_record",
    "load_hotpot",
    "machine_facts",
    "measure_encoder",
    "median_report",
    "recalibration_study",
    "run_detectors_bench",
    "run_e2e_bench",
    "run_recalibration_bench",
    "run_rules_bench",
    "run_swap_bench",
    "run_train_scale_bench",
    "summarise",
    "synthetic_table",
    "timeit",
    "us_per_query",
]
