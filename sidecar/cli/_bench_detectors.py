"""``sidecar bench detectors``: microseconds per query of every detector.

Measured on synthetic unit embeddings (encoder excluded, as in the paper): each detector
is fitted through :func:`~sidecar.scoring.fit_ood_model`, then timed on its own input
(projected queries for the PC detectors, embeddings for the full-space baselines) and,
separately, end to end from embeddings through ``OODModel.score``. Every figure is the
median over repeated timed runs; ratios are taken within one run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from sidecar.bench import machine_facts
from sidecar.bench._detectors import (
    _DIM,
    _bench_models,
    _kdtree_references,
    _references,
    _scale,
    _synthetic,
)
from sidecar.cli._options import check_output_file, int_list
from sidecar.cli._root import bench


@bench.command("detectors")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the JSON report here.",
)
@click.option(
    "--m",
    default=13,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Selected PCs for the PC detectors.",
)
@click.option(
    "--n-train",
    default=2000,
    show_default=True,
    type=click.IntRange(min=100),
    help="ID and OOD training queries each (also the KB size).",
)
@click.option(
    "--repeats",
    default=7,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed runs per figure.",
)
@click.option(
    "--min-time",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds each timed run lasts at least.",
)
@click.option(
    "--scale-n",
    default="1000,10000,100000",
    show_default=True,
    callback=int_list(100),
    help="Training-point counts for the geometric scaling table ('' to skip).",
)
@click.option(
    "--scale-m",
    default="8,16,32",
    show_default=True,
    callback=int_list(1),
    help="Values of m for the scaling table ('' to skip).",
)
@click.option(
    "--detectors", "only", default="", help="Comma-separated subset of detectors [default: all]."
)
@click.option(
    "--blas-threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="BLAS threads while timing (0: library default). Small matrix products are "
    "fastest single-threaded, and on a shared machine extra threads mostly wait.",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
def detectors_cmd(
    json_path: Path,
    m: int,
    n_train: int,
    repeats: int,
    min_time: float,
    scale_n: list[int],
    scale_m: list[int],
    only: str,
    blas_threads: int,
    seed: int,
) -> None:
    """Microseconds per query of every detector at batch 1 and 256 (encoder excluded).

    Fits each detector on synthetic 384-d unit embeddings, times it on its own input
    (projected queries, or embeddings for the full-space baselines) and end to end
    through OODModel.score, next to naive references (scikit-learn's
    RadiusNeighborsClassifier and a Python loop for the epsilon-ball), and reports how
    the geometric detectors scale with training points and with m. Medians of repeated
    runs; the machine's load average is recorded because it moves every figure.
    """
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    from sidecar.errors import ConfigError
    from sidecar.scoring import detector_kinds

    if only.strip():
        kinds = [k.strip() for k in only.split(",") if k.strip()]
        if not kinds:
            raise ConfigError(f"--detectors {only!r} names no detector")
    else:  # not given: every detector
        kinds = list(detector_kinds())
    unknown = sorted(set(kinds) - set(detector_kinds()))
    if unknown:
        raise ConfigError(f"unknown detectors: {', '.join(unknown)}")
    check_output_file(json_path, "--json")
    ns, ms = scale_n, scale_m
    machine = machine_facts()
    data = _synthetic(n_train, n_train, n_train, 512, seed)
    total = len(kinds) + 3 * len(ns) + 4 * len(ms)
    t0 = time.perf_counter()
    limits = threadpool_limits(blas_threads, user_api="blas") if blas_threads > 0 else None
    machine["blas_threads"] = blas_threads or "default"
    with tqdm(total=total, unit="step") as progress:
        results, models = _bench_models(data, m, repeats, min_time, kinds, progress)
        reference = (
            _references(models["epsilon_ball"], data["test"], repeats, min_time)
            if "epsilon_ball" in models
            else {}
        )
        reference.update(_kdtree_references(models, data["test"], repeats, min_time))
        progress.set_description("scaling")
        scale = _scale(ms, ns, repeats, min_time, seed, progress)
    if limits is not None:
        limits.restore_original_limits()
    report = {
        "detectors": results,
        "reference": reference,
        "scale": scale,
        "machine": machine,
        "setup": {
            "m": m,
            "n_kb": n_train,
            "n_id_train": n_train,
            "n_ood_train": n_train,
            "dim": _DIM,
            "repeats": repeats,
            "min_time_s": min_time,
            "seed": seed,
            "timing": "median over repeats of an auto-sized loop; us per query = call time"
            " / batch size; 'us_per_query_*' = detector on its own input, "
            "'model_us_per_query_*' = OODModel.score from embeddings",
            "wall_s": time.perf_counter() - t0,
        },
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    width = max(len(k) for k in results)
    click.echo(f"{'detector':<{width}}  us/q b1   us/q b256  model b256")
    for kind, r in results.items():
        click.echo(
            f"{kind:<{width}}  {r['us_per_query_batch1']:8.2f}  "
            f"{r['us_per_query_batch256']:9.3f}  {r['model_us_per_query_batch256']:9.3f}"
        )
    click.echo(f"wrote {json_path}")
