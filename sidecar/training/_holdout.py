"""A model's figures on labelled held-out queries, and the gates a release must pass.

Behind ``sidecar check``: before a retrained model is promoted, score in-domain (ID) and
out-of-domain (OOD) queries that were never trained on, at the model's own threshold, and
refuse the release when it refuses too many answerable queries or lets too many OOD ones
through. Rates come with exact (Clopper-Pearson) 95% intervals: a few hundred held-out
queries measure a 1% rate only to within a few points, and a gate can be asked to hold at
the pessimistic end of the interval instead of at the point estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring import OODModel
from sidecar.training._metrics import auroc, auroc_standard_error, balanced_accuracy, fpr_at_tpr

# Two-sided confidence of the intervals, and the normal quantile for the AUROC's.
CONFIDENCE = 0.95
_Z = 1.959963984540054


def rate_interval(k: int, n: int) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided 95% interval of a rate of ``k`` events in ``n``."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def _rate(flags: np.ndarray) -> dict[str, Any]:
    k, n = int(flags.sum()), int(flags.size)
    low, high = rate_interval(k, n)
    return {"rate": k / n, "count": k, "n": n, "low": low, "high": high}


def holdout_figures(
    model: OODModel,
    E_id: np.ndarray,
    E_ood: np.ndarray | None,
    languages: tuple[Sequence[str | None] | None, Sequence[str | None] | None] = (None, None),
) -> dict[str, Any]:
    """Figures of ``model`` at its threshold on held-out ID rows ``E_id`` (n, dim) and,
    when given, OOD rows ``E_ood``: false-reject rate (ID flagged OOD) and, with OOD rows,
    OOD accept rate, balanced accuracy, AUROC and FPR at 95% TPR. ``languages``: each ID
    and each OOD row's language (or None), which a model centred by language needs."""
    if len(E_id) == 0:
        raise DataError("no held-out ID queries to check the model on")
    id_langs, ood_langs = languages
    s_id = model.score(E_id, id_langs)
    s_ood = model.score(E_ood, ood_langs) if E_ood is not None and len(E_ood) else None
    s_id, s_ood = _refused_if_unscored(s_id, s_ood, model.threshold)
    out: dict[str, Any] = {
        "threshold": float(model.threshold),
        "n_id": int(s_id.size),
        "false_reject": _rate(s_id > model.threshold),
    }
    copies = model.training_copies(E_id, id_langs)
    if copies is not None:
        out["training_copies"] = {"id": int(copies.sum())}
    if s_ood is None:
        return out
    copies = model.training_copies(E_ood, ood_langs)
    if copies is not None:
        out["training_copies"]["ood"] = int(copies.sum())
    a = auroc(s_id, s_ood)
    se = _auroc_se(a, int(s_id.size), int(s_ood.size))
    out.update(
        n_ood=int(s_ood.size),
        ood_accept=_rate(s_ood <= model.threshold),
        balanced_accuracy=balanced_accuracy(s_id, s_ood, model.threshold),
        auroc={"value": a, "low": max(0.0, a - _Z * se), "high": min(1.0, a + _Z * se)},
        fpr_at_95tpr=fpr_at_tpr(s_id, s_ood, 0.95),
    )
    return out


