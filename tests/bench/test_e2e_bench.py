"""Pure helpers of the end-to-end benchmark."""

import math
from typing import Any

import pytest

from sidecar.bench._e2e_report import TARGETS, percentile, scrape


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    assert percentile([10.0, 0.0], 1.0) == 10.0
    assert math.isnan(percentile([], 0.5))


def test_scrape_reads_stage_sums_and_counters() -> None:
    page = "\n".join(
        [
            "# HELP sidecar_stage_seconds ...",
            'sidecar_stage_seconds_sum{stage="encode"} 1.5',
            'sidecar_stage_seconds_count{stage="encode"} 3.0',
            "sidecar_records_total 120.0",
            "sidecar_batch_size_count 4.0",
        ]
    )
    assert scrape(page) == {
        "stage_encode": 1.5,
        "sidecar_records_total": 120.0,
        "sidecar_batch_size_count": 4.0,
    }


def test_targets_are_the_issue_targets() -> None:
    assert TARGETS == {
        "ratio_to_encoder": 0.85,
        "latency_ms_p99_half_rate": 50.0,
        "worker_peak_rss_mb": 1500.0,
    }


def _run(ratio: float, p99_half: float, rss: float) -> dict[str, Any]:
    return {
        "source": "demo",
        "batch_max": 64,
        "batch_timeout_ms": 5,
        "cpu_count": 2,
        "encoder_threads": 1,
        "queries": 100,
        "throughput_qps": 100.0 * ratio,
        "encoder_only_qps": 100.0,
        "ratio_to_encoder": ratio,
        "latency_ms_p50": 10.0,
        "latency_ms_p99": 20.0,
        "encoder_only_qps_all_cpus": {"threads": 2, "qps": 150.0},
        "worker_peak_rss_mb": rss,
        "half_rate": {
            "rate_qps": 50.0,
            "latency_ms_p50": 5.0,
            "latency_ms_p99": p99_half,
            "mean_batch_size": 3.0,
        },
        "time_split_ms_per_query": {"decode": 0.1, "encode": 4.0, "detect": 0.1, "produce": 0.2},
    }


def test_median_report_takes_medians_the_worst_rss_and_keeps_every_run() -> None:
    from sidecar.bench._e2e_report import median_report

    runs = [_run(0.80, 40.0, 700.0), _run(0.90, 60.0, 650.0), _run(0.95, 45.0, 1600.0)]
    rep = median_report(runs)
    assert rep["ratio_to_encoder"] == 0.9
    assert rep["half_rate"]["latency_ms_p99"] == 45.0
    assert rep["worker_peak_rss_mb"] == 1600.0
    assert rep["targets"]["ratio_to_encoder"]["met"] is True
    assert rep["targets"]["latency_ms_p99_half_rate"]["met"] is True
    assert rep["targets"]["worker_peak_rss_mb"]["met"] is False
    assert rep["runs"] == runs and rep["repeats"] == 3


def test_the_ceiling_uses_the_backend_the_worker_resolved() -> None:
    from sidecar.bench._e2e_worker import resolved_backend

    ready = {"ready": True, "checks": {"encoder": {"ok": True, "backend": "onnx"}}}
    assert resolved_backend(ready, "auto") == "onnx"
    assert resolved_backend({"checks": {}}, "torch") == "torch"
    with pytest.raises(RuntimeError, match="encoder backend"):
        resolved_backend({"checks": {}}, "auto")


def test_clinc_bench_texts_fall_back_to_validation_and_fail_readably(tmp_path: Any) -> None:
    import json

    from sidecar.bench._e2e import bench_texts
    from sidecar.errors import DataError

    (tmp_path / "clinc150").mkdir()
    f = tmp_path / "clinc150" / "data_full.json"
    f.write_text(
        json.dumps({"val": [["book a flight", "book_flight"]], "oos_val": [["hi", "oos"]]})
    )
    assert bench_texts("clinc", tmp_path) == ["book a flight", "hi"]
    f.write_text(json.dumps({"test": [["x", "y"]], "val": [["book a flight", "b"]]}))
    assert bench_texts("clinc", tmp_path) == ["x"]
    f.write_text(json.dumps({"train": [["t", "y"]]}))
    with pytest.raises(DataError, match="no test or val"):
        bench_texts("clinc", tmp_path)
    with pytest.raises(DataError, match="cannot read"):
        bench_texts("clinc", tmp_path / "missing")


