"""``sidecar bench e2e --compare-pinning``: the same benchmark twice in one sitting, first
with every process sharing every CPU, then with the broker and the load generator pinned
apart from the worker, and what changed between the two."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sidecar.bench._e2e import run_e2e_bench
from sidecar.bench._e2e_config import E2EBenchConfig
from sidecar.bench._e2e_embeddings import fold_runs, run_e2e_embeddings_bench
from sidecar.bench._e2e_machine import cpu_info, cpu_plan
from sidecar.bench._e2e_report import median_report
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
EMBEDDINGS_COMPARED = (
    "throughput_qps",
    "half_rate.latency_ms_p99",
    "cpu_saturation.worker.cores_busy",
    "cpu_saturation.worker.cpu_ms_per_query",
    "cpu_saturation.broker.cpu_ms_per_query",
    "cpu_saturation.load_generator.cpu_ms_per_query",
    "cpu_saturation.other_processes.cores_busy",
)


def run_e2e_pinning_comparison(
    config: E2EBenchConfig,
    *,
    with_embeddings: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """:func:`~sidecar.bench.run_e2e_bench` (or, ``with_embeddings``, both paths) unpinned,
    then pinned, ``config.repeat`` times alternating (the load of a shared machine drifts);
    writes ``{"unpinned": report, "pinned": report, "comparison": ...}``, each report
    folded over its runs as ``--repeat`` folds them, and ``comparison[figure]`` the two
    medians with every run's value.

    Raises
    ------
    DataError
        Fewer than 2 CPUs to split (before anything starts).
    """
    cpu_plan(True)
    work = config.workdir or Path(tempfile.mkdtemp(prefix="sidecar-bench-e2e-pin-"))
    run = run_e2e_embeddings_bench if with_embeddings else run_e2e_bench
    runs: dict[str, list[dict[str, Any]]] = {"unpinned": [], "pinned": []}
    for i in range(config.repeat):
        for name, pin in (("unpinned", False), ("pinned", True)):
            echo(f"{name} ({i + 1} of {config.repeat}) ...")
            d = work / f"{name}-{i}"
            d.mkdir(parents=True, exist_ok=True)
            c = replace(config, pin=pin, repeat=1, workdir=d, json_out=d / "report.json")
            runs[name].append(run(c, echo=echo))
    keys = [*COMPARED, "load_average_1_5_15_start.0"]
    if with_embeddings:
        keys += ["speedup", *(f"embeddings.{k}" for k in EMBEDDINGS_COMPARED)]
    comparison = {
        key: {
            **{name: _median([_get(r, key) for r in rs]) for name, rs in runs.items()},
            **{f"{name}_runs": [_get(r, key) for r in rs] for name, rs in runs.items()},
        }
        for key in keys
    }
    fold = fold_runs if with_embeddings else median_report
    report = {
        "bench": "e2e --compare-pinning" + (" --with-embeddings" if with_embeddings else ""),
        "machine": cpu_info(),
        "repeats": config.repeat,
        "order": "unpinned then pinned, alternating",
        "comparison": comparison,
        **{name: rs[0] if len(rs) == 1 else fold(rs) for name, rs in runs.items()},
    }
    write_report(config.json_out, report)
    return report


def _median(values: list[Any]) -> float | None:
    xs = [float(v) for v in values if isinstance(v, int | float)]
    return round(statistics.median(xs), 4) if xs else None


def _text(report: dict[str, Any]) -> dict[str, Any]:
    return dict(report["text"]) if "text" in report else report


def _get(doc: dict[str, Any], dotted: str) -> Any:
    """``doc``'s field at a dotted path (the text path's where the report has two; a
    number indexes a list); None where it has none."""
    top = dotted.startswith(("embeddings.", "speedup", "load_average"))
    cur: Any = doc if top else _text(doc)
    for part in dotted.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None
    return cur
