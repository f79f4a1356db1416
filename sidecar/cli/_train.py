"""``sidecar train``: fit, search, calibrate, report and (optionally) publish a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sidecar.cli._root import main

_PATH = click.Path(path_type=Path)


@main.command("train")
@click.option(
    "--kb",
    "kb_path",
    type=_PATH,
    help='KB documents, JSONL {"id", "text"} [default: the built-in demo KB].',
)
@click.option(
    "--kb-embeddings",
    type=_PATH,
    help="KB as precomputed embeddings (.npy, n x dim) instead of --kb.",
)
@click.option("--id-queries", type=_PATH, help='ID training queries, JSONL {"text"}.')
@click.option("--id-embeddings", type=_PATH, help="ID training queries as a .npy array.")
@click.option(
    "--ood-queries",
    type=_PATH,
    help='OOD training queries, JSONL {"text"} (optional for KB-only detectors).',
)
@click.option("--ood-embeddings", type=_PATH, help="OOD training queries as a .npy array.")
@click.option("--kb-name", default=None, help="KB id in the model store [default: settings].")
@click.option(
    "--encoder", default=None, help="Encoder name or local model dir [default: settings]."
)
@click.option(
    "--detector",
    default="combined",
    show_default=True,
    help="Detector kind (combined, epsilon_ball, epsilon_cube, epsilon_rect, logreg, "
    "svm, gmm, residual, max_cosine, mahalanobis, knn).",
)
@click.option(
    "--criterion",
    default="pvalue",
    show_default=True,
    type=click.Choice(["pvalue", "evr"]),
    help="How the m PCs are chosen.",
)
@click.option(
    "--m",
    type=click.IntRange(1, 384),
    default=None,
    help="Fixed number of PCs [default: searched].",
)
@click.option("--m-range", default=None, help="Search m in LOW:HIGH, e.g. 8:32.")
@click.option(
    "--features",
    default=None,
    help="combined only: comma-separated blocks among pcs,residual,max_cosine.",
)
@click.option(
    "--target-frr",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="False-reject rate the threshold targets.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of splits and fits.")
@click.option("--out", required=True, type=_PATH, help="Artifact directory to write.")
@click.option("--report", "report_dir", type=_PATH, help="Report directory [default: OUT/report].")
@click.option("--no-report", is_flag=True, help="Skip the report (plots).")
@click.option("--publish", is_flag=True, help="Put the artifact into the model store.")
@click.option("--no-promote", is_flag=True, help="With --publish: store without activating.")
@click.option(
    "--store-backend",
    type=click.Choice(["redis", "directory"]),
    default=None,
    help="Model store backend [default: settings].",
)
@click.option("--store-dir", type=_PATH, default=None, help="Directory store root.")
@click.option(
    "--cache-dir",
    type=_PATH,
    default=None,
    help="Embedding cache [default: ~/.cache/ood-sidecar/embeddings].",
)
@click.option("--stats-json", type=_PATH, default=None, help="Also write timing/memory JSON here.")
@click.option(
    "--blas-threads",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="BLAS threads; more than the free cores makes the many small SVDs crawl.",
)
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
def train_command(**opts: Any) -> None:
    """Train an OOD detector for one KB and write a versioned artifact plus a report.

    Embeds the KB and the labelled queries (cached on disk), runs a PCA of the KB, searches
    m and the detector's hyperparameters on a validation split carved from the training
    queries (fixed seed), calibrates the threshold to --target-frr on held-out ID queries
    (conformal quantile) and writes OUT (manifest.json + arrays.npz, no pickle). With no
    KB options it trains on the built-in demo KB, so `sidecar train --out DIR` just works.
    """
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    from model_store import save_dir
    from sidecar.settings import load_settings
    from sidecar.training._job import (
        TrainConfig,
        build_report,
        parse_m_range,
        train,
    )
    from sidecar.training._train_inputs import load_inputs

    overrides: dict[str, Any] = {}
    if opts["encoder"]:
        overrides["scoring"] = {"encoder": opts["encoder"]}
    store: dict[str, Any] = {}
    if opts["store_backend"]:
        store["backend"] = opts["store_backend"]
    if opts["store_dir"]:
        store["directory"] = opts["store_dir"]
    if store:
        overrides["store"] = store
    settings = load_settings(**overrides)
    progress = not opts["no_progress"]
    features = None
    if opts["features"]:
        features = tuple(f.strip() for f in opts["features"].split(",") if f.strip())
    cfg = TrainConfig(
        detector=opts["detector"],
        criterion=opts["criterion"],
        m=opts["m"],
        m_range=parse_m_range(opts["m_range"]) if opts["m_range"] else None,
        features=features,
        target_frr=opts["target_frr"],
        seed=opts["seed"],
    )
    steps = ["inputs", "split", "search", "artifact"] + ([] if opts["no_report"] else ["report"])
    with (
        threadpool_limits(limits=opts["blas_threads"]),
        tqdm(total=len(steps), desc="train", unit="step", disable=not progress) as bar,
    ):
        inputs, embed_s = load_inputs(opts, settings, progress=progress)
        bar.update(1)
        result = train(inputs, cfg, tick=lambda _s: bar.update(1))
        artifact = result.model.to_artifact()
        out = save_dir(artifact, opts["out"])
        bar.update(1)
        stats = {
            **result.stats,
            "embed_s": round(embed_s, 3),
            "version": artifact.version,
            "artifact_bytes": artifact.size_bytes(),
        }
        page = None
        if not opts["no_report"]:
            page = build_report(
                inputs,
                cfg,
                result,
                opts["report_dir"] or out / "report",
                extra_summary={"version": artifact.version},
            )
            bar.update(1)
    m = result.model
    click.echo(
        f"model {artifact.version} for KB {m.kb!r}: {m.detector_name}, criterion "
        f"{m.criterion}, m={m.m}, dims={m.dims}, threshold={m.threshold:.6g}"
    )
    for k, v in result.validation.items():
        if isinstance(v, float):
            click.echo(f"  {k}: {v:.4f}")
    click.echo(
        f"  train {stats['train_total_s']:.2f}s, embed {stats['embed_s']:.2f}s, "
        f"peak RSS {stats['peak_rss_mb']:.0f} MiB"
    )
    click.echo(f"artifact: {out}")
    if page is not None:
        click.echo(f"report: {page}")
    if opts["stats_json"]:
        Path(opts["stats_json"]).write_text(
            json.dumps({**stats, "validation": result.validation}, indent=2) + "\n"
        )
    if opts["publish"]:
        _publish(artifact, settings, promote=not opts["no_promote"])


def _publish(artifact: Any, settings: Any, *, promote: bool) -> None:
    from sidecar._stores import open_store

    store = open_store(settings)
    try:
        version = store.put(artifact)
        if promote:
            store.promote(artifact.kb, version)
    finally:
        store.close()
    where = f" ({settings.store.directory})" if settings.store.backend == "directory" else ""
    click.echo(
        f"published {artifact.kb}/{version} to the {settings.store.backend} store"
        f"{where}{' and promoted it' if promote else ''}"
    )
