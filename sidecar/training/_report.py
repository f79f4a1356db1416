"""The training report: a Markdown page with PNG plots (matplotlib, Agg backend).

Plots: ROC curves of every detector and baseline, ID vs OOD score histograms of the
shipped model, accuracy against m for both PC-selection criteria, and a table per
selected PC of the KB documents that load highest and lowest on it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.training._cross import MAX_FINALISTS

log = logging.getLogger(__name__)


@dataclass
class PCLoadings:
    """One selected PC and the KB documents at its two ends."""

    index: int
    explained_variance_ratio: float
    top: list[tuple[str, str, float]]  # (doc id, text, loading)
    bottom: list[tuple[str, str, float]]


@dataclass
class ReportData:
    """Everything the report shows. Scores are OOD scores (higher = more OOD)."""

    title: str
    summary: dict[str, Any]
    roc: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    histogram: tuple[str, np.ndarray, np.ndarray, float] | None = None
    m_curve: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    pcs: list[PCLoadings] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The search's validation table: one row per candidate (see training.search).
    search: list[dict[str, Any]] = field(default_factory=list)
    # Per-language calibration: language -> {"n", "threshold" (None: the global one),
    # "calibration_frr"}; empty without one.
    languages: dict[str, dict[str, Any]] = field(default_factory=dict)


def pc_loadings(
    kb_projection: np.ndarray,
    doc_ids: Sequence[str],
    texts: Sequence[str],
    selected: Sequence[int],
    evr: np.ndarray,
    n: int = 3,
) -> list[PCLoadings]:
    """Documents loading highest / lowest on each selected PC.

    Parameters
    ----------
    kb_projection : ndarray of shape (n_docs, k)
        KB embeddings projected on all k PCs.
    selected : sequence of int
        The selected PC indices (columns of ``kb_projection``).
    evr : ndarray of shape (k,)
    """
    out = []
    for pc in selected:
        col = kb_projection[:, int(pc)]
        order = np.argsort(col)
        top = [(doc_ids[i], texts[i], float(col[i])) for i in order[::-1][:n]]
        bottom = [(doc_ids[i], texts[i], float(col[i])) for i in order[:n]]
        out.append(PCLoadings(int(pc), float(evr[int(pc)]), top, bottom))
    return out


# solid, long dashes, dash-dot, dots
_LINE_STYLES: tuple[Any, ...] = ("-", (0, (6, 3)), "-.", (0, (1, 2)))


def _plot_roc(
    path: Path,
    roc: Mapping[str, tuple[np.ndarray, np.ndarray]],
    title: str = "ROC on the validation split",
) -> None:
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_auc_score, roc_curve

    fig, ax = plt.subplots(figsize=(6, 5))
    for i, (name, (s_id, s_ood)) in enumerate(roc.items()):
        y = np.r_[np.zeros(len(s_id)), np.ones(len(s_ood))]
        s = np.r_[s_id, s_ood]
        fpr, tpr, _ = roc_curve(y, s)
        label = f"{name} (AUROC {roc_auc_score(y, s):.3f})"
        # dash patterns cycle so that curves on top of each other (several detectors at
        # AUROC 1.0) stay visible as alternating colours
        ax.plot(fpr, tpr, label=label, lw=1.2, ls=_LINE_STYLES[i % len(_LINE_STYLES)])
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set_xlabel("false positive rate (ID flagged OOD)")
    ax.set_ylabel("true positive rate (OOD flagged)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_hist(path: Path, name: str, s_id: np.ndarray, s_ood: np.ndarray, thr: float) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lo = float(min(np.min(s_id), np.min(s_ood) if len(s_ood) else np.inf))
    hi = float(max(np.max(s_id), np.max(s_ood) if len(s_ood) else -np.inf))
    bins: Any = np.linspace(lo, hi, 40) if hi > lo else 10
    ax.hist(s_id, bins=bins, alpha=0.6, density=True, label=f"ID ({len(s_id)})")
    if len(s_ood):
        ax.hist(s_ood, bins=bins, alpha=0.6, density=True, label=f"OOD ({len(s_ood)})")
    ax.axvline(thr, color="k", ls="--", lw=1, label="threshold")
    ax.set_xlabel(f"{name} OOD score")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_m_curve(path: Path, curves: Mapping[str, list[tuple[int, float]]], metric: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for crit, pts in curves.items():
        if pts:
            ms, vals = zip(*sorted(pts), strict=True)
            # EVR solid with filled dots, p-value dashed with open squares: equal curves
            # stay visible as both
            if crit == "pvalue":
                ax.plot(ms, vals, ls="--", marker="s", mfc="none", label=crit)
            else:
                ax.plot(ms, vals, marker="o", label=crit)
    ax.set_xlabel("m (selected PCs)")
    ax.set_ylabel(metric)
    ax.set_title("EVR vs p-value PC selection", fontsize="medium")
    ax.legend(title="criterion")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(text: str, limit: int = 90) -> str:
    t = " ".join(text.split()).replace("|", "\\|")
    return t if len(t) <= limit else t[: limit - 1] + "…"


def write_report(data: ReportData, out_dir: str | Path, *, m_metric: str = "accuracy") -> Path:
    """Write ``report.md``, ``summary.json`` and the PNGs into ``out_dir``; return the page."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {data.title}", ""]
    lines += ["| key | value |", "|---|---|"]
    for k, v in data.summary.items():
        shown = json.dumps(v) if isinstance(v, dict | list) else str(v)
        lines.append(f"| {k} | {_cell(shown, 200)} |")
    lines.append("")
    for note in data.notes:
        lines += [f"> {note}", ""]
    if data.languages:
        lines += _language_table(data.languages, float(data.summary["threshold"]))
    if data.roc:
        _plot_roc(out / "roc.png", data.roc)
        lines += ["## ROC curves", "", "![ROC curves](roc.png)", ""]
    if data.histogram is not None:
        name, s_id, s_ood, thr = data.histogram
        _plot_hist(out / "scores.png", name, s_id, s_ood, thr)
        which = "ID vs OOD" if len(s_ood) else "ID only: no OOD queries"
        lines += [f"## Score histograms (validation, {which})", "", "![scores](scores.png)", ""]
    if any(data.m_curve.values()):
        _plot_m_curve(out / "m_curve.png", data.m_curve, m_metric)
        title = f"{m_metric[:1].upper()}{m_metric[1:]} against m (EVR vs p-value)"
        lines += [f"## {title}", "", "![m curve](m_curve.png)", ""]
        lines += _m_table(data.m_curve)
    if data.search:
        lines += _search_table(data.search, str(data.summary.get("criterion") or ""))
    if data.pcs:
        lines += [
            "## Selected principal components",
            "",
            "Each PC with the KB documents at its positive and negative ends. PCs are",
            "numbered from 0 in order of explained variance.",
            "",
        ]
        for pc in data.pcs:
            lines += [
                f"### PC {pc.index} (explained variance {pc.explained_variance_ratio:.3%})",
                "",
                "| end | doc | loading | text |",
                "|---|---|---|---|",
            ]
            for end, docs in (("+", pc.top), ("-", pc.bottom)):
                for doc_id, text, val in docs:
                    lines.append(f"| {end} | {_cell(doc_id, 30)} | {val:+.3f} | {_cell(text)} |")
            lines.append("")
    page = out / "report.md"
    page.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(data.summary, indent=2, default=str) + "\n")
    log.info("report written to %s", page)
    return page


