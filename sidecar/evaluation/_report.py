"""The evaluation report: a Markdown page with PNG plots, drawn from an eval JSON.

Plots: AUROC of every detector on every KB (a heatmap: which wins where), mean AUROC and
balanced accuracy per detector, p-value against EVR PC selection at the protocol's m, and
cost against quality (microseconds per query against mean AUROC). Tables: the targets
with their measured figures, the means, and the p-value-vs-EVR differences.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.evaluation._eval_json import SPREAD_SHOWN
from sidecar.evaluation._targets import BASELINES, PAPER_DETECTORS, PRODUCT_DETECTOR
from sidecar.training import METRIC_KEYS

log = logging.getLogger(__name__)

_DPI = 100


def _detectors(report: Mapping[str, Any]) -> list[str]:
    """Detectors of the report, best mean AUROC first."""
    mean = report["mean"]
    return sorted(mean, key=lambda d: -float(mean[d].get("auroc", 0.0)))


def _colour(name: str) -> str:
    if name == PRODUCT_DETECTOR:
        return "tab:red"
    return "tab:gray" if name in BASELINES else "tab:blue"


def _plot_heatmap(path: Path, report: Mapping[str, Any], dets: Sequence[str]) -> None:
    import matplotlib.pyplot as plt

    kbs = list(report["kbs"])
    grid = np.array(
        [[float(report["kbs"][kb].get(d, {}).get("auroc", np.nan)) for kb in kbs] for d in dets]
    )
    # at least room for the title and a readable colour bar (covid has one KB)
    fig, ax = plt.subplots(figsize=(max(4.8, 1.6 + 0.85 * len(kbs)), 1.4 + 0.42 * len(dets)))
    lo = float(np.nanmin(grid)) if np.isfinite(grid).any() else 0.5
    im = ax.imshow(grid, cmap="viridis", vmin=min(lo, 0.99), vmax=1.0, aspect="auto")
    for i in range(len(dets)):
        for j in range(len(kbs)):
            if np.isfinite(grid[i, j]):
                dark = grid[i, j] < lo + 0.6 * (1.0 - lo)
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.3f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
    ax.set_xticks(range(len(kbs)), kbs, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(dets)), dets, fontsize=8)
    ax.set_title("AUROC per KB (rows: best mean first)", fontsize="medium")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, aspect=40)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _plot_means(path: Path, report: Mapping[str, Any], dets: Sequence[str]) -> None:
    import matplotlib.pyplot as plt

    mean = report["mean"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.9 + 0.32 * len(dets)), sharey=True)
    y = np.arange(len(dets))
    for ax, key, label in (
        (axes[0], "auroc", "mean AUROC"),
        (axes[1], "balanced_accuracy", "balanced accuracy at the calibrated threshold"),
    ):
        vals = np.array([float(mean[d].get(key, np.nan)) for d in dets])
        ax.barh(y, vals, color=[_colour(d) for d in dets])
        finite = vals[np.isfinite(vals)]
        lo = float(finite.min()) if finite.size else 0.0
        ax.set_xlim(max(0.0, lo - 0.05), 1.0)
        for yi, v in zip(y, vals, strict=True):
            if np.isfinite(v):
                ax.text(v, yi, f" {v:.3f}", va="center", fontsize=7)
        ax.set_xlabel(label, fontsize=8)
    axes[0].set_yticks(y, dets, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(
        "red: the product's detector, blue: the paper's and the residual, grey: baselines",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _plot_protocol(path: Path, table: Mapping[str, Any]) -> None:
    import matplotlib.pyplot as plt

    rows = table["detectors"]
    dets = [d for d in (*PAPER_DETECTORS, PRODUCT_DETECTOR) if d in rows]
    evr = [rows[d]["paper_accuracy"]["evr"] for d in dets]
    pv = [rows[d]["paper_accuracy"]["pvalue"] for d in dets]
    x = np.arange(len(dets))
    fig, ax = plt.subplots(figsize=(1.5 + 1.0 * len(dets), 4))
    ax.bar(x - 0.2, evr, 0.4, label="EVR (top-m by variance)", color="tab:gray")
    ax.bar(x + 0.2, pv, 0.4, label="p-value (Welch t-test)", color="tab:blue")
    for xi, e, p in zip(x, evr, pv, strict=True):
        ax.text(float(xi), max(e, p) + 0.01, f"{p - e:+.3f}", ha="center", fontsize=8)
    ax.set_xticks(x, dets, rotation=20, fontsize=8)
    ax.set_ylim(max(0.0, min(evr + pv, default=0.0) - 0.1), 1.12)
    ax.set_ylabel("accuracy on a balanced sample (paper_accuracy)", fontsize=8)
    ax.set_title(f"PC selection at m = {table.get('m')}: p-value minus EVR", fontsize="medium")
    ax.legend(fontsize=8, loc="upper center", ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _plot_cost(path: Path, report: Mapping[str, Any], dets: Sequence[str]) -> None:
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    mean = report["mean"]
    pts = [
        (d, float(mean[d]["us_per_query"]), float(mean[d]["auroc"]))
        for d in dets
        if mean[d].get("us_per_query") and mean[d].get("auroc") is not None
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    for d, us, au in pts:
        ax.scatter(us, au, color=_colour(d), s=25)
    ax.set_xscale("log")
    # plain numbers (3, 10, 20) instead of 3x10^0 when the axis spans about a decade
    ax.xaxis.set_major_formatter(ticker.LogFormatter())
    ax.xaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
    ax.set_xlabel("microseconds per query (detector only, encoder excluded)", fontsize=8)
    ax.set_ylabel("mean AUROC", fontsize=8)
    ax.set_title("cost against quality", fontsize="medium")
    fig.tight_layout()
    _place_labels(fig, ax, [(d, us, au) for d, us, au in pts])
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


# Where a point's label may go, in points from the point: right-above first, then
# right-below, left-above, left-below, and further out on each side.
_LABEL_SPOTS = (
    ((4, 3), "left"),
    ((4, -9), "left"),
    ((-4, 3), "right"),
    ((-4, -9), "right"),
    ((4, 12), "left"),
    ((4, -18), "left"),
)


def _place_labels(fig: Any, ax: Any, pts: Sequence[tuple[str, float, float]]) -> list[Any]:
    """Label each point at the first spot inside the axes that overlaps no earlier label.

    Points close together (two baselines of the same cost and AUROC) otherwise print
    their names over each other, and a point at the edge loses half its name. With no
    free spot the label keeps the first one.
    """
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    boxes: list[Any] = []

    def free(box: Any) -> bool:
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1
        inside = inside and frame.y0 <= box.y0 and box.y1 <= frame.y1
        return inside and not any(box.overlaps(b) for b in boxes)

    for name, x, y in pts:
        for spot, (offset, ha) in enumerate((*_LABEL_SPOTS, _LABEL_SPOTS[0])):
            text = ax.annotate(
                name, (x, y), textcoords="offset points", xytext=offset, fontsize=7, ha=ha
            )
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            if spot == len(_LABEL_SPOTS) or free(box):  # the last try is the fallback
                break
            text.remove()
        placed.append(text)
        boxes.append(box)
    return placed


def _fmt(v: Any, spec: str = ".4f") -> str:
    """Numbers with ``spec``; a dict as ``key value, ...``; lists comma-joined."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x, spec)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x, spec) for x in v) + "]"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def write_eval_report(report: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``report.md`` and its PNGs for one eval JSON into ``out_dir``; return the page."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dets = _detectors(report)
    lines = _settings_lines(report)
    lines += _targets_lines(report)
    lines += _means_lines(report, dets)
    lines += _spread_lines(report, dets)
    lines += _plotted_lines(out, report, dets)
    lines += _protocol_lines(out, report)
    page = out / "report.md"
    page.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log.info("evaluation report written to %s", page)
    return page


