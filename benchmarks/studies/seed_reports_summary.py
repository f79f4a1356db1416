"""Merge per-seed ``sidecar eval`` reports of a multilingual benchmark into one JSON (not a test).

``sidecar eval --benchmark xsid`` takes one ``--seed`` per run (``--seeds`` is for the
monolingual benchmarks); this keeps each seed's report whole under ``runs`` and adds, per
language and detector, the mean over the seeds of AUROC, FRR and OOD-accept at the
calibrated threshold, the cross-lingual figures and gaps, and the targets judged on
those means::

    PYTHONPATH=. python benchmarks/studies/seed_reports_summary.py \\
        --out benchmarks/results/eval_xsid_dev_centered_use-multilingual-v3.json \\
        /tmp/centred_seed0.json /tmp/centred_seed1.json /tmp/centred_seed2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

FIGURES = ("auroc", "false_reject_rate", "ood_accept_rate")


def _mean_rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {k: round(float(np.mean([r[k] for r in rows])), 4) for k in FIGURES}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per language and detector, the mean over ``runs`` of the same-language and
    cross-lingual figures, and the cross-lingual gap of those means."""
    langs = list(runs[0]["languages"])
    dets = list(runs[0]["languages"][langs[0]]["summary"])
    same = {
        lang: {d: _mean_rows([r["languages"][lang]["summary"][d] for r in runs]) for d in dets}
        for lang in langs
    }
    cross: dict[str, Any] = {}
    for lang in langs:
        if all((r.get("crosslingual") or {}).get(lang) for r in runs):
            rows = {d: [r["crosslingual"][lang]["summary"][d] for r in runs] for d in dets}
            cross[lang] = {d: _mean_rows(rows[d]) for d in dets}
            for d in dets:
                cross[lang][d]["gap"] = round(same[lang][d]["auroc"] - cross[lang][d]["auroc"], 4)
    out: dict[str, Any] = {"languages": same, "crosslingual": cross or None}
    if "en" in same and "combined" in dets:
        en = same["en"]["combined"]["auroc"]
        out["targets"] = {
            "within_0.01_of_english": {
                x: round(en - same[x]["combined"]["auroc"], 4) for x in langs if x != "en"
            },
            "at_least_0.98": {x: same[x]["combined"]["auroc"] >= 0.98 for x in langs},
            "crosslingual_gap_at_most_0.02": {
                x: row["combined"]["gap"] <= 0.02 for x, row in cross.items()
            },
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = [json.loads(p.read_text()) for p in args.reports]
    first = runs[0]
    keys = ("benchmark", "split", "encoder", "kb_language", "target_frr", "detectors")
    for r in runs[1:]:
        for k in (*keys, "center_languages"):
            if r.get(k) != first.get(k):
                raise SystemExit(f"{k} differs between the reports: {r.get(k)} / {first.get(k)}")
    doc = {
        **{k: first.get(k) for k in keys},
        "center_languages": bool(first.get("center_languages")),
        "seeds": [r["seed"] for r in runs],
        "mean_over_seeds": summarise(runs),
        "runs": runs,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["mean_over_seeds"], indent=1))


if __name__ == "__main__":
    main()
