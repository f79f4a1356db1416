"""``sidecar bench e2e --with-embeddings --pin`` end to end with small counts: the embedded
broker, a real worker, the text path and then queries that carry their embedding.

Timings never gate: the test holds the report's shape and its accounting (every query
answered by the path it was sent for, nothing dead-lettered, the speedup the ratio of the
two throughputs, the CPUs each process had as the plan said).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.bench import E2EBenchConfig, run_e2e_embeddings_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PATH_FIELDS = (
    "queries",
    "throughput_qps",
    "latency_ms_p50",
    "latency_ms_p99",
    "worker_peak_rss_mb",
    "time_split_ms_per_query",
    "mean_batch_size_saturation",
    "half_rate",
    "cpu_saturation",
)


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 CPUs this process may use"
)
def test_both_paths_side_by_side_every_query_on_its_own_path(tmp_path: Path) -> None:
    out = tmp_path / "e2e_embeddings.json"
    config = E2EBenchConfig(
        json_out=out,
        queries=96,
        embedding_queries=400,
        half_rate_queries=60,
        batch_max=16,
        workdir=tmp_path / "work",
        timeout_s=180.0,
        pin=True,
    )
    lines: list[str] = []
    report = run_e2e_embeddings_bench(config, echo=lines.append)
    doc = json.loads(out.read_text())
    assert doc == json.loads(json.dumps(report))
    text, emb = doc["text"], doc["embeddings"]
    for path in (text, emb):
        assert all(k in path for k in PATH_FIELDS), sorted(set(PATH_FIELDS) - set(path))
        assert path["dead_lettered"] == 0
        assert path["half_rate"]["queries"] >= 50
        for proc in ("worker", "broker", "load_generator"):
            assert path["cpu_saturation"][proc]["cpu_ms_per_query"] >= 0.0
    assert text["queries"] == 96 and emb["queries"] == 400
    # The worker scored every text query with its encoder and every embedding as sent.
    assert text["verdict_paths"] == {"sidecar": 96}
    assert emb["verdict_paths"] == {"client": 400}
    assert doc["speedup"] == round(emb["throughput_qps"] / text["throughput_qps"], 3)
    assert doc["speedup_target"]["measured"] == doc["speedup"]
    assert doc["speedup_target"]["met"] == (doc["speedup"] >= 10.0)
    # The text path keeps today's fields, its ceiling among them.
    assert text["ratio_to_encoder"] == round(text["throughput_qps"] / text["encoder_only_qps"], 3)
    assert text["encoder"] == emb["encoder"] == doc["encoder"]
    assert doc["embedding_dim"] == 384
    # Which part of the machine each figure had, as the kernel reports it.
    cpus = sorted(os.sched_getaffinity(0))
    allowed = doc["placement"]["allowed_cpus"]
    assert allowed == {"worker": cpus[1:], "broker": cpus[:1], "load_generator": cpus[:1]}
    assert doc["placement"]["encoder_only"] == cpus[1:]
    assert doc["placement"]["plan"]["pinned"] is True
    assert doc["placement"]["threads"]["worker"] > 1
    assert sorted(os.sched_getaffinity(0)) == cpus  # this process got its CPUs back
    assert doc["machine"]["cpu_count"] == os.cpu_count() and "flags" in doc["machine"]
    assert len(doc["load_average_1_5_15_start"]) == len(doc["load_average_1_5_15_end"]) == 3
    for name in ("text", "embeddings"):
        where = doc["where_the_time_goes"][name]
        assert where["limit"]["side"] in ("worker", "broker + load generator")
        assert set(where["cpu_ms_per_query"]) == {"worker", "broker", "load_generator"}
        assert where["other_processes_cores_busy"] >= 0.0
    assert doc["language_detection_us"]["per_query"] > 0
    cost = doc["decode_cost_us"]
    assert cost["vector_decode"] > 0 and cost["parse_embedding_record"] > 0
    assert cost["record_bytes"]["embedding"] > cost["record_bytes"]["text"] + 2048


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="pinning needs 2 CPUs this process may use"
)
def test_the_pinning_comparison_runs_shared_then_split_and_says_which_cpus_each_had(
    tmp_path: Path,
) -> None:
    from sidecar.bench import run_e2e_pinning_comparison

    out = tmp_path / "pinning.json"
    config = E2EBenchConfig(
        json_out=out,
        queries=64,
        half_rate_queries=50,
        batch_max=16,
        workdir=tmp_path / "work",
        timeout_s=180.0,
    )
    report = run_e2e_pinning_comparison(config, echo=lambda _line: None)
    doc = json.loads(out.read_text())
    assert doc == json.loads(json.dumps(report))
    cpus = sorted(os.sched_getaffinity(0))
    shared, split = doc["unpinned"], doc["pinned"]
    assert shared["placement"]["allowed_cpus"] == dict.fromkeys(
        ("worker", "broker", "load_generator"), cpus
    )
    assert split["placement"]["allowed_cpus"] == {
        "worker": cpus[1:], "broker": cpus[:1], "load_generator": cpus[:1]
    }  # fmt: skip
    for run in (shared, split):
        assert run["queries"] == 64 and run["verdict_paths"] == {"sidecar": 64}
        assert run["machine"]["cpu_count"] == os.cpu_count()
    compared = doc["comparison"]
    assert compared["throughput_qps"] == {
        "unpinned": shared["throughput_qps"], "pinned": split["throughput_qps"],
        "unpinned_runs": [shared["throughput_qps"]], "pinned_runs": [split["throughput_qps"]],
    }  # fmt: skip
    assert (
        compared["cpu_saturation.worker.cpu_ms_per_query"]["pinned"]
        == (split["cpu_saturation"]["worker"]["cpu_ms_per_query"])
    )
