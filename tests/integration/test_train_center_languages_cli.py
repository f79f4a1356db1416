"""``sidecar train --center-languages``: the demo clinic's English KB and its queries plus
the multilingual turn's, with use-multilingual-v3. English has enough training texts for
a mean of its own, the other languages (seven texts each) meet the global mean; the means
ship in the artifact (format 3), and ``sidecar score`` centres each query by its detected
language exactly as the model does in Python."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import load_dir
from sidecar.cli import main
from sidecar.encoders import LanguageDetector, detector_languages, load_encoder
from sidecar.local import demo_multilingual_queries
from sidecar.persistence import model_from_artifact
from sidecar.settings import ScoringSettings

pytestmark = pytest.mark.integration
USE = "use-multilingual-v3"
DATA = Path(__file__).resolve().parents[2] / "sidecar" / "data"


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def _inputs(tmp: Path) -> tuple[Path, Path]:
    rows = demo_multilingual_queries()
    paths = []
    for kind in ("ID", "OOD"):
        own = (DATA / f"demo_{kind.lower()}_queries.jsonl").read_text().splitlines()
        extra = [json.dumps({"text": r["text"]}) for r in rows if r["expected"] == kind]
        path = tmp / f"{kind}.jsonl"
        path.write_text("\n".join([*own, *extra]) + "\n")
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    tmp = tmp_path_factory.mktemp("centred")
    id_q, ood_q = _inputs(tmp)
    out = tmp / "model"
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
        "--center-languages",
        "--m",
        "8",
        "--out",
        str(out),
        "--no-progress",
    )
    assert res.exit_code == 0, res.output
    return out, res


def test_the_artifact_carries_the_means_and_the_summary_names_them(
    trained: tuple[Path, Result],
) -> None:
    out, res = trained
    artifact = load_dir(out)
    section = artifact.manifest["model"]
    assert section["format"] == "kb-subspace-ood/3"
    assert section["centering"]["languages"] == ["en"]
    counts = section["centering"]["counts"]
    assert counts["en"] >= 50 and all(0 < counts[x] < 50 for x in ("de", "fr", "it", "nl"))
    assert artifact.arrays["centering.means"].shape == (1, 512)
    model = model_from_artifact(artifact)
    assert model.centering is not None
    # the global mean is over every training text, English and the rest
    assert not np.allclose(model.centering.mean_for("en"), model.centering.global_mean)
    assert "centred by language:" in res.output and "own means for en (>= 50 texts)" in res.output
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["centering"]["languages_with_mean"] == ["en"]


def test_score_centres_each_query_as_the_model_does(trained: tuple[Path, Result]) -> None:
    out, _ = trained
    model = model_from_artifact(load_dir(out))
    texts = [
        "What are the opening hours on Sunday?",
        "Write me a poem about the sea and the moon",
        "Sind Sie am Sonntag geöffnet?",
        "Quels sont vos horaires le samedi ?",
    ]
    res = _run(
        "score", "--artifact", str(out), "--json", *texts, env={"SIDECAR_SCORING__ENCODER": USE}
    )
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    enc = load_encoder(ScoringSettings(), name=USE, threads=1)
    E = enc.encode(texts)
    langs = LanguageDetector(detector_languages(USE)).detect(texts)
    assert [r["language"] for r in recs] == langs and langs[0] == "en"
    want = model.score(E, langs)
    for rec, s in zip(recs, want, strict=True):
        assert rec["score"] == pytest.approx(float(s), abs=1e-4)
        assert rec["verdict"] == ("OOD" if s > model.threshold else "ID")
    # the English queries meet the English mean: another score than the global mean's
    assert abs(want[0] - model.score(E[:1])[0]) > 1e-3


def _held_out(tmp: Path) -> tuple[Path, Path, list[str], list[str]]:
    """Clinic questions (ID) and off-topic ones (OOD) the model was not trained on, in
    English and German."""
    ids = [
        "Can I bring my dog to the appointment?",
        "How long does a blood test take?",
        "Kann ich meinen Termin online verschieben?",
        "Wie lange dauert eine Blutuntersuchung?",
    ]
    oods = [
        "Who won the football match last night?",
        "Give me a recipe for apple pie",
        "Wer hat das Fußballspiel gestern gewonnen?",
        "Gib mir ein Rezept für Apfelkuchen",
    ]
    paths = []
    for name, texts in (("id_held", ids), ("ood_held", oods)):
        path = tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        paths.append(path)
    return paths[0], paths[1], ids, oods


def test_check_and_calibrate_score_each_query_by_its_language(
    trained: tuple[Path, Result], tmp_path: Path
) -> None:
    out, _ = trained
    model = model_from_artifact(load_dir(out))
    id_path, ood_path, ids, oods = _held_out(tmp_path)
    enc = load_encoder(ScoringSettings(), name=USE, threads=1)
    detect = LanguageDetector(detector_languages(USE)).detect
    E_id, E_ood = enc.encode(ids), enc.encode(oods)
    s_id, s_ood = model.score(E_id, detect(ids)), model.score(E_ood, detect(oods))
    assert "de" in detect(ids) and not np.allclose(s_id, model.score(E_id))
    env = {"SIDECAR_SCORING__ENCODER": USE}
    report = tmp_path / "check.json"
    args = ["--artifact", str(out), "--id-queries", str(id_path), "--ood-queries"]
    res = _run("check", *args, str(ood_path), "--json", str(report), "--no-progress", env=env)
    assert res.exit_code == 0, res.output
    figures = json.loads(report.read_text())["checked"]
    assert figures["false_reject"]["count"] == int((s_id > model.threshold).sum())
    assert figures["ood_accept"]["count"] == int((s_ood <= model.threshold).sum())
    from sidecar.training import auroc

    assert figures["auroc"]["value"] == pytest.approx(auroc(s_id, s_ood), abs=1e-9)
    # calibrate, on English queries (the language with a mean of its own): the new
    # threshold is the quantile of their centred scores (the highest of 4 at 0.2)
    en = [
        "Can I bring my dog to the appointment?",
        "How long does a blood test take?",
        "Do I need to fast before my cholesterol test?",
        "Can my partner come with me into the consulting room?",
    ]
    en_path = tmp_path / "en.jsonl"
    en_path.write_text("".join(json.dumps({"text": t}) + "\n" for t in en))
    assert detect(en) == ["en"] * 4
    new_dir = tmp_path / "recal"
    res = _run(
        "calibrate",
        "--artifact",
        str(out),
        "--id-queries",
        str(en_path),
        "--target-frr",
        "0.2",
        "--out",
        str(new_dir),
        "--no-progress",
        env=env,
    )
    assert res.exit_code == 0, res.output
    new = model_from_artifact(load_dir(new_dir))
    from sidecar.scoring import conformal_threshold

    E_en = enc.encode(en)
    want = conformal_threshold(model.score(E_en, ["en"] * 4), 0.2)
    assert new.threshold == pytest.approx(want, abs=1e-5)
    # ... which scoring with the global mean alone would not have given
    assert abs(conformal_threshold(model.score(E_en), 0.2) - new.threshold) > 1e-3
    assert new.centering is not None and new.centering.languages == ("en",)
