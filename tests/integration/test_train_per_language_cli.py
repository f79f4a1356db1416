"""``sidecar train --per-language``: the demo clinic's English KB, trained on clinic
questions in six languages with use-multilingual-v3; each language of the ID training
queries gets the conformal threshold of its own out-of-fold scores, printed in the
summary, listed in the report and stored in the artifact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import load_dir
from sidecar.cli import main
from sidecar.local import demo_multilingual_queries
from sidecar.persistence import model_from_artifact

pytestmark = pytest.mark.integration
USE = "use-multilingual-v3"
DATA = Path(__file__).resolve().parents[2] / "sidecar" / "data"
LANGS = {"en", "de", "es", "fr", "it", "nl"}


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _inputs(tmp: Path) -> tuple[Path, Path]:
    """The demo's ID and OOD queries plus the multilingual turn's (five clinic questions
    and two off-topic ones in each language), as JSONL."""
    rows = demo_multilingual_queries()
    paths = []
    for kind in ("ID", "OOD"):
        own = (DATA / f"demo_{kind.lower()}_queries.jsonl").read_text().splitlines()
        extra = [json.dumps({"text": r["text"]}) for r in rows if r["expected"] == kind]
        path = tmp / f"{kind}.jsonl"
        path.write_text("\n".join([*own, *extra]) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def test_train_per_language(tmp_path: Path) -> None:
    id_q, ood_q = _inputs(tmp_path)
    out = tmp_path / "model"
    res = _run(
        "train",
        "--kb",
        str(DATA / "demo_kb.jsonl"),
        "--id-queries",
        str(id_q),
        "--ood-queries",
        str(ood_q),
        "--encoder",
        USE,
        "--per-language",
        "--target-frr",
        "0.2",  # 4 queries calibrate a language; each but English has 5
        "--m",
        "8",
        "--out",
        str(out),
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    model = model_from_artifact(load_dir(out))
    table = model.metrics["language_calibration"]
    assert set(model.language_thresholds) == LANGS == set(table)
    assert all(table[lang]["n"] == 5 for lang in LANGS - {"en"})
    assert "per-language thresholds, 6 languages among the calibration queries:" in res.output
    n_id = len(id_q.read_text().splitlines())
    assert f"ID query languages: 0 given in their rows, {n_id} detected" in res.output
    for lang in LANGS:
        assert f"  {lang}: {table[lang]['n']} queries, threshold" in res.output
        assert model.threshold_for(lang) == model.language_thresholds[lang]
    # the global threshold is still the quantile of every calibration score
    assert model.threshold_for("und") == model.threshold
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["language_thresholds"] == pytest.approx(model.language_thresholds)
    assert (summary["id_languages_given"], summary["id_languages_detected"]) == (0, n_id)
    page = (out / "report" / "report.md").read_text()
    assert "## Per-language thresholds" in page and "| nl | 5 |" in page


def test_per_language_needs_the_queries_as_texts(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.ones((8, 512), np.float32))
    res = _run(
        "train",
        "--kb-embeddings",
        str(tmp_path / "e.npy"),
        "--id-embeddings",
        str(tmp_path / "e.npy"),
        "--per-language",
        "--out",
        str(tmp_path / "o"),
    )
    assert res.exit_code != 0
    assert "--per-language tells each ID query's language from its text" in res.output
