"""A multilingual encoder through the CLI: the demo clinic trained in English with
use-multilingual-v3, recalibrated per language on clinic questions in five languages, and
scored: each verdict carries its language and that language's threshold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import load_dir
from sidecar.cli import main
from sidecar.encoders import load_encoder
from sidecar.local import demo_multilingual_queries
from sidecar.persistence import model_from_artifact
from sidecar.scoring import conformal_threshold
from sidecar.settings import ScoringSettings

pytestmark = pytest.mark.integration
USE = "use-multilingual-v3"


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("multilingual") / "model"
    res = _run("train", "--out", str(out), "--encoder", USE, "--no-report", "--no-progress")
    assert res.exit_code == 0, res.output
    return out


def test_per_language_calibration_and_the_verdicts_language(trained: Path, tmp_path: Path) -> None:
    model = model_from_artifact(load_dir(trained))
    assert model.encoder == {"name": USE, "dim": 512}
    rows = [r for r in demo_multilingual_queries() if r["expected"] == "ID"]
    queries = tmp_path / "live.jsonl"
    queries.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    out = tmp_path / "recal"
    res = _run(
        "calibrate",
        "--artifact",
        str(trained),
        "--id-queries",
        str(queries),
        "--per-language",
        "--target-frr",
        "0.2",  # 4 queries per language calibrate it; each language has 5
        "--encoder",
        USE,
        "--out",
        str(out),
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    new = model_from_artifact(load_dir(out))
    assert set(new.language_thresholds) == {"en", "de", "es", "fr", "it", "nl"}
    enc = load_encoder(ScoringSettings(), name=USE, threads=1)
    for lang in new.language_thresholds:
        E = enc.encode([r["text"] for r in rows if r["lang"] == lang])
        # embedded in another batch here: equal to float32 rounding
        want = conformal_threshold(new.score(E), 0.2)
        assert new.language_thresholds[lang] == pytest.approx(want, rel=1e-4)
        assert f"  {lang}: 5 queries, threshold" in res.output
    texts = [r["text"] for r in rows if r["lang"] in ("nl", "it")]
    env = {"SIDECAR_SCORING__ENCODER": USE}
    scored = _run("score", "--artifact", str(out), "--json", *texts, env=env)
    assert scored.exit_code == 0, scored.output
    recs = [json.loads(line) for line in scored.output.splitlines() if line.startswith("{")]
    assert [r["language"] for r in recs] == [r["lang"] for r in rows if r["lang"] in ("nl", "it")]
    for r in recs:
        assert r["threshold"] == pytest.approx(new.language_thresholds[r["language"]])
    # switched off: no language, the global threshold
    env["SIDECAR_SCORING__DETECT_LANGUAGE"] = "false"
    plain = _run("score", "--artifact", str(out), "--json", texts[0], env=env)
    rec = next(json.loads(x) for x in plain.output.splitlines() if x.startswith("{"))
    assert "language" not in rec and rec["threshold"] == pytest.approx(new.threshold)


def test_a_model_of_one_encoder_refuses_to_score_with_another(trained: Path) -> None:
    res = _run("score", "--artifact", str(trained), "Zijn jullie op zondag open?")
    assert res.exit_code != 0
    assert f"built with {USE} (512 dims)" in res.output and "all-MiniLM-L6-v2" in res.output


def test_per_language_needs_texts(trained: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.zeros((5, 512), np.float32))
    res = _run(
        "calibrate",
        "--artifact",
        str(trained),
        "--id-embeddings",
        str(tmp_path / "e.npy"),
        "--per-language",
        "--out",
        str(tmp_path / "o"),
    )
    assert res.exit_code != 0 and "--per-language tells languages from texts" in res.output
