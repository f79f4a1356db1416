"""Measurement behind benchmarks/results/e2e_openblas_threads.json (not a test; run by hand).

Does the worker's OpenBLAS thread pool explain why the text path falls short of the
encoder-only ceiling when nothing is pinned? ``sidecar bench e2e`` (unpinned, text path,
default settings) alternately with ``OPENBLAS_NUM_THREADS`` unset and set to 1; the
variable reaches the worker child through the environment, and each report's
``placement.thread_env`` says which it had::

    python benchmarks/studies/e2e_openblas_threads.py --repeat 2 \\
        --json benchmarks/results/e2e_openblas_threads.json

Alternating, because a shared machine's load drifts: compare only runs of one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SUMMARY = (
    ("throughput_qps",),
    ("encoder_only_qps",),
    ("ratio_to_encoder",),
    ("time_split_ms_per_query", "encode"),
    ("time_split_ms_per_query", "detect"),
    ("cpu_saturation", "worker", "cpu_ms_per_query"),
    ("cpu_saturation", "worker", "run_queue_wait_ms_per_query"),
    ("cpu_saturation", "other_processes", "cores_busy"),
    ("placement", "threads", "worker"),
    ("half_rate", "rate_qps"),
    ("half_rate", "latency_ms_p99"),
)


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        doc = doc.get(part) if isinstance(doc, dict) else None  # type: ignore[assignment]
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e2e-openblas-"))
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for setting in (None, "1"):
            env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
            if setting is not None:
                env["OPENBLAS_NUM_THREADS"] = setting
            out = work / f"run-{i}-{setting or 'unset'}.json"
            cmd = [sys.executable, "-m", "sidecar", "bench", "e2e", "--json", str(out),
                   "--workdir", str(work / out.stem)]  # fmt: skip
            print(f"run {i + 1}: OPENBLAS_NUM_THREADS={setting or '(unset)'}", flush=True)
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            runs.append({"OPENBLAS_NUM_THREADS": setting, "report": json.loads(out.read_text())})
    summary: dict[str, Any] = {}
    for path in SUMMARY:
        key = ".".join(path)
        for setting in (None, "1"):
            values = [_get(r["report"], path) for r in runs if r["OPENBLAS_NUM_THREADS"] == setting]
            nums = [float(v) for v in values if isinstance(v, int | float)]
            name = f"OPENBLAS_NUM_THREADS={setting or 'unset'}"
            summary.setdefault(key, {})[name] = {
                "median": round(statistics.median(nums), 4) if nums else None,
                "runs": values,
            }
    doc = {
        "study": "sidecar bench e2e, unpinned, OPENBLAS_NUM_THREADS unset and 1 alternating",
        "command": "python benchmarks/studies/e2e_openblas_threads.py "
        f"--repeat {args.repeat} --json {args.json}",
        "summary": summary,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
