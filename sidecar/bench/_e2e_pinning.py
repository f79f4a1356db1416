"""``sidecar bench e2e --compare-pinning``: the same benchmark twice in one sitting, first
with every process sharing every CPU, then with the broker and the load generator pinned
apart from the worker, and what changed between the two."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sidecar.bench._e2e import run_e2e_bench
from sidecar.bench._e2e_config import E2EBenchConfig
from sidecar.bench._e2e_embeddings import run_e2e_embeddings_bench
from sidecar.bench._e2e_machine import cpu_info, cpu_plan
from sidecar.bench._report_file import write_report

# The text path's figures set side by side (dotted: nested fields).
COMPARED = (
    "throughput_qps",
    "encoder_only_qps",
    "ratio_to_encoder",
    "time_split_ms_per_query.encode",
    "half_rate.latency_ms_p50",
    "half_rate.latency_ms_p99",
    "half_rate.time_split_ms_per_query.encode",
    "cpu_saturation.worker.cpu_ms_per_query",
    "cpu_saturation.worker.run_queue_wait_ms_per_query",
    "cpu_saturation.broker.cores_busy",
    "cpu_saturation.load_generator.cores_busy",
    "cpu_saturation.other_processes.cores_busy",
)


def run_e2e_pinning_comparison(
    config: E2EBenchConfig,
    *,
    with_embeddings: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """:func:`~sidecar.bench.run_e2e_bench` (or, ``with_embeddings``, both paths) unpinned,
    then pinned; writes ``{"unpinned": report, "pinned": report, "comparison": ...}``.

    Raises
    ------
    DataError
        Fewer than 2 CPUs to split (before anything starts).
    """
    cpu_plan(True)
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-pin-"))
    reports: dict[str, dict[str, Any]] = {}
    for name, pin in (("unpinned", False), ("pinned", True)):
        echo(f"{name} ...")
        c = replace(config, pin=pin, workdir=work / name, json_out=work / f"{name}.json")
        c.workdir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        run = run_e2e_embeddings_bench if with_embeddings else run_e2e_bench
        reports[name] = run(c, echo=echo)
    comparison = {
        key: {name: _get(_text(r), key) for name, r in reports.items()} for key in COMPARED
    }
    comparison["load_average_1m_start"] = {
        name: (r.get("load_average_1_5_15_start") or [None])[0] for name, r in reports.items()
    }
    if with_embeddings:
        for key in ("speedup",):
            comparison[key] = {name: r.get(key) for name, r in reports.items()}
        for key in ("throughput_qps", "cpu_saturation.worker.cores_busy",
                    "cpu_saturation.other_processes.cores_busy"):  # fmt: skip
            comparison[f"embeddings.{key}"] = {
                name: _get(r["embeddings"], key) for name, r in reports.items()
            }
    report = {
        "bench": "e2e --compare-pinning" + (" --with-embeddings" if with_embeddings else ""),
        "machine": cpu_info(),
        "comparison": comparison,
        **reports,
    }
    write_report(config.json_out, report)
    return report


def _text(report: dict[str, Any]) -> dict[str, Any]:
    return dict(report["text"]) if "text" in report else report


def _get(doc: dict[str, Any], dotted: str) -> Any:
    cur: Any = doc
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur
