"""Scores of one detector gathered over evaluation folds, and the metrics they give."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from sidecar.scoring import OODModel
from sidecar.training import auroc, balanced_accuracy, fpr_at_tpr, paper_accuracy, roc_points


def _time_us(model: OODModel, E: np.ndarray, repeats: int = 3) -> float:
    """Median microseconds per query of ``model.score`` on ``E`` (projection + detector)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.score(E)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) / max(len(E), 1) * 1e6)


class Pool:
    """Scores of one detector gathered over folds."""

    def __init__(self) -> None:
        self.s_id: list[np.ndarray] = []
        self.s_ood: list[np.ndarray] = []
        self.m_id: list[np.ndarray] = []
        self.m_ood: list[np.ndarray] = []
        self.dims: list[int] = []
        self.us: list[float] = []
        self.info: list[dict[str, Any]] = []

    def add(
        self, model: OODModel, E_id: np.ndarray, E_ood: np.ndarray, info: dict[str, Any]
    ) -> None:
        s_id, s_ood = model.score(E_id), model.score(E_ood)
        self.s_id.append(s_id)
        self.s_ood.append(s_ood)
        self.m_id.append(s_id - model.threshold)
        self.m_ood.append(s_ood - model.threshold)
        self.dims.append(model.dims)
        self.us.append(_time_us(model, np.vstack([E_id, E_ood])))
        self.info.append(info)

    def result(self, seed: int) -> dict[str, Any]:
        s_id, s_ood = np.concatenate(self.s_id), np.concatenate(self.s_ood)
        m_id, m_ood = np.concatenate(self.m_id), np.concatenate(self.m_ood)
        out: dict[str, Any] = {
            "auroc": auroc(s_id, s_ood),
            "fpr_at_95tpr": fpr_at_tpr(s_id, s_ood, 0.95),
            # margins = score - that fold's threshold, so the threshold is 0 here
            "balanced_accuracy": balanced_accuracy(m_id, m_ood, 0.0),
            "paper_accuracy": paper_accuracy(m_id, m_ood, 0.0, seed=seed),
            # At the calibrated threshold: is the target false-reject rate kept on queries
            # the calibration never saw, and how many OOD queries get through?
            "false_reject_rate": float(np.mean(m_id > 0.0)),
            "ood_accept_rate": float(np.mean(m_ood <= 0.0)),
            "dims": round(float(np.mean(self.dims))),
            "us_per_query": float(np.median(self.us)),
            "n_id": int(s_id.size),
            "n_ood": int(s_ood.size),
            # the curve behind "auroc", pooled over folds, sampled for plots
            "roc": roc_points(s_id, s_ood),
        }
        out.update(self.info[0] if len(self.info) == 1 else {"folds": self.info})
        return out
