"""Pure helpers of the end-to-end benchmark."""

import math

from sidecar.stream._bench import TARGETS, percentile, scrape


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
