"""``sidecar score``: the worker's verdicts for ad hoc queries, from an artifact or the store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from model_store import load_dir
from sidecar.cli import main
from sidecar.encoders import load_encoder
from sidecar.persistence import model_from_artifact
from sidecar.settings import load_settings


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo KB's model, written to a directory and published to a directory store."""
    root = tmp_path_factory.mktemp("score")
    out, store = root / "model", root / "store"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--out",
            str(out),
            "--no-report",
            "--no-progress",
            "--publish",
            "--store-backend",
            "directory",
            "--store-dir",
            str(store),
        ],
    )
    assert res.exit_code == 0, res.output
    return out, store


def _records(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_verdicts_are_the_models_and_bad_lines_get_the_streams_reasons(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    out, _ = trained
    texts = ["Can I park at the clinic?", "Write me a sea shanty about pirates"]
    queries = tmp_path / "queries.txt"
    queries.write_text(
        "What are the opening hours on Sunday?\n"
        "\n"
        '{"id": "q-7", "text": "Do you treat children?"}\n'
        '{"text": "no id here, one is filled in"}\n'
        '{"id": "q-8", "text": "hello", "kb": "elsewhere"}\n'
        "{not json\n"
    )
    res = CliRunner().invoke(
        main, ["score", "--artifact", str(out), "--file", str(queries), "--json", *texts]
    )
    assert res.exit_code == 0, res.output
    docs = _records(res.output)
    # input order; dead letters carry the raw payload, not an id
    assert [d.get("id") for d in docs] == ["arg-0", "arg-1", "line-1", "q-7", "line-4", None, None]
    assert [d.get("reason") for d in docs[5:]] == ["unknown_kb", "invalid_json"]
    # the table names the line of each dead letter, JSON or not
    table = CliRunner().invoke(main, ["score", "--artifact", str(out), "--file", str(queries)])
    dead = [ln.split()[1:4] for ln in table.output.splitlines() if ln.strip().startswith("DLQ")]
    assert dead == [["line", "5", "unknown_kb:"], ["line", "6", "invalid_json:"]], table.output

    artifact = load_dir(out)
    model = model_from_artifact(artifact)
    settings = load_settings()
    enc = load_encoder(settings.scoring, name=str(model.encoder["name"]))
    scored = [
        *texts,
        "What are the opening hours on Sunday?",
        "Do you treat children?",
        "no id here, one is filled in",
    ]
    want = model.score(enc.encode(scored))
    verdicts = [d for d in docs if "verdict" in d]
    assert len(verdicts) == len(scored)
    for doc, s in zip(verdicts, want, strict=True):
        assert doc["model_version"] == artifact.version
        assert doc["threshold"] == pytest.approx(model.threshold)
        assert doc["score"] == pytest.approx(float(s), abs=1e-4)
        assert doc["verdict"] == ("OOD" if s > model.threshold else "ID")


def test_the_store_serves_the_same_model_by_version_prefix(trained: tuple[Path, Path]) -> None:
    out, store = trained
    version = load_dir(out).version
    args = ["--json", "Can I park at the clinic?"]
    from_dir = CliRunner().invoke(main, ["score", "--artifact", str(out), *args])
    from_store = CliRunner().invoke(
        main, ["score", "--store-dir", str(store), "--version", version[:6], *args]
    )
    assert from_store.exit_code == 0, from_store.output
    a, b = _records(from_dir.output)[0], _records(from_store.output)[0]
    assert a["model_version"] == b["model_version"] == version
    assert np.isclose(float(a["score"]), float(b["score"]), atol=1e-6)

    table = CliRunner().invoke(main, ["score", "--store-dir", str(store), "Can I park?"])
    assert table.exit_code == 0 and f"version {version[:12]}" in table.output


def test_errors_are_one_line(trained: tuple[Path, Path], tmp_path: Path) -> None:
    out, store = trained
    cases = [
        (["score", "--store-dir", str(store), "--version", "previous", "x"], "no previous"),
        (["score", "--artifact", str(tmp_path), "x"], "not an artifact directory"),
        (["score", "--artifact", str(out), "--kb", "billing", "x"], "not 'billing'"),
        (["score", "--artifact", str(out)], "give query TEXTS or --file"),
    ]
    for args, message in cases:
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output and "Traceback" not in res.output, res.output


def test_control_characters_in_a_query_are_escaped_in_the_table(trained: tuple[Path, Path]) -> None:
    out, _ = trained
    res = CliRunner().invoke(main, ["score", "--artifact", str(out), "red \x1b[31malert\x07"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x07" not in res.output
    assert "red \\x1b[31malert\\x07" in res.output


def test_a_trained_model_proves_the_real_encoder_and_scores_its_vectors(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """`sidecar train` records the probes; the real encoder's vectors of them pass
    `check-encoder verify`, another encoder's (the same texts, other pooling: one
    token's vector) fail, and a query bringing the real encoder's vector scores as its
    text does."""
    import base64

    out, _ = trained
    sheet = CliRunner().invoke(main, ["check-encoder", "probes", "--artifact", str(out), "--json"])
    assert sheet.exit_code == 0, sheet.output
    probes = json.loads(sheet.output)
    enc = load_encoder(load_settings().scoring, name=probes["encoder"])
    E = enc.encode(probes["texts"])
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"encoder": probes["encoder"], "embeddings": E.tolist()}))
    # a vector of each sentence's first word: the same model, not the same sentence encoder
    firsts = enc.encode([t.split()[0] for t in probes["texts"]])
    bad.write_text(json.dumps(firsts.tolist()))
    passed = CliRunner().invoke(
        main, ["check-encoder", "verify", str(good), "--artifact", str(out)]
    )
    assert passed.exit_code == 0 and passed.output.startswith("PASS"), passed.output
    failed = CliRunner().invoke(main, ["check-encoder", "verify", str(bad), "--artifact", str(out)])
    assert failed.exit_code == 1 and failed.output.startswith("FAIL"), failed.output

    text = "Do you treat children?"
    vector = base64.b64encode(enc.encode([text])[0].astype("<f4").tobytes()).decode()
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"id": "own", "text": text, "embedding": vector, "encoder": probes["encoder"]})
        + "\n"
        + json.dumps({"id": "plain", "text": text})
        + "\n"
    )
    res = CliRunner().invoke(
        main, ["score", "--artifact", str(out), "--file", str(queries), "--json"]
    )
    assert res.exit_code == 0, res.output
    own, plain = _records(res.output)
    assert (own["embedding_source"], plain["embedding_source"]) == ("client", "sidecar")
    assert own["score"] == pytest.approx(plain["score"], abs=1e-4)
