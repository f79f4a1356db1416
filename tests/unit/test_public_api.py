"""Each new package's public names are pinned: a change to one is a deliberate API change."""

import importlib

import pytest

PUBLIC = {
    "sidecar.encoders": [
        "DEFAULT_ENCODER",
        "Encoder",
        "OnnxEncoder",
        "SentenceTransformerEncoder",
        "available_cpus",
        "embed_probes",
        "encoder_dim",
        "encoder_label",
        "encoder_threads",
        "load_encoder",
        "resolve_encoder_path",
    ],
    "sidecar.persistence": [
        "check_threshold",
        "model_from_artifact",
        "model_to_artifact",
        "open_async_store",
        "open_store",
        "publish_model",
        "signing_key",
        "warm_up",
    ],
    "sidecar.local": [
        "DemoConfig",
        "DemoData",
        "DemoRun",
        "EmbeddedBroker",
        "EmbeddedRedis",
        "WorkerProcess",
        "demo_data",
        "free_port",
        "publish",
        "run_demo",
        "settings_env",
        "train_demo_model",
        "training_half",
    ],
    "sidecar.evaluation": [
        "BENCHMARKS",
        "DETECTORS",
        "EvalConfig",
        "KBTask",
        "evaluate_benchmark",
        "evaluate_task",
        "load_benchmark",
        "load_clinc150",
        "load_covid",
        "load_stackexchange",
        "read_eval_json",
        "run_evaluation",
        "seed_spread",
        "select_kbs",
        "targets",
        "write_eval_report",
    ],
    "sidecar.bench": [
        "DetectorsBenchConfig",
        "E2EBenchConfig",
        "FAULT_SCENARIOS",
        "FaultsBenchConfig",
        "RecalibrationBenchConfig",
        "RulesBenchConfig",
        "SwapBenchConfig",
        "TrainScaleBenchConfig",
        "measure_encoder",
        "run_detectors_bench",
        "run_e2e_bench",
        "run_faults_bench",
        "run_recalibration_bench",
        "run_rules_bench",
        "run_swap_bench",
        "run_train_scale_bench",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_pinned_and_resolves(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == PUBLIC[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name