def test_a_sweep_refuses_bad_batch_sizes_before_starting_anything(tmp_path: Any) -> None:
    from sidecar.bench import E2EBenchConfig, run_e2e_batch_sweep
    from sidecar.errors import DataError

    config = E2EBenchConfig(json_out=tmp_path / "sweep.json", workdir=tmp_path / "work")
    for bad in ([], [8, 0]):
        with pytest.raises(DataError, match="batch sizes"):
            run_e2e_batch_sweep(config, bad)
    assert not (tmp_path / "work").exists() and not (tmp_path / "sweep.json").exists()


def test_the_sweep_option_gives_one_readable_line_for_a_bad_list(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from sidecar.cli import main

    out = tmp_path / "sweep.json"
    for bad in ("1,a", "0,8", ","):
        result = CliRunner().invoke(
            main, ["bench", "e2e", "--json", str(out), "--sweep-batch-max", bad]
        )
        assert result.exit_code == 2 and "--sweep-batch-max" in result.output
    assert not out.exists()


def test_a_packaged_runtime_is_the_backend_the_worker_reports() -> None:
    from sidecar.bench._e2e_worker import resolved_backend

    ready = {"checks": {"encoder": {"ok": True, "backend": "numpy"}}}
    assert resolved_backend(ready, "auto") == "numpy"


def test_an_encoder_comparison_refuses_bad_requests_before_starting_anything(
    tmp_path: Any,
) -> None:
    from click.testing import CliRunner

    from sidecar.bench import E2EBenchConfig, run_e2e_encoder_comparison
    from sidecar.cli import main
    from sidecar.errors import DataError

    config = E2EBenchConfig(json_out=tmp_path / "enc.json", workdir=tmp_path / "work")
    with pytest.raises(DataError, match="at least one encoder"):
        run_e2e_encoder_comparison(config, [])
    out = tmp_path / "enc.json"
    base = ["bench", "e2e", "--json", str(out), "--compare-encoders"]
    for extra in ([","], ["a,b", "--sweep-batch-max", "8"], ["a,b", "--encoder", "a"]):
        result = CliRunner().invoke(main, [*base, *extra])
        assert result.exit_code == 2 and "encoder" in result.output
    assert not out.exists() and not (tmp_path / "work").exists()


def test_embeddings_and_pinning_refuse_what_they_cannot_combine(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from sidecar.cli import main

    out = tmp_path / "r.json"
    base = ["bench", "e2e", "--json", str(out), "--workdir", str(tmp_path / "work")]
    for extra, words in (
        (["--with-embeddings", "--sweep-batch-max", "8"], "--with-embeddings"),
        (["--with-embeddings", "--compare-encoders", "a,b"], "--with-embeddings"),
        (["--compare-pinning", "--sweep-batch-max", "8"], "--compare-pinning"),
        (["--compare-pinning", "--pin"], "leave out --pin"),
        (["--with-embeddings", "--embedding-queries", "0"], "--embedding-queries"),
    ):
        result = CliRunner().invoke(main, [*base, *extra])
        assert result.exit_code == 2 and words in result.output, result.output
    assert not out.exists() and not (tmp_path / "work").exists()


def test_the_pinning_comparison_reads_the_text_path_wherever_the_report_keeps_it() -> None:
    from sidecar.bench._e2e_pinning import _get, _median

    both = {
        "text": {"throughput_qps": 300.0, "cpu_saturation": {"worker": {"cores_busy": 0.9}}},
        "embeddings": {"throughput_qps": 3000.0},
        "speedup": 10.0,
        "load_average_1_5_15_start": [1.5, 1.0, 0.5],
    }
    assert _get(both, "throughput_qps") == 300.0
    assert _get(both, "cpu_saturation.worker.cores_busy") == 0.9
    assert _get(both, "embeddings.throughput_qps") == 3000.0
    assert _get(both, "speedup") == 10.0 and _get(both, "load_average_1_5_15_start.0") == 1.5
    assert _get({"throughput_qps": 5.0}, "throughput_qps") == 5.0  # a text-only report
    assert _get(both, "cpu_saturation.nobody.cores_busy") is None
    assert _median([3.0, None, 1.0, 2.0]) == 2.0 and _median([None]) is None
