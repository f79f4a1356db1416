"""Does centering the embeddings hurt English? covid dev, with and without (not a test).

The English check of ``language_centering.py``'s ``center`` variant: every text's
embedding minus the mean of every covid text (KB, training and evaluation queries,
unlabelled; transductive, as in that study), re-normalised, then ``sidecar eval
--benchmark covid`` as it runs (same folds: the near-duplicate groups of the plain
embeddings are reused)::

    PYTHONPATH=. python benchmarks/studies/embedding_centering_covid.py \\
        --data-dir ../shared/data --json /tmp/covid_centering.json --cache-dir /work/cache
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def main() -> None:
    from threadpoolctl import threadpool_limits

    from sidecar.encoders import load_encoder
    from sidecar.evaluation._datasets import load_benchmark
    from sidecar.evaluation._evaluate import evaluate_benchmark
    from sidecar.settings import load_settings
    from sidecar.training import EmbeddingCache

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--encoder", default="all-MiniLM-L6-v2")
    ap.add_argument("--detectors", default="combined,max_cosine")
    ap.add_argument("--target-frr", type=float, default=0.01)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    settings = load_settings()
    enc = load_encoder(settings, name=args.encoder, threads=1)
    cache = EmbeddingCache(enc, args.cache_dir, progress=False)
    tasks = load_benchmark("covid", args.data_dir, "dev")
    texts = sorted(
        {
            t
            for task in tasks
            for part in (task.kb_texts, task.id_train, task.ood_train, task.id_eval, task.ood_eval)
            for t in part
        }
    )
    mu = np.asarray(cache.embed(texts), dtype=np.float64).mean(axis=0)
    group_cache: dict[Any, Any] = {}
    report: dict[str, Any] = {"encoder": enc.name, "mean_norm": float(np.linalg.norm(mu))}
    for variant in ("none", "center"):

        def embed(ts: Any, _v: str = variant, **kw: Any) -> np.ndarray:
            E = np.asarray(cache.embed(list(ts), **kw), dtype=np.float64)
            if _v == "center":
                E = E - mu
                E /= np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
            return E.astype(np.float32)

        t0 = time.perf_counter()
        with threadpool_limits(limits=1):
            rep = evaluate_benchmark(
                "covid",
                "dev",
                tasks,
                embed,
                encoder={"name": enc.name, "dim": enc.dim},
                detectors=tuple(args.detectors.split(",")),
                target_frr=args.target_frr,
                progress=False,
                protocol=False,
                group_cache=group_cache,
            )
        report[variant] = {"mean": rep["mean"], "wall_s": round(time.perf_counter() - t0, 1)}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        for d, row in rep["mean"].items():
            print(variant, d, {k: row.get(k) for k in ("auroc", "fpr_at_95tpr")}, flush=True)


if __name__ == "__main__":
    main()
