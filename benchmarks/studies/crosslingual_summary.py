"""Build benchmarks/results/crosslingual_dev.json from the multilingual eval reports
(not a test; run by hand after the ``sidecar eval`` runs of docs/guides/multilingual.md).

For each encoder, benchmark and KB language: the product detector's (``combined``) and
max-cosine's AUROC per query language with the KB in that language and with the KB in
the run's KB language (English; Dutch for ``eval_xsid_dev_kbnl_*``), and the gap::

    python benchmarks/studies/crosslingual_summary.py --results benchmarks/results \\
        --json benchmarks/results/crosslingual_dev.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DETECTORS = ("combined", "max_cosine")


def _matrix(report: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    cross = report.get("crosslingual") or {}
    for lang, entry in report["languages"].items():
        row: dict[str, Any] = {}
        for d in DETECTORS:
            same = entry["summary"][d]["auroc"]
            other = cross.get(lang, {}).get("summary", {}).get(d, {}).get("auroc")
            row[d] = {
                "same_language_kb": same,
                f"kb_{report['kb_language']}": other if other is not None else same,
                "gap": round(same - other, 4) if other is not None else 0.0,
            }
        row["encoder_trained_on_it"] = report["encoder_languages"] is None or (
            lang in report["encoder_languages"]
        )
        rows[lang] = row
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    out: dict[str, Any] = {"detectors": list(DETECTORS), "encoders": {}}
    for path in sorted(args.results.glob("eval_*_dev_*.json")):
        report = json.loads(path.read_text())
        if "languages" not in report or not report.get("kb_language"):
            continue
        enc = out["encoders"].setdefault(report["encoder"], {})
        enc[f"{report['benchmark']}_kb_{report['kb_language']}"] = {
            "source": path.name,
            "kb_language": report["kb_language"],
            "languages": _matrix(report),
            "targets": [t for t in report["targets"] if t["target"].startswith("cross")],
        }
    args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
