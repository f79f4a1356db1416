"""``sidecar calibrate``: a new version whose threshold is the conformal quantile of the
given ID queries' scores, written to a directory or published to the store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import DirectoryStore, load_dir
from sidecar.cli import main
from sidecar.persistence import model_from_artifact
from sidecar.scoring import OODModel, conformal_threshold
from sidecar.training._jsonl import DEMO_ID_QUERIES, demo_path

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibrate") / "model"
    res = CliRunner().invoke(main, ["train", "--out", str(out), "--no-report", "--no-progress"])
    assert res.exit_code == 0, res.output
    return out


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, ["calibrate", "--no-progress", *args])


def _live(model: OODModel, n: int) -> np.ndarray:
    """Embeddings that score like drifted ID traffic: near the KB's own documents."""
    rng = np.random.default_rng(0)
    kb = np.asarray(model.kb_embeddings)
    E = kb[rng.integers(0, len(kb), n)] + 0.05 * rng.normal(size=(n, kb.shape[1]))
    return (E / np.linalg.norm(E, axis=1, keepdims=True)).astype(np.float32)


def test_the_new_artifact_carries_the_conformal_threshold_of_the_given_queries(
    trained: Path, tmp_path: Path
) -> None:
    model = model_from_artifact(load_dir(trained))
    E = _live(model, 150)
    np.save(tmp_path / "live.npy", E)
    out = tmp_path / "recal"
    res = _run("--artifact", str(trained), "--id-embeddings", str(tmp_path / "live.npy"),
               "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    new = model_from_artifact(load_dir(out))
    target = model.params["target_frr"]  # the model's own target by default
    assert new.threshold == conformal_threshold(model.score(E), target)
    assert new.threshold != model.threshold
    np.testing.assert_array_equal(new.score(E), model.score(E))  # nothing refitted
    old = new.metrics["recalibrated_from"]
    assert old["version"] == model.version and old["threshold"] == model.threshold
    assert new.metrics["n_calibration"] == 150 and new.version != model.version
    assert f"{new.version[:12]}" in res.output and "150 ID queries" in res.output


def test_a_live_traffic_sample_records_the_share_the_new_threshold_refuses(
    trained: Path, tmp_path: Path
) -> None:
    model = model_from_artifact(load_dir(trained))
    np.save(tmp_path / "id.npy", _live(model, 150))
    rng = np.random.default_rng(5)
    far = rng.normal(size=(40, model.encoder["dim"])).astype(np.float32)
    live = np.vstack([_live(model, 60), far / np.linalg.norm(far, axis=1, keepdims=True)])
    np.save(tmp_path / "traffic.npy", live)
    out = tmp_path / "recal"
    res = _run("--artifact", str(trained), "--id-embeddings", str(tmp_path / "id.npy"),
               "--live-embeddings", str(tmp_path / "traffic.npy"), "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    new = model_from_artifact(load_dir(out))
    share = new.metrics["calibration_ood_share"]
    assert share == float(np.mean(new.predict(live))) and new.metrics["n_live_sample"] == 100
    assert 0.3 <= share <= 0.5  # the 40 random queries, and few of the 60 near the KB
    assert f"refuses {share:.2%} of 100 live queries" in res.output
    both = _run("--artifact", str(trained), "--id-embeddings", str(tmp_path / "id.npy"),
                "--live-embeddings", str(tmp_path / "traffic.npy"), "--live-queries",
                str(tmp_path / "q.jsonl"), "--out", str(tmp_path / "o2"))  # fmt: skip
    assert both.exit_code == 2 and "--live-queries or --live-embeddings, not both" in both.output


def test_a_store_version_is_recalibrated_into_the_same_store(trained: Path, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = DirectoryStore(store_dir)
    source = store.put(load_dir(trained))
    kb = load_dir(trained).kb
    store.promote(kb, source)
    where = ["--store-dir", str(store_dir), "--kb", kb]
    queries = str(demo_path(DEMO_ID_QUERIES))  # 102 texts: enough for a 5% target
    res = _run(*where, "--id-queries", queries, "--target-frr", "0.05", "--publish",
               "--no-promote")  # fmt: skip
    assert res.exit_code == 0, res.output
    versions = store.versions(kb)
    assert len(versions) == 2 and store.active(kb) == source  # stored, not activated
    (new_version,) = set(versions) - {source}
    new = model_from_artifact(store.get(kb, new_version))
    assert new.metrics["recalibrated_from"]["version"] == source
    assert new.params["target_frr"] == 0.05 and new.metrics["n_calibration"] == 102
    res = _run(*where, "--version", new_version[:10], "--id-queries", queries, "--target-frr",
               "0.05", "--publish")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert store.active(kb) != source  # promoted this time


def test_promoting_a_recalibrated_model_of_another_encoder_is_refused(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers of another encoder would refuse the new version, as `models promote` says.
    monkeypatch.setenv("SIDECAR_SCORING__ENCODER", "another-encoder")
    store_dir = tmp_path / "store"
    np.save(tmp_path / "live.npy", _live(model_from_artifact(load_dir(trained)), 60))
    args = ["--artifact", str(trained), "--id-embeddings", str(tmp_path / "live.npy"),
            "--target-frr", "0.05", "--publish", "--store-dir", str(store_dir)]  # fmt: skip
    res = _run(*args)
    assert res.exit_code == 2 and "nothing was recalibrated" in res.output, res.output
    assert "'another-encoder'" in res.output and not store_dir.exists()
    res = _run(*args, "--no-promote")  # storing it without activating is fine
    assert res.exit_code == 0, res.output
    res = _run(*args, "--any-encoder")
    assert res.exit_code == 0, res.output
    kb = load_dir(trained).kb
    assert DirectoryStore(store_dir).active(kb) is not None
    res = _run(*args, "--no-promote", "--any-encoder")
    assert res.exit_code == 2 and "--any-encoder applies to --publish" in res.output


def test_bad_requests_get_one_error_line(
    trained: Path, tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    model = model_from_artifact(load_dir(trained))
    np.save(tmp_path / "few.npy", _live(model, 98))
    np.save(tmp_path / "wrong_dim.npy", np.ones((200, 7), np.float32))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    art = ["--artifact", str(trained)]
    few = ["--id-embeddings", str(tmp_path / "few.npy")]
    cases = {
        "cannot calibrate a false-reject rate of 0.01": [*art, *few, "--out", str(tmp_path / "a")],
        "have 7 dims, the model's encoder 384": [
            *art, "--id-embeddings", str(tmp_path / "wrong_dim.npy"), "--out", str(tmp_path / "b"),
        ],
        "is not empty": [*art, *few, "--out", str(tmp_path / "full")],
        "leave out --version": [*art, *few, "--version", "previous", "--out", str(tmp_path / "c")],
        "ID embeddings file not found": [
            *art, "--id-embeddings", str(tmp_path / "missing.npy"), "--out", str(tmp_path / "d"),
        ],
        "has no active version": [
            "--store-dir", str(tmp_path / "empty_store"), "--kb", "nope", *few, "--publish",
        ],
        # the store is checked before the queries are scored (98 of them would be refused)
        "store directory": [
            *art, *few, "--publish", "--store-dir", str(tmp_path / "few.npy" / "store"),
        ],
        "--cache-dir": [*art, *few, "--cache-dir", str(tmp_path / "few.npy"), "--out", "g"],
    }  # fmt: skip
    (tmp_path / "empty_store").mkdir()
    for want, args in cases.items():
        assert want in one_error_line(_run(*args)), args
    # usage mistakes: click's own message, exit status 2
    for args in (
        [*art, *few],
        [*art, "--out", str(tmp_path / "e")],
        [*art, *few, "--no-promote"],
        [*art, *few, "--out", str(tmp_path / "f"), "--allow-unsigned"],
    ):
        res = _run(*args)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert not (tmp_path / "a").exists()  # nothing written by a refused run


def test_publishing_an_artifact_directory_checks_its_signature_like_import(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:  # fmt: skip
    model = model_from_artifact(load_dir(trained))
    np.save(tmp_path / "live.npy", _live(model, 120))
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", "the-store-key")
    store_dir = tmp_path / "store"
    args = ["--artifact", str(trained), "--id-embeddings", str(tmp_path / "live.npy"),
            "--publish", "--store-dir", str(store_dir)]  # fmt: skip
    # put() signs with the store's key: an unsigned directory must not come out signed
    assert "unsigned" in one_error_line(_run(*args))
    assert not store_dir.exists()
    res = _run(*args, "--allow-unsigned")
    assert res.exit_code == 0, res.output
    store = DirectoryStore(store_dir, hmac_key=b"the-store-key")
    (version,) = store.versions(model.kb)
    assert store.get(model.kb, version).manifest["signature"]


def test_queries_the_model_was_trained_on_are_named(trained: Path, tmp_path: Path) -> None:
    # The demo model is trained on the demo ID queries and keeps them (its neighbour
    # banks): recalibrating on them would set a threshold too strict for new traffic.
    res = _run("--artifact", str(trained), "--id-queries", str(demo_path(DEMO_ID_QUERIES)),
               "--target-frr", "0.05", "--out", str(tmp_path / "recal"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "repeat the model's training queries" in res.output
    model = model_from_artifact(load_dir(trained))
    np.save(tmp_path / "live.npy", _live(model, 150))
    res = _run("--artifact", str(trained), "--id-embeddings", str(tmp_path / "live.npy"),
               "--out", str(tmp_path / "recal2"))  # fmt: skip
    assert res.exit_code == 0 and "repeat the model" not in res.output


def test_a_signed_directory_changed_after_signing_is_refused_by_every_reader(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:  # fmt: skip
    import json

    from model_store import save_dir

    key = b"the-store-key"
    signed = save_dir(load_dir(trained).signed(key), tmp_path / "signed")
    manifest = json.loads((signed / "manifest.json").read_text())
    manifest["model"]["threshold"] = 50.0  # every query in-domain; checksums still hold
    tampered = tmp_path / "tampered"
    save_dir(load_dir(signed), tampered)
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    model = model_from_artifact(load_dir(trained))
    np.save(tmp_path / "live.npy", _live(model, 120))
    monkeypatch.setenv("SIDECAR_STORE__HMAC_KEY", key.decode())
    live = ["--id-embeddings", str(tmp_path / "live.npy")]
    for command in (
        ["calibrate", "--no-progress", *live, "--out", str(tmp_path / "recal")],
        ["check", "--no-progress", *live],
        ["score", "hello"],
    ):
        line = one_error_line(CliRunner().invoke(main, [*command, "--artifact", str(tampered)]))
        assert "signature" in line, command
    assert not (tmp_path / "recal").exists()  # nothing made from it to re-sign later
    # the intact signed copy and the unsigned directory the job wrote both read as before
    for good in (signed, trained):
        res = _run("--artifact", str(good), *live, "--out", str(tmp_path / f"ok-{good.name}"))
        assert res.exit_code == 0, res.output


def test_per_language_takes_the_language_each_line_gives(
    trained: Path, tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    texts = [json.loads(x)["text"] for x in demo_path(DEMO_ID_QUERIES).read_text().splitlines()]
    rows = [{"text": t, "language": "nl-NL"} for t in texts[:20]]
    rows += [{"text": t, "language": "pt_BR"} for t in texts[20:30]]
    rows += [{"text": t} for t in texts[30:40]]
    queries = tmp_path / "live.jsonl"
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "recal"
    res = _run("--artifact", str(trained), "--id-queries", str(queries), "--per-language",
               "--target-frr", "0.2", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "languages: 30 given in the queries' lines, 10 detected" in res.output
    new = model_from_artifact(load_dir(out))
    table = new.metrics["language_calibration"]
    # English texts that their lines call Dutch and Portuguese calibrate those languages
    assert (table["nl"]["n"], table["pt"]["n"]) == (20, 10)
    assert sum(row["n"] for row in table.values()) <= 40 and set(new.language_thresholds) >= {
        "nl",
        "pt",
    }
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:2], {"text": "x", "language": 7}]))
    line = one_error_line(_run("--artifact", str(trained), "--id-queries", str(bad),
                               "--per-language", "--out", str(tmp_path / "no")))  # fmt: skip
    assert f"{bad}:3: 'language' is a number" in line
    assert not (tmp_path / "no").exists()