def _language_table(langs: Mapping[str, Mapping[str, Any]], threshold: float) -> list[str]:
    """The per-language thresholds: each language's calibration queries, its threshold
    (or the global one it keeps) and the share of its queries that threshold refuses."""
    rows = [
        "## Per-language thresholds",
        "",
        "Each language with enough ID training queries for the conformal rank has its own "
        "threshold, calibrated on its queries' held-out (or out-of-fold) scores; the others, "
        f"and queries whose language is not told, meet the global one ({threshold:.6g}).",
        "",
        "| language | calibration queries | threshold | refused of them |",
        "|---|---|---|---|",
    ]
    for lang, row in langs.items():
        thr = row.get("threshold")
        frr = row.get("calibration_frr")
        shown = "global (too few)" if thr is None else f"{thr:.6g}"
        rows.append(
            f"| {lang} | {row.get('n')} | {shown} | {'-' if frr is None else f'{frr:.2%}'} |"
        )
    return [*rows, ""]


def _m_table(curves: Mapping[str, list[tuple[int, float]]]) -> list[str]:
    ms = sorted({m for pts in curves.values() for m, _ in pts})
    rows = [
        "| criterion | " + " | ".join(f"m={m}" for m in ms) + " |",
        "|---" * (len(ms) + 1) + "|",
    ]
    for crit, pts in curves.items():
        got = dict(pts)
        rows.append(
            f"| {crit} | " + " | ".join(f"{got[m]:.4f}" if m in got else "" for m in ms) + " |"
        )
    return [*rows, ""]