def _settings_lines(report: Mapping[str, Any]) -> list[str]:
    """The title and the table of the run's settings."""
    lines = [f"# Evaluation: {report['benchmark']} ({report.get('split', '?')} split)", ""]
    lines += ["| setting | value |", "|---|---|"]
    shown = ("encoder", "criterion", "threshold_rule", "calibration", "target_frr", "fold_grouping")
    for key in (*shown, "seed", "wall_s"):
        if key in report:
            lines.append(f"| {key} | {report[key]} |")
    return [*lines, f"| KBs | {len(report['kbs'])} |", ""]


def _targets_lines(report: Mapping[str, Any]) -> list[str]:
    """The targets with their measured figures; nothing when the report has none."""
    if not report.get("targets"):
        return []
    lines = ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {_fmt(t['measured'])} | {met} |")
    return [*lines, ""]


def _means_lines(report: Mapping[str, Any], dets: Sequence[str]) -> list[str]:
    """The mean of every metric over the KBs, one row per detector."""
    keys = METRIC_KEYS
    lines = [
        "## Means over the KBs",
        "",
        "Every column is the mean of the per-KB figures, `dims` too (the targets give the",
        "largest).",
        "",
        "| detector | " + " | ".join(keys) + " |",
    ]
    lines.append("|---" * (len(keys) + 1) + "|")
    for d in dets:
        row = report["mean"][d]
        specs = {"dims": ".1f", "us_per_query": ".1f"}
        cells = [_fmt(row.get(k, ""), specs.get(k, ".4f")) for k in keys]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _spread_lines(report: Mapping[str, Any], dets: Sequence[str]) -> list[str]:
    """Median [min, max] over seeds of each mean figure; nothing for a one-seed report."""
    spread = report.get("seed_spread") or {}
    if not spread.get("mean"):
        return []
    keys_s = SPREAD_SHOWN
    lines = [
        f"## Spread over seeds {spread.get('seeds')}",
        "",
        "Median [min, max] of each mean figure; the seed draws the splits and folds.",
        "",
        "| detector | " + " | ".join(keys_s) + " |",
        "|---" * (len(keys_s) + 1) + "|",
    ]
    for d in dets:
        row = spread["mean"].get(d, {})
        cells = [
            f"{row[k]['median']:.4f} [{row[k]['min']:.4f}, {row[k]['max']:.4f}]" if k in row else ""
            for k in keys_s
        ]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _plotted_lines(out: Path, report: Mapping[str, Any], dets: Sequence[str]) -> list[str]:
    """Draw the heatmap, the means and (with timings) cost against quality; their links."""
    _plot_heatmap(out / "auroc_by_kb.png", report, dets)
    _plot_means(out / "detectors.png", report, dets)
    lines = ["## Which wins where", "", "![AUROC per KB](auroc_by_kb.png)", ""]
    lines += ["![means per detector](detectors.png)", ""]
    if any(report["mean"][d].get("us_per_query") for d in dets):
        _plot_cost(out / "cost_quality.png", report, dets)
        lines += ["## Cost against quality", "", "![cost against quality](cost_quality.png)", ""]
    return lines


