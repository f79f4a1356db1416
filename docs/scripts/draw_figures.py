"""Draw the documentation's figures from the recorded benchmark JSON.

    python docs/scripts/draw_figures.py [--results benchmarks/results] [--out docs/assets/figures]

Every figure except the data-flow diagram is drawn from numbers in the recorded JSON
files, never typed in here; each figure's caption in the docs names its source file.
``docs/hooks.py`` calls :func:`draw_all` at every ``mkdocs build``, so the site's figures
follow the JSON; run this script to refresh the PNGs committed under
``docs/assets/figures/`` (the README shows them).

What the JSON does not record, the figures do not show:

- the evaluation JSON keeps each ROC curve sampled at 20 false-positive rates (dense
  below 0.1), so the curves are drawn through those points;
- the batch-size figure reads ``sidecar bench e2e --sweep-batch-max``: one whole run per
  ``batch_max`` (throughput at saturation, latency at half that run's throughput);
- the swap benchmark records, per run, how long after the promotion (and the rollback)
  each replica installed the model and produced its first verdict with it, and the
  latency percentiles in steady state and during the swap window, not a time series.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.ticker import NullFormatter

REPO = Path(__file__).resolve().parents[2]
# Where the recorded benchmark JSON lives.
RESULTS = REPO / "benchmarks" / "results"
OUT_DIR = REPO / "docs" / "assets" / "figures"

DEFAULT_COLOR = "#00897b"  # the default detector (teal, as the site)
BASELINE_COLOR = "#8e8e8e"
ACCENT = "#3949ab"
# No timestamps or versions in the PNG, so a redraw of the same JSON gives the same bytes.
SAVE_KW: dict[str, Any] = {"dpi": 110, "metadata": {"Software": None}, "bbox_inches": "tight"}


def results_dir() -> Path:
    if (RESULTS / "swap.json").is_file():
        return RESULTS
    raise FileNotFoundError(f"no recorded benchmark JSON in {RESULTS}")


def _load(results: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((results / name).read_text(encoding="utf-8"))
    return data


# ---------------------------------------------------------------------------------------
# The data flow (a diagram, no numbers)


def data_flow(results: Path) -> Figure:
    fig, ax = plt.subplots(figsize=(11, 5.2))
    ax.set_xlim(0, 110)
    ax.set_ylim(0, 52)
    ax.axis("off")

    def box(x: float, y: float, w: float, h: float, text: str, color: str) -> None:
        ax.add_patch(
            FancyBboxPatch(
                (x, y), w, h, boxstyle="round,pad=0.6,rounding_size=1.5",
                facecolor=color, edgecolor="#37474f", linewidth=1.1,
            )
        )  # fmt: skip
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9.5)

    def arrow(a: tuple[float, float], b: tuple[float, float], label: str = "") -> None:
        ax.add_patch(
            FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, color="#37474f", lw=1.2)
        )
        if label:
            ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 1.2, label, ha="center",
                    va="bottom", fontsize=8, color="#37474f")  # fmt: skip

    kafka, worker, store, job, client = "#e3f2fd", "#e0f2f1", "#fff3e0", "#f3e5f5", "#fafafa"
    # training side (top)
    box(2, 40, 17, 8, "KB documents\n+ labelled queries", client)
    box(30, 40, 24, 8, "sidecar train\nembed → PCA → PCs →\ndetector → calibrate", job)
    box(66, 40, 22, 8, "model store (Redis)\nversions · active pointer\n· event stream", store)
    box(93, 40, 15, 8, "sidecar check /\nmodels promote", job)
    arrow((21, 44), (29, 44))
    arrow((55, 44), (65, 44), "publish")
    arrow((92, 44), (89, 44))
    # serving side (middle)
    box(2, 20, 17, 8, "RAG front end", client)
    box(27, 20, 16, 8, "Kafka\nqueries", kafka)
    box(
        50,
        18,
        27,
        12,
        "sidecar worker(s)\nmicro-batch: decode → embed\n→ project → detect\n→ stamp model version",
        worker,
    )
    box(85, 24, 21, 7, "Kafka verdicts\n(+ ID / OOD topics)", kafka)
    box(85, 13, 21, 7, "Kafka dead letters\n(payload, reason, offset)", kafka)
    arrow((20, 24), (26, 24))
    arrow((44, 24), (49, 24))
    arrow((78, 26), (84, 27.5))
    arrow((78, 21), (84, 16.5))
    arrow((77, 39), (68, 31))
    ax.text(74, 34.5, "hot-swap, every replica", fontsize=8, color="#37474f")
    # explanations (bottom)
    box(2, 2, 17, 7, "explanation\nrequests", client)
    box(27, 2, 16, 7, "Kafka\naudit topic", kafka)
    box(51, 2, 24, 7, "rule miner\n(black-box LLM over\nsource subsets)", worker)
    box(85, 2, 21, 7, "Kafka\nexplanation results", kafka)
    arrow((20, 5.5), (26, 5.5))
    arrow((44, 5.5), (50, 5.5))
    arrow((76, 5.5), (84, 5.5))
    ax.set_title("How a query and a model travel", fontsize=12, loc="left")
    return fig


# ---------------------------------------------------------------------------------------
# Hot-swap timeline (swap.json)


def hot_swap_timeline(results: Path) -> Figure:
    swap = _load(results, "swap.json")
    runs = [r for r in swap["runs"] if isinstance(r, dict)]
    fig, (ax, lat) = plt.subplots(1, 2, figsize=(11.5, 4.2), gridspec_kw={"width_ratios": [2.1, 1]})
    rows: list[str] = []
    y = 0
    for i, run in enumerate(runs, start=1):
        for event in ("promote", "rollback"):
            rec = run["swap_latency_ms"][event]
            for replica in sorted(rec["first_verdict_per_replica"]):
                installed = rec["installed_per_replica"][replica]
                first = rec["first_verdict_per_replica"][replica]
                ax.plot([0, installed], [y, y], color="#cfd8dc", lw=5, solid_capstyle="butt")
                ax.plot([installed, first], [y, y], color=ACCENT, lw=5, alpha=0.35,
                        solid_capstyle="butt")  # fmt: skip
                ax.plot(installed, y, "o", color=DEFAULT_COLOR, ms=6)
                ax.plot(first, y, "D", color=ACCENT, ms=6)
                rows.append(f"run {i} {event}, {replica}")
                y += 1
            y += 0.6
    target = float(swap["targets"]["swap_latency_ms"])
    ax.axvline(target, color="#c62828", ls="--", lw=1)
    ax.text(target, -0.9, f"target {target:.0f} ms", color="#c62828", ha="right", fontsize=8)
    ticks = []
    pos = 0.0
    for _i in range(len(runs)):
        for _event in ("promote", "rollback"):
            n = len(runs[0]["swap_latency_ms"]["promote"]["first_verdict_per_replica"])
            ticks.extend(pos + k for k in range(n))
            pos += n + 0.6
    ax.set_yticks(ticks[: len(rows)], rows, fontsize=7.5)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the pointer moved")
    ax.set_title(
        "Every replica switches: ● model installed, ◆ first verdict with it", fontsize=10,
        loc="left",
    )  # fmt: skip
    ax.grid(axis="x", alpha=0.3)

    labels = [f"run {i}" for i in range(1, len(runs) + 1)]
    xs = range(len(runs))
    width = 0.2
    series = (
        ("p50 steady", "p50_latency_ms_steady", "#b2dfdb"),
        ("p50 during swap", "p50_latency_ms_during_swap", DEFAULT_COLOR),
        ("p99 steady", "p99_latency_ms_steady", "#c5cae9"),
        ("p99 during swap", "p99_latency_ms_during_swap", ACCENT),
    )
    for k, (label, key, color) in enumerate(series):
        lat.bar([x + (k - 1.5) * width for x in xs], [r[key] for r in runs], width,
                label=label, color=color)  # fmt: skip
    lat.set_xticks(list(xs), labels)
    lat.set_ylabel("query latency, ms")
    lat.set_title("Latency does not jump during the swap", fontsize=10, loc="left")
    lat.legend(fontsize=7.5, loc="lower right")
    lat.grid(axis="y", alpha=0.3)
    cfg = swap["config"]
    fig.suptitle(
        f"Hot-swap, {cfg['replicas']} replicas, {cfg['partitions']} partitions, "
        f"{cfg['rate_qps']:.0f} queries/s (swap.json)",
        fontsize=11, x=0.01, ha="left",
    )  # fmt: skip
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# Throughput and latency against batch size (e2e_batch_sweep.json, detectors.json)

SWEEP_FILE = "e2e_batch_sweep.json"


def batch_size(results: Path) -> Figure:
    fig, (qps, lat, det) = plt.subplots(1, 3, figsize=(13.5, 4.2))
    sweep = _load(results, SWEEP_FILE)
    points = sorted(sweep["points"], key=lambda p: p["batch_max"])
    sizes = [p["batch_max"] for p in points]
    qps.plot(sizes, [p["throughput_qps"] for p in points], "o-", color=DEFAULT_COLOR,
             label="worker on the broker (saturation)")  # fmt: skip
    qps.plot(sizes, [p["encoder_only_qps"] for p in points], "s--", color=BASELINE_COLOR,
             label="encoder alone, same batch size")  # fmt: skip
    qps.set_ylim(bottom=0)
    qps.set_ylabel("queries/s")
    qps.set_title("Throughput against batch_max", fontsize=10, loc="left")
    qps.legend(fontsize=7.5, loc="lower right")

    halves = [p["half_rate"] for p in points]
    lat.plot(sizes, [h["latency_ms_p50"] for h in halves], "o-", color=ACCENT, label="p50")
    lat.plot(sizes, [h["latency_ms_p99"] for h in halves], "o-", color=DEFAULT_COLOR,
             label="p99")  # fmt: skip
    for size, h in zip(sizes, halves, strict=True):
        lat.annotate(f"{h['rate_qps']:.0f}/s", (size, h["latency_ms_p99"]), fontsize=7,
                     textcoords="offset points", xytext=(0, 5), ha="center")  # fmt: skip
    lat.axhline(50, color="#c62828", ls="--", lw=1)
    lat.text(sizes[0], 51.5, "target p99 ≤ 50 ms", color="#c62828", fontsize=8)
    lat.set_ylim(0, max(60.0, 1.15 * max(h["latency_ms_p99"] for h in halves)))
    lat.set_ylabel("latency, ms (produce to verdict read back)")
    lat.set_title("Latency at half of each run's own throughput", fontsize=10, loc="left")
    lat.legend(fontsize=7.5, loc="upper right")
    for ax in (qps, lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("scoring.batch_max")
        ax.grid(alpha=0.3)

    detectors = _load(results, "detectors.json")["detectors"]
    names = sorted(detectors, key=lambda n: detectors[n]["model_us_per_query_batch256"])
    b1 = [detectors[n]["model_us_per_query_batch1"] for n in names]
    b256 = [detectors[n]["model_us_per_query_batch256"] for n in names]
    yy = range(len(names))
    det.barh([y + 0.2 for y in yy], b1, 0.4, label="batch 1", color="#c5cae9")
    det.barh([y - 0.2 for y in yy], b256, 0.4, label="batch 256", color=DEFAULT_COLOR)
    det.set_yticks(list(yy), names, fontsize=8)
    det.set_xscale("log")
    det.xaxis.set_minor_formatter(NullFormatter())
    det.set_xticks([1, 2, 5, 10, 20, 50], ["1", "2", "5", "10", "20", "50"])
    det.set_xlabel("µs per query from the embedding (detectors.json)")
    det.set_title("Detector cost, batch 1 against 256", fontsize=10, loc="left")
    det.legend(fontsize=7.5)
    det.grid(axis="x", alpha=0.3)
    loads = [p[k][0] for p in points for k in ("load_average_1_5_15_start",
                                                "load_average_1_5_15_end")]  # fmt: skip
    fig.suptitle(
        f"One worker on {sweep['cpu_count']} CPUs, {sweep['source']} queries, "
        f"{sweep['batch_timeout_ms']} ms linger; each batch_max a whole run ({SWEEP_FILE}); "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} during the sweep",
        fontsize=10.5, x=0.01, ha="left",
    )  # fmt: skip
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------
# ROC: the default detector against max-cosine (eval_*_dev.json, seed 0, which keep every
# detector's curve per KB)
EVAL_FILES = (
    ("eval_clinc150_dev.json", "CLINC150 (10 KBs)"),
    ("eval_stackexchange_dev.json", "StackExchange (8 KBs)"),
    ("eval_covid_dev.json", "covid"),
)
DETECTORS = (("combined", "combined (default)", DEFAULT_COLOR), ("max_cosine", "max-cosine",
                                                                   BASELINE_COLOR))  # fmt: skip


def roc(results: Path) -> Figure:
    fig, axes = plt.subplots(2, 3, figsize=(13, 8.2))
    for col, (name, title) in enumerate(EVAL_FILES):
        data = _load(results, name)
        top, bottom = axes[0][col], axes[1][col]
        kbs = list(data["kbs"])
        for key, label, color in DETECTORS:
            curves = [data["kbs"][kb][key]["roc"] for kb in kbs]
            fpr = np.asarray(curves[0]["fpr"])
            tprs = np.asarray([c["tpr"] for c in curves])
            shown = fpr > 0  # a log axis: the rate 0 has no place on it
            if len(kbs) > 1:
                for t in tprs:
                    top.plot(fpr[shown], t[shown], color=color, lw=0.6, alpha=0.3)
            mean_auc = data["mean"][key]["auroc"]
            top.plot(fpr[shown], tprs.mean(axis=0)[shown], color=color, lw=2.2,
                     label=f"{label}, mean AUROC {mean_auc:.4f}")  # fmt: skip
            frr = [data["kbs"][kb][key]["false_reject_rate"] for kb in kbs]
            caught = [1 - data["kbs"][kb][key]["ood_accept_rate"] for kb in kbs]
            top.scatter(np.maximum(frr, fpr[shown][0]), caught, marker="o", s=30, color=color,
                        edgecolor="white", linewidth=0.6, zorder=3)  # fmt: skip
        target = data.get("target_frr")
        if target:
            top.axvline(target, color="#c62828", lw=0.9, ls="--")
            top.text(target * 0.93, 0.6, f"target FRR {target:g}", color="#c62828",
                     fontsize=7.5, ha="right", va="bottom", rotation=90)  # fmt: skip
        top.set_xscale("log")
        top.set_xlim(fpr[shown][0], 1.0)
        top.set_ylim(0.5, 1.005)
        top.set_xlabel("in-domain queries refused (false-positive rate, log)")
        if col == 0:
            top.set_ylabel("OOD queries caught (true-positive rate)")
        top.set_title(title, fontsize=10, loc="left")
        top.legend(fontsize=7.5, loc="lower right")
        top.grid(alpha=0.3, which="both")

        xs = range(len(kbs))
        for k, (key, label, color) in enumerate(DETECTORS):
            bottom.bar([x + (k - 0.5) * 0.38 for x in xs],
                       [data["kbs"][kb][key]["auroc"] for kb in kbs], 0.38,
                       label=label, color=color)  # fmt: skip
        low = min(data["kbs"][kb][key]["auroc"] for kb in kbs for key, _, _ in DETECTORS)
        bottom.set_ylim(max(0.0, low - 0.01), 1.0005)
        bottom.set_xticks(list(xs), kbs, rotation=45, ha="right", fontsize=7.5)
        if col == 0:
            bottom.set_ylabel("AUROC per KB")
        bottom.grid(axis="y", alpha=0.3)
    fig.suptitle(
        "Default detector against max-cosine on the dev splits. Top: ROC curves, the mean "
        "over KBs bold and each KB thin; ● each KB at its calibrated threshold. "
        "Bottom: AUROC per KB.",
        fontsize=9.5, x=0.01, ha="left",
    )  # fmt: skip
    fig.tight_layout()
    return fig


UNSEEN_BENCHMARKS = ("covid", "clinc150", "stackexchange")
UNSEEN_BARS = (
    ("combined", "unseen", "default (combined, floored)", DEFAULT_COLOR),
    ("combined", "no_floor", "combined --no-floor", ACCENT),
    ("max_cosine", "unseen", "max-cosine", BASELINE_COLOR),
    ("knn", "unseen", "kNN", "#b0b0b0"),
    ("residual", "unseen", "residual", "#d0d0d0"),
)


def unseen_ood(results: Path) -> Figure:
    """Mean AUROC per benchmark under the unseen-OOD protocol (each OOD family held out of
    training in turn): the default against the detector without its floor and the
    training-free baselines."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.16
    low = 1.0
    for i, bench in enumerate(UNSEEN_BENCHMARKS):
        runs = {
            "unseen": _load(results, f"eval_{bench}_dev_unseen_ood.json"),
            "no_floor": _load(results, f"eval_{bench}_dev_unseen_ood_no_floor.json"),
        }
        for j, (det, run, label, color) in enumerate(UNSEEN_BARS):
            v = runs[run]["mean"][det]["auroc"]
            low = min(low, v)
            x = i + (j - 2) * width
            ax.bar(x, v, width, color=color, label=label if i == 0 else None)
            ax.text(x, v + 0.0007, f"{v:.3f}", ha="center", fontsize=6.5, rotation=90)
    ax.set_xticks(range(len(UNSEEN_BENCHMARKS)), UNSEEN_BENCHMARKS)
    ax.set_ylim(low - 0.01, 1.004)
    ax.set_ylabel("mean AUROC, held-out OOD families")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7.5, ncol=5, loc="lower center", bbox_to_anchor=(0.5, -0.32))
    ax.set_title(
        "OOD of a kind training never saw (eval_*_dev_unseen_ood[_no_floor].json)",
        fontsize=9.5, loc="left",
    )  # fmt: skip
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[Path], Figure]] = {
    "data-flow.png": data_flow,
    "hot-swap-timeline.png": hot_swap_timeline,
    "batch-size.png": batch_size,
    "roc-default-vs-max-cosine.png": roc,
    "unseen-ood.png": unseen_ood,
}


def render(results: Path | None = None) -> dict[str, bytes]:
    """Each figure's PNG bytes, drawn from ``results`` (the recorded JSON)."""
    import io

    results = results or results_dir()
    out: dict[str, bytes] = {}
    for name, draw in FIGURES.items():
        fig = draw(results)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", **SAVE_KW)
        plt.close(fig)
        out[name] = buf.getvalue()
    return out


def draw_all(results: Path | None = None, out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in render(results).items():
        path = out_dir / name
        path.write_bytes(png)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="folder of the JSON files")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the PNGs go")
    args = parser.parse_args()
    for path in draw_all(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
