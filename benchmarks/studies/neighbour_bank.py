"""Measurement behind benchmarks/results/neighbour_bank.json (not a test; run by hand).

What does capping the combined detector's labelled-neighbour banks (``bank_max``,
``sidecar train --neighbour-bank``) cost in accuracy and save in time? For each cap, the
product's own search (the default combined grid, its neighbours candidates given the cap)
runs on every KB exactly as ``sidecar eval --detectors combined --no-protocol`` does, and
the means are written beside the uncapped run::

    python benchmarks/studies/neighbour_bank.py clinc150 0,2000,1000 \
        --data-dir ../shared/data --json benchmarks/results/neighbour_bank.json

A cap of 0 means no cap (the default). Microseconds per query are the eval harness's
(projection + detector, batch of the whole evaluation set, one BLAS thread).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sidecar.bench._timing import cpu_facts
from sidecar.encoders import available_cpus, load_encoder
from sidecar.evaluation import evaluate_task, load_benchmark
from sidecar.settings import load_settings
from sidecar.training import EmbeddingCache
from sidecar.training._grid import combined_grid
from sidecar.training._metrics import METRIC_KEYS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benchmark")
    ap.add_argument("caps", help="comma-separated bank caps; 0 = every training query")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    caps = [int(c) for c in args.caps.split(",")]
    settings = load_settings()
    enc = load_encoder(settings.scoring, threads=available_cpus())
    cache = EmbeddingCache(enc, None, progress=False)
    tasks = load_benchmark(args.benchmark, args.data_dir, "dev")
    runs = []
    for cap in caps:
        t0 = time.time()
        per_kb = {}
        with threadpool_limits(limits=1):
            for task in tasks:
                res = evaluate_task(
                    task,
                    cache.embed,
                    encoder={"name": enc.name, "dim": enc.dim},
                    detectors=("combined",),
                    protocol=False,
                    grids={"combined": combined_grid(None, cap or None)},
                )
                row = res["detectors"]["combined"]
                per_kb[task.name] = {k: row[k] for k in METRIC_KEYS if k in row}
        mean = {
            k: float(np.mean([r[k] for r in per_kb.values()]))
            for k in METRIC_KEYS
            if all(k in r for r in per_kb.values())
        }
        runs.append(
            {"bank_max": cap or None, "mean": mean, "kbs": per_kb, "wall_s": time.time() - t0}
        )
        print(cap, {k: round(mean[k], 5) for k in ("auroc", "balanced_accuracy", "us_per_query")})
    doc = {
        "benchmark": args.benchmark,
        "split": "dev",
        "detector": "combined (default grid, seed 0, 1% target FRR, cross-calibrated)",
        "encoder": enc.name,
        "cpu": cpu_facts(),
        "runs": runs,
    }
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


if __name__ == "__main__":
    main()
