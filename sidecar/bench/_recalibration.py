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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError
from sidecar.evaluation import KBTask
from sidecar.scoring import OODModel, min_calibration_size, recalibrate
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
