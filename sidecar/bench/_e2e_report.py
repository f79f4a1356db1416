"""Figures and targets of the end-to-end benchmark: percentiles, ``/metrics`` scraping,
peak memory, and several runs folded into one report."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGETS = {"ratio_to_encoder": 0.85, "latency_ms_p99_half_rate": 50.0, "worker_peak_rss_mb": 1500.0}


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident set (VmHWM) of a live process, Linux only."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


_METRIC = re.compile(
    r'^(sidecar_stage_seconds_sum)\{stage="(\w+)"\} ([0-9.e+-]+)$'
    r"|^(sidecar_records_total|sidecar_batch_size_count|sidecar_batch_size_sum) ([0-9.e+-]+)$"
)


def scrape(text: str) -> dict[str, float]:
    """The stage sums and record / batch counters of a ``/metrics`` page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m is None:
            continue
        if m.group(1):
            out[f"stage_{m.group(2)}"] = float(m.group(3))
        else:
            out[m.group(4)] = float(m.group(5))
    return out


def targets(ratio: float | None, p99_half_ms: float, rss_mb: float | None) -> dict[str, Any]:
    """The streaming issue's three targets against measured figures."""
    return {
        "ratio_to_encoder": {
            "target": f">= {TARGETS['ratio_to_encoder']}",
            "measured": ratio,
            "met": ratio is not None and ratio >= TARGETS["ratio_to_encoder"],
        },
        "latency_ms_p99_half_rate": {
            "target": f"<= {TARGETS['latency_ms_p99_half_rate']:.0f}",
            "measured": p99_half_ms,
            "met": p99_half_ms <= TARGETS["latency_ms_p99_half_rate"],
        },
        "worker_peak_rss_mb": {
            "target": f"<= {TARGETS['worker_peak_rss_mb']:.0f}",
            "measured": rss_mb,
            "met": rss_mb is not None and rss_mb <= TARGETS["worker_peak_rss_mb"],
        },
    }


def _nested(outer: str, inner: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: r[outer][inner]


def median_report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of ``run_e2e_bench`` as one: medians of the figures, the worst RSS, every run.

    The ratio is the median of each run's own ratio (worker and ceiling measured in the
    same run), not a ratio of medians.
    """
    import statistics

    def med(get: Callable[[dict[str, Any]], Any]) -> float | None:
        xs = [float(v) for v in map(get, runs) if v is not None]
        return round(statistics.median(xs), 3) if xs else None

    rss = [r["worker_peak_rss_mb"] for r in runs if r["worker_peak_rss_mb"] is not None]
    out: dict[str, Any] = {k: runs[0][k] for k in ("source", "batch_max", "batch_timeout_ms")}
    out.update(
        {
            "cpu_count": runs[0]["cpu_count"],
            "machine": runs[0].get("machine"),
            "placement": runs[0].get("placement"),
            "load_average_1_5_15_start": runs[0].get("load_average_1_5_15_start"),
            "load_average_1_5_15_end": runs[-1].get("load_average_1_5_15_end"),
            "encoder_threads": runs[0]["encoder_threads"],
            "encoder_dtype": runs[0].get("encoder_dtype", "float32"),
            "encoder_backend": runs[0].get("encoder_backend", "torch"),
            "encoder_backend_setting": runs[0].get("encoder_backend_setting"),
            "repeats": len(runs),
            "aggregate": "median over runs (worker_peak_rss_mb: the largest)",
            "queries": runs[0]["queries"],
            "throughput_qps": med(lambda r: r["throughput_qps"]),
            "encoder_only_qps": med(lambda r: r["encoder_only_qps"]),
            "ratio_to_encoder": med(lambda r: r["ratio_to_encoder"]),
            "latency_ms_p50": med(lambda r: r["latency_ms_p50"]),
            "latency_ms_p99": med(lambda r: r["latency_ms_p99"]),
            "encoder_only_qps_all_cpus": med(lambda r: r["encoder_only_qps_all_cpus"]["qps"]),
            "worker_peak_rss_mb": max(rss) if rss else None,
            "half_rate": {
                k: med(_nested("half_rate", k))
                for k in ("rate_qps", "latency_ms_p50", "latency_ms_p99", "mean_batch_size")
            },
            "time_split_ms_per_query": {
                k: med(_nested("time_split_ms_per_query", k))
                for k in runs[0]["time_split_ms_per_query"]
            },
        }
    )
    out["targets"] = targets(
        out["ratio_to_encoder"], out["half_rate"]["latency_ms_p99"], out["worker_peak_rss_mb"]
    )
    out["runs"] = runs
    return out
