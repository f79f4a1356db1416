"""Judge a release: a model's held-out figures, beside another version's, against gates.

Behind ``sidecar check``: :func:`check_release` gathers what the command prints and
writes as JSON from the figures of :func:`~sidecar.training.holdout_figures` and the
verdicts of each :class:`~sidecar.training.Gate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sidecar.scoring import OODModel
from sidecar.training._holdout import Gate, holdout_figures


def check_release(
    model: OODModel,
    version: str,
    E_id: np.ndarray,
    E_ood: np.ndarray | None,
    gates: Sequence[Gate],
    *,
    against: tuple[OODModel, str] | None = None,
    conservative: bool = False,
    languages: tuple[Sequence[str | None] | None, Sequence[str | None] | None] = (None, None),
) -> dict[str, Any]:
    """The figures of ``model`` (store ``version``) on held-out queries and the gates' verdicts.

    Parameters
    ----------
    model, version
        The checked model and its version id.
    E_id : ndarray of shape (n_id, dim)
        Held-out in-domain query embeddings.
    E_ood : ndarray of shape (n_ood, dim) or None
        Held-out out-of-domain query embeddings (None: only the false-reject rate).
    gates
        Release conditions, judged on the checked model only.
    against
        Another (model, version) measured on the same queries, for comparison.
    conservative
        Judge each gate at the worse end of the figure's 95% interval.
    languages
        Each ID and each OOD query's language (or None), for a model centred by language.

    Returns
    -------
    dict
        ``{"kb", "checked", "against", "gates", "conservative", "passed"}``: the figures
        of each model (with its ``version``; ``against`` None when not compared), one
        verdict per gate, and whether all of them were met.
    """
    figures = {"version": version, **holdout_figures(model, E_id, E_ood, languages)}
    report: dict[str, Any] = {"kb": model.kb, "checked": figures, "against": None}
    if against is not None:
        other, other_version = against
        theirs = holdout_figures(other, E_id, E_ood, languages)
        report["against"] = {"version": other_version, **theirs}
    verdicts = [g.judge(figures, conservative=conservative) for g in gates]
    report.update(gates=verdicts, conservative=conservative)
    report["passed"] = all(v["met"] for v in verdicts)
    return report
