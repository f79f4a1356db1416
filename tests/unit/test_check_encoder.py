"""``sidecar check-encoder``: a client proves its encoder against a model's probe embeddings
(a real model in a real artifact directory; probe vectors made up, no encoder load)."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from support.streams import DIM, tiny_model

from model_store import save_dir
from sidecar.cli import main
from sidecar.errors import DataError
from sidecar.persistence import model_from_artifact, model_to_artifact
from sidecar.scoring import MIN_PROBE_COSINE, PROBE_TEXTS
from sidecar.stream import check_probe_embeddings, probe_sheet


def unit_rows(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


RECORDED = unit_rows(len(PROBE_TEXTS), 1)


@pytest.fixture(scope="module")
def model() -> Any:
    base = model_from_artifact(tiny_model())
    return dataclasses.replace(base, encoder_probes=RECORDED, encoder_probe_texts=PROBE_TEXTS)


@pytest.fixture
def artifact(model: Any, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    save_dir(model_to_artifact(model), out)
    return out


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def write(tmp_path: Path, doc: Any, name: str = "vectors.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def b64(row: np.ndarray) -> str:
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()


# -- the checks themselves -----------------------------------------------------------------


def test_the_sheet_names_the_encoder_its_width_the_tolerance_and_the_sentences(
    model: Any,
) -> None:
    sheet = probe_sheet(model, "v1")
    assert (sheet["kb"], sheet["version"], sheet["encoder"], sheet["dim"]) == (
        "default",
        "v1",
        "all-MiniLM-L6-v2",
        DIM,
    )
    assert sheet["texts"] == list(PROBE_TEXTS) and sheet["min_cosine"] == MIN_PROBE_COSINE


def test_the_recorded_vectors_scaled_or_in_any_accepted_shape_pass(model: Any) -> None:
    scaled = (RECORDED * 3.0).tolist()  # client vectors are scaled to unit length
    openai = {
        "object": "list",
        "model": "whatever the server calls it",
        "data": [
            {"object": "embedding", "index": i, "embedding": b64(RECORDED[i])}
            for i in reversed(range(len(PROBE_TEXTS)))  # any order: the index says which
        ],
    }
    named = {"encoder": "sentence-transformers/all-MiniLM-L6-v2", "embeddings": scaled}
    for doc in (scaled, [b64(r) for r in RECORDED], openai, named):
        check = check_probe_embeddings(model, doc)
        assert check.ok, check.detail
        assert check.worst_cosine == pytest.approx(1.0, abs=1e-6)
        assert len(check.cosines) == len(PROBE_TEXTS)


def test_noise_within_the_tolerance_passes_and_beyond_it_fails(model: Any) -> None:
    rng = np.random.default_rng(5)

    def noisy(scale: float) -> list[list[float]]:
        return (RECORDED + scale * rng.standard_normal(RECORDED.shape) / np.sqrt(DIM)).tolist()

    near = check_probe_embeddings(model, noisy(0.01))  # cosine about 0.99995
    assert near.ok and near.worst_cosine is not None and near.worst_cosine < 1.0
    far = check_probe_embeddings(model, noisy(0.5))  # cosine about 0.89
    assert not far.ok and far.worst_cosine is not None and far.worst_cosine < MIN_PROBE_COSINE
    assert "not the model's encoder" in far.detail


def test_one_sentence_off_fails_and_is_named(model: Any) -> None:
    rows = RECORDED.copy()
    rows[3] = unit_rows(1, 9)[0]
    check = check_probe_embeddings(model, rows.tolist())
    assert not check.ok and check.worst_sentence == 3
    assert "probe sentence 4 of 6" in check.detail
    assert check.cosines[0] == pytest.approx(1.0, abs=1e-6)


def test_another_width_or_another_named_encoder_fails(model: Any) -> None:
    wide = check_probe_embeddings(model, unit_rows(len(PROBE_TEXTS), 2)[:, :100].tolist())
    assert not wide.ok and wide.worst_cosine is None and "100 dimensions" in wide.detail
    named = {"encoder": "text-embedding-3-small", "embeddings": RECORDED.tolist()}
    check = check_probe_embeddings(model, named)
    assert not check.ok and "encoder_mismatch" in check.detail


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (RECORDED[:5].tolist(), "5 embeddings for the model's 6 probe sentences"),
        ("just a string", "expected a JSON list"),
        ({"vectors": []}, 'without "embeddings" or "data"'),
        ({"embeddings": "x"}, "must be a list"),
        ({"embeddings": [], "encoder": 3}, '"encoder" must be a string'),
        ([*RECORDED[:5].tolist(), "%%%"], "embedding 5: 'embedding' is not base64"),
        ([*RECORDED[:5].tolist(), [1.0, float("nan")]], "embedding_not_finite"),
        ({"data": [{"index": 0}]}, 'data[0] of the response holds no "embedding"'),
        ({"data": [{"index": 1, "embedding": [1.0]}]}, "indices are not 0..n-1"),
    ],
)
def test_what_is_not_embeddings_of_the_sentences_is_a_data_error(
    model: Any, doc: Any, said: str
) -> None:
    with pytest.raises(DataError) as info:
        check_probe_embeddings(model, doc)
    assert said in str(info.value)


def test_a_model_without_probes_says_it_cannot_prove_anything() -> None:
    bare = model_from_artifact(tiny_model())
    with pytest.raises(DataError, match="recorded no probe embeddings"):
        probe_sheet(bare)
    with pytest.raises(DataError, match="recorded no probe embeddings"):
        check_probe_embeddings(bare, RECORDED.tolist())


# -- the command ---------------------------------------------------------------------------


def test_probes_prints_the_sheet_as_text_or_json(artifact: Path) -> None:
    text = invoke("check-encoder", "probes", "--artifact", str(artifact))
    assert text.exit_code == 0, text.output
    assert "encoder:    all-MiniLM-L6-v2 (384 dims)" in text.output
    assert f"  1. {PROBE_TEXTS[0]}" in text.output
    as_json = invoke("check-encoder", "probes", "--artifact", str(artifact), "--json")
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["texts"] == list(PROBE_TEXTS)


def test_verify_exits_0_on_a_pass_and_1_on_a_fail(artifact: Path, tmp_path: Path) -> None:
    good = write(tmp_path, [b64(r) for r in RECORDED], "good.json")
    ok = invoke("check-encoder", "verify", good, "--artifact", str(artifact))
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("PASS: encoder all-MiniLM-L6-v2 (384 dims) of KB default")
    bad = write(tmp_path, unit_rows(len(PROBE_TEXTS), 3).tolist(), "bad.json")
    fail = invoke("check-encoder", "verify", bad, "--artifact", str(artifact), "--json")
    assert fail.exit_code == 1, fail.output
    doc = json.loads(fail.output)
    assert doc["ok"] is False and doc["worst_cosine"] < MIN_PROBE_COSINE
    piped = invoke(
        "check-encoder", "verify", "-", "--artifact", str(artifact), stdin=json.dumps(
            RECORDED.tolist()
        )
    )  # fmt: skip
    assert piped.exit_code == 0, piped.output


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "is not JSON"),
        (json.dumps([[1.0, 2.0]]), "1 embeddings for the model's 6 probe sentences"),
        (json.dumps({"x": 1}), 'without "embeddings" or "data"'),
    ],
)
def test_verify_says_what_is_wrong_with_a_bad_file_in_one_line(
    artifact: Path, tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "v.json"
    path.write_text(content)
    out = invoke("check-encoder", "verify", str(path), "--artifact", str(artifact))
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], out.output
    assert "Traceback" not in out.output


def test_verify_of_a_missing_file_is_one_line(artifact: Path, tmp_path: Path) -> None:
    out = invoke(
        "check-encoder", "verify", str(tmp_path / "nope.json"), "--artifact", str(artifact)
    )
    assert out.exit_code == 2 and out.output.startswith("error: ") and "not found" in out.output