def _search_table(rows: Sequence[Mapping[str, Any]], criterion: str = "") -> list[str]:
    """The search's candidates; ``criterion`` names the one criterion of rows without their own."""
    oof = any("finalist" in r for r in rows)
    auto = any(r.get("criterion") for r in rows)
    out = ["## Search (validation split)", ""]
    if not any(isinstance(r.get("val_auroc"), float) for r in rows):
        out += [
            "Without OOD queries in the validation split there is no validation AUROC to",
            "rank the candidates: the first candidate of the grid that fits is kept.",
        ]
    else:
        out += [
            "Every candidate, fitted on the fit part and scored on the validation part. The",
            "candidates within one standard error of the best validation AUROC are the",
            "shortlist, fewest dimensions first.",
        ]
        if oof:
            out += [
                f"Each finalist (the first {MAX_FINALISTS} of the shortlist) was also scored",
                "out of fold on the ID and OOD training queries; the kept one has the best",
                "out-of-fold balanced accuracy at its own calibrated threshold.",
            ]
        else:
            out += ["The kept one has the fewest dimensions of the shortlist."]
    if auto:
        how = "out-of-fold balanced accuracy" if oof else "validation AUROC"
        out += [
            "",
            "`--criterion auto`: each criterion was searched on its own and kept one",
            f"candidate; the two were compared by {how} (a tie goes to p-value).",
            "**picked** is the one shipped, *best evr* or *best pvalue* the other criterion's.",
        ]
    head = "| criterion | m | parameters | residual k | dims | validation AUROC |"
    rule = "|---|---|---|---|---|---|"
    if oof:
        head += " finalist | out-of-fold bal. acc. | out-of-fold OOD accepted |"
        rule += "---|---|---|"
    out += ["", head + " kept |", rule + "---|"]
    for r in rows:
        params = ", ".join(f"{k}={v}" for k, v in dict(r.get("params") or {}).items())
        auc = r.get("val_auroc")
        shown = f"{auc:.4f}" if isinstance(auc, float) else str(r.get("skipped", ""))
        kept = "**picked**" if r.get("picked") else ""
        if r.get("criterion_pick"):
            kept = f"*best {r.get('criterion')}*"
        line = (
            f"| {r.get('criterion') or criterion} | {r.get('m')} | {_cell(params, 120)} | "
            f"{r.get('residual_ks') or ''} | "
            f"{r.get('dims', '')} | {_cell(shown, 60)} |"
        )
        if oof:
            ba, oar = r.get("oof_balanced_accuracy"), r.get("oof_ood_accept_rate")
            line += (
                f" {r.get('finalist', '')} | {'' if ba is None else f'{ba:.4f}'} | "
                f"{'' if oar is None else f'{oar:.2%}'} |"
            )
        out.append(f"{line} {kept} |")
    return [*out, ""]
