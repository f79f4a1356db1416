"""Release a trained model: run the job, write its artifact directory, describe the result.

What ``sidecar train`` does between reading its inputs and printing its summary:
:func:`release_model` trains (:func:`~sidecar.training.train`) under a BLAS thread limit,
writes the artifact (manifest.json + arrays.npz, never pickle), gathers the run's
statistics and writes the report. Putting the artifact into a model store is
:func:`sidecar.persistence.publish_model`'s job, not this one's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_store import Artifact, save_dir
from sidecar.persistence import model_to_artifact
from sidecar.training._fitting import FitProgress
from sidecar.training._job import train
from sidecar.training._train_config import TrainConfig, TrainInputs, TrainResult
from sidecar.training._train_report import build_report


@dataclass(frozen=True)
class ReleaseConfig:
    """Where a release is written and how it runs.

    ``report_dir`` None puts the report in ``out/report``; ``report`` False writes none.
    ``blas_threads`` caps the BLAS threads of the job: more than the free cores makes
    the many small SVDs of the search crawl.
    """

    out: Path
    report_dir: Path | None = None
    report: bool = True
    blas_threads: int = 1


@dataclass(frozen=True)
class Release:
    """A trained model as written: the job's result, its artifact, the directory it went
    to, the run's statistics (the job's, plus ``embed_s``, ``kb``, ``version`` and
    ``artifact_bytes``) and the report page (None without a report)."""

    result: TrainResult
    artifact: Artifact
    out: Path
    stats: dict[str, Any]
    report: Path | None


def release_model(
    inputs: TrainInputs,
    cfg: TrainConfig,
    where: ReleaseConfig,
    *,
    embed_s: float = 0.0,
    tick: Callable[[str], None] | None = None,
    fits: FitProgress | None = None,
) -> Release:
    """Train on ``inputs`` as ``cfg`` says, write the artifact and the report.

    ``tick`` and ``fits`` are the job's (:func:`~sidecar.training.train`); ``tick`` is
    also told ``"artifact"`` once the model is trained and ``"report"`` before the report
    is drawn. ``embed_s`` is the time spent embedding the inputs, for the statistics.
    An earlier report in ``where.out`` is removed: it would describe another model.
    """
    from threadpoolctl import threadpool_limits

    step = tick or (lambda _s: None)
    with threadpool_limits(limits=where.blas_threads):
        result = train(inputs, cfg, tick=tick, fits=fits)
        step("artifact")
        artifact = model_to_artifact(result.model)
        out = save_dir(artifact, where.out)
        stale = out / "report"
        if (stale / "report.md").is_file():
            shutil.rmtree(stale)
        stats = {
            **result.stats,
            "embed_s": round(embed_s, 3),
            "kb": artifact.kb,
            "version": artifact.version,
            "artifact_bytes": artifact.size_bytes(),
        }
        page = None
        if where.report:
            step("report")
            page = build_report(
                inputs,
                cfg,
                result,
                where.report_dir or out / "report",
                extra_summary={"version": artifact.version},
            )
    return Release(result, artifact, out, stats, page)