def _protocol_lines(out: Path, report: Mapping[str, Any]) -> list[str]:
    """Draw p-value against EVR and tabulate the differences; nothing without a protocol."""
    table = report.get("pvalue_vs_evr") or {}
    if not table.get("detectors"):
        return []
    _plot_protocol(out / "pvalue_vs_evr.png", table)
    lines = [f"## p-value vs EVR PC selection (m = {table.get('m')})", ""]
    lines += ["![p-value vs EVR](pvalue_vs_evr.png)", ""]
    lines += [
        "EVR and p-value columns: accuracy on a balanced ID/OOD sample (`paper_accuracy`,",
        "the paper's protocol) at each model's calibrated threshold, mean over the KBs.",
        "",
        "| detector | EVR | p-value | p-value minus EVR | KBs where p-value wins "
        "| AUROC difference |",
        "|---|---|---|---|---|---|",
    ]
    for d, row in table["detectors"].items():
        pa = row["paper_accuracy"]
        lines.append(
            f"| {d} | {pa['evr']:.4f} | {pa['pvalue']:.4f} | {pa['mean_diff']:+.4f} | "
            f"{pa['kbs_pvalue_better']}/{pa['kbs']} | {row['auroc']['mean_diff']:+.4f} |"
        )
    avg = table.get("paper_detectors_mean")
    if avg:
        pa = avg["paper_accuracy"]
        lines.append(
            f"| mean of the paper's detectors | {pa['evr']:.4f} | {pa['pvalue']:.4f} | "
            f"{pa['mean_diff']:+.4f} | {pa['detectors_pvalue_better']}/"
            f"{len(avg['detectors'])} detectors | {avg['auroc']['mean_diff']:+.4f} |"
        )
    return [*lines, ""]