def _refused_if_unscored(
    s_id: np.ndarray, s_ood: np.ndarray | None, threshold: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """NaN scores (a query that is not all numbers) replaced by a score above every other
    and the threshold: refused, as :meth:`OODModel.predict` refuses it, and ranked the
    most out-of-domain."""
    parts = [s for s in (s_id, s_ood) if s is not None]
    if not any(np.isnan(s).any() for s in parts):
        return s_id, s_ood
    finite = np.concatenate([s[np.isfinite(s)] for s in parts] + [np.array([threshold])])
    top = float(finite.max()) + 1.0
    fixed = [np.where(np.isnan(s), top, s) for s in parts]
    return fixed[0], fixed[1] if s_ood is not None else None


def _auroc_se(a: float, n_id: int, n_ood: int) -> float:
    """Hanley and McNeil's standard error, taken at the AUROC moved half an ID-OOD pair
    toward 0.5: their formula gives 0 at perfect separation, which would let three
    queries of each kind prove an AUROC of 1."""
    pairs = n_id * n_ood
    return auroc_standard_error((a * pairs + 0.5) / (pairs + 1), n_id, n_ood)


@dataclass(frozen=True)
class Gate:
    """One release condition: ``figure`` (false_reject, ood_accept or auroc) at most (or,
    for auroc, at least) ``limit``."""

    option: str
    figure: str
    limit: float

    def judge(self, figures: dict[str, Any], *, conservative: bool) -> dict[str, Any]:
        """``{"gate", "limit", "measured", "met"}``; ``conservative`` judges the end of
        the 95% interval that is worse for the release."""
        if self.figure not in figures:
            raise DataError(f"{self.option} needs OOD queries to measure the {self.figure} rate")
        f = figures[self.figure]
        if self.figure == "auroc":
            measured = f["low"] if conservative else f["value"]
            met = measured >= self.limit
        else:
            measured = f["high"] if conservative else f["rate"]
            met = measured <= self.limit
        return {"gate": self.option, "limit": self.limit, "measured": measured, "met": met}


def write_check_report(
    report: Mapping[str, Any],
    models: Mapping[str, OODModel],
    E_id: np.ndarray,
    E_ood: np.ndarray | None,
    out_dir: str | Path,
    languages: tuple[Sequence[str | None] | None, Sequence[str | None] | None] = (None, None),
) -> Path:
    """A Markdown page with PNG plots of a ``sidecar check``: the figures of each model
    (``models``: "checked" and, when compared, "against"), their ROC curves on the held-out
    queries and each model's ID vs OOD score histogram with its threshold; ``languages``
    as for :func:`holdout_figures`. Returns the page's path."""
    from sidecar.training._report import _plot_hist, _plot_roc

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Held-out check of KB `{report['kb']}`", ""]
    rows = [(role, report[role]) for role in ("checked", "against") if report.get(role)]
    lines += [
        "| model | version | threshold | false-reject rate (95% interval) | OOD accept rate "
        "(95% interval) | balanced accuracy | AUROC |",
        "|---|---|---|---|---|---|---|",
    ]
    for role, f in rows:
        cells = [
            role,
            f"`{f['version'][:12]}`",
            f"{f['threshold']:.4f}",
            _rate_cell(f["false_reject"]),
        ]
        if "ood_accept" in f:
            cells += [
                _rate_cell(f["ood_accept"]),
                f"{f['balanced_accuracy']:.4f}",
                f"{f['auroc']['value']:.4f}",
            ]
        else:
            cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for role, f in rows:
        copies = f.get("training_copies", {})
        if sum(copies.values()):
            lines.append(
                f"- {role}: {copies} of the queries repeat its training queries; its "
                "figures on them are optimistic"
            )
    for g in report.get("gates", []):
        verdict = "met" if g["met"] else "**FAILED**"
        limit = f"{g['gate']} {g['limit']:g}"
        lines.append(f"- gate `{limit}`: {verdict} (measured {g['measured']:.4f})")
    lines.append("")
    ood = E_ood if E_ood is not None else np.zeros((0, E_id.shape[1]), np.float32)
    id_langs, ood_langs = languages
    if E_ood is None:
        ood_langs = None
    scores = {r: (m.score(E_id, id_langs), m.score(ood, ood_langs)) for r, m in models.items()}
    if len(ood):
        _plot_roc(out / "roc.png", scores, title="ROC on the held-out queries")
        lines += ["![ROC on the held-out queries](roc.png)", ""]
    for role, (s_id, s_ood) in scores.items():
        _plot_hist(out / f"hist_{role}.png", role, s_id, s_ood, models[role].threshold)
        lines += [f"![{role}: ID vs OOD scores](hist_{role}.png)", ""]
    page = out / "check.md"
    page.write_text("\n".join(lines))
    return page


def _rate_cell(r: Mapping[str, Any]) -> str:
    return f"{r['rate']:.2%} ({r['count']}/{r['n']}; {r['low']:.2%}-{r['high']:.2%})"
