"""How much recalibrating a trained model on live ID queries restores its refusal rate.

The threshold a training job ships is calibrated on held-out *training* queries. When the
traffic it then serves has drifted from them (CLINC150's ``val`` utterances sit further
from ``train`` than ``train`` does from itself), the share of in-domain queries refused can
exceed the target, and no split of the training data shows it.
:func:`~sidecar.scoring.recalibrate` moves the threshold to the conformal quantile of a
sample of that traffic. :func:`recalibration_study` measures it on one benchmark KB: the
model is trained as ``sidecar eval`` trains it, the KB's evaluation ID queries are cut
into two halves (near-duplicates kept together), and each half in turn recalibrates the
threshold while the other half, with every OOD evaluation query, judges both thresholds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._report_file import write_report
from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import KBTask
from sidecar.scoring import OODModel, min_calibration_size, recalibrate
from sidecar.settings import ScoringSettings
from sidecar.training import (
    balanced_accuracy,
    carve_splits,
    group_folds,
    near_duplicate_groups,
    search,
)

Embed = Callable[[Sequence[str]], np.ndarray]


def _operating_point(
    model: OODModel, id_scores: np.ndarray, ood_scores: np.ndarray
) -> dict[str, float]:
    thr = model.threshold
    return {
        "threshold": float(thr),
        "false_reject_rate": float(np.mean(id_scores > thr)),
        "ood_accept_rate": float(np.mean(ood_scores <= thr)),
        "balanced_accuracy": balanced_accuracy(id_scores, ood_scores, thr),
    }


def recalibration_study(
    task: KBTask,
    embed: Embed,
    *,
    encoder: Mapping[str, Any],
    detector: str = "combined",
    seed: int = 0,
    target_frr: float = 0.01,
) -> dict[str, Any]:
    """The shipped and the recalibrated threshold of one KB's model, each judged on the
    half of the evaluation ID queries the recalibration did not see (and every OOD
    evaluation query); figures are means over the two halves, each half's in ``halves``.
    """
    if task.cross_fit > 1:
        raise ConfigError(
            f"KB {task.name!r} has no training queries apart from its evaluation queries "
            "(it is cross-fitted); the study needs a benchmark with its own training split"
        )
    E_ide, E_oode = embed(task.id_eval), embed(task.ood_eval)
    rng = np.random.default_rng(seed)
    halves = group_folds(near_duplicate_groups(E_ide), 2, rng)
    need = min_calibration_size(target_frr)
    if min(h.size for h in halves) < need:  # found out before the training, not after
        raise DataError(
            f"KB {task.name!r}: a half of its {len(E_ide)} evaluation ID queries holds "
            f"{min(h.size for h in halves)}, fewer than the {need} a false-reject rate of "
            f"{target_frr:g} needs"
        )
    E_kb, E_idt = embed(task.kb_texts), embed(task.id_train)
    E_oodt = embed(task.ood_train) if task.ood_train else None
    # Trained as the evaluation harness trains a KB with its own training split.
    splits = carve_splits(
        E_kb,
        E_idt,
        E_oodt,
        id_groups=near_duplicate_groups(E_idt, task.id_train_groups),
        ood_groups=None if E_oodt is None else near_duplicate_groups(E_oodt),
        seed=seed,
        target_frr=target_frr,
    )
    model = search(
        splits, detector, kb_name=task.name, encoder=encoder, seed=seed, target_frr=target_frr
    ).model
    s_id, s_ood = model.score(E_ide), model.score(E_oode)
    rows: list[dict[str, Any]] = []
    for h, cal in enumerate(halves):
        judged = halves[1 - h]
        new = recalibrate(model, E_ide[cal], target_frr)
        rows.append(
            {
                "n_recalibration": int(cal.size),
                "n_judged_id": int(judged.size),
                "shipped": _operating_point(model, s_id[judged], s_ood),
                "recalibrated": _operating_point(new, new.score(E_ide[judged]), s_ood),
            }
        )
    mean = {
        side: {k: float(np.mean([r[side][k] for r in rows])) for k in rows[0][side]}
        for side in ("shipped", "recalibrated")
    }
    return {
        "n_ood_judged": int(s_ood.size),
        "calibration": model.metrics.get("calibration"),
        "dims": model.dims,
        **mean,
        "halves": rows,
    }


_PROTOCOL = (
    "per KB: trained as `sidecar eval` trains it; the KB's evaluation ID "
    "queries cut into two halves (near-duplicates together); each half recalibrates "
    "the threshold (conformal quantile of its scores) and the other half plus every "
    "OOD evaluation query judges the shipped and the recalibrated threshold; figures "
    "are means over the two halves, then over KBs"
)


@dataclass(frozen=True)
class RecalibrationBenchConfig:
    """What ``sidecar bench recalibration`` studies, and where its report goes.

    ``benchmark``: the benchmark the KB tasks come from (named in the report).
    ``encoder``: the encoder's name (None: the settings' one). ``cache_dir``: the
    embedding cache (None: none). ``blas_threads``: BLAS threads while training.
    """

    json_out: Path
    benchmark: str
    detector: str = "combined"
    encoder: str | None = None
    target_frr: float = 0.01
    seed: int = 0
    cache_dir: Path | None = None
    blas_threads: int = 1
    no_progress: bool = False


def run_recalibration_bench(
    config: RecalibrationBenchConfig,
    tasks: Sequence[KBTask],
    scoring: ScoringSettings,
    *,
    warn: Callable[[str], None] = print,
) -> dict[str, Any]:
    """:func:`recalibration_study` on each KB of ``tasks`` (the dev split's), averaged.

    A KB with too few evaluation queries for the target is skipped (``warn`` says why)
    and recorded as such. Writes the report to ``config.json_out`` and returns it.

    Raises
    ------
    DataError
        No KB could be studied.
    """
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    from sidecar.encoders import available_cpus, load_encoder
    from sidecar.training import EmbeddingCache

    c = config
    enc = load_encoder(scoring, name=c.encoder, threads=available_cpus())
    cache = EmbeddingCache(enc, c.cache_dir, progress=not c.no_progress)
    t0 = time.perf_counter()
    per_kb: dict[str, Any] = {}
    with threadpool_limits(limits=c.blas_threads):
        for task in tqdm(tasks, desc="KBs", unit="KB", disable=c.no_progress):
            try:
                per_kb[task.name] = recalibration_study(
                    task,
                    cache.embed,
                    encoder={"name": enc.name, "dim": enc.dim},
                    detector=c.detector,
                    seed=c.seed,
                    target_frr=c.target_frr,
                )
            except DataError as exc:  # too few queries for the target: the others still count
                warn(f"skipped: {exc}")
                per_kb[task.name] = {"skipped": str(exc)}
    done = [r for r in per_kb.values() if "skipped" not in r]
    if not done:
        raise DataError("no KB could be studied (each one's reason is above)")
    report = {
        "benchmark": c.benchmark,
        "split": "dev",
        "detector": c.detector,
        "encoder": enc.name,
        "target_frr": c.target_frr,
        "seed": c.seed,
        "protocol": _PROTOCOL,
        "mean": _mean_over_kbs(done),
        "n_kbs": len(done),
        "kbs": per_kb,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_report(c.json_out, report)
    return report


def _mean_over_kbs(done: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each operating-point figure of both thresholds, averaged over the studied KBs."""
    return {
        side: {
            k: sum(r[side][k] for r in done) / len(done)
            for k in ("false_reject_rate", "ood_accept_rate", "balanced_accuracy")
        }
        for side in ("shipped", "recalibrated")
    }
