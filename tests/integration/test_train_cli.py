"""``sidecar train`` end to end through click's CliRunner."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import DirectoryStore, load_dir, save_dir
from sidecar.cli import main
from sidecar.persistence import model_from_artifact, model_to_artifact

DIM = 384  # the default encoder's width: workers refuse a model of another


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def embeddings(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    basis = rng.normal(size=(6, DIM))

    def id_like(n: int) -> np.ndarray:
        return _unit(rng.normal(size=(n, 6)) @ basis + 0.5 * rng.normal(size=(n, DIM)))

    paths = {}
    for name, arr in (
        ("kb", id_like(120)),
        ("id", id_like(90)),
        ("ood", _unit(rng.normal(size=(90, DIM)))),
    ):
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], arr)
    return paths


def _train_on(embeddings: dict[str, Path], out: Path, *more: str) -> list[str]:
    """``sidecar train`` arguments: the fixture's embeddings, 4 PCs + residual, into ``out``."""
    return [
        "train",
        "--kb-embeddings",
        str(embeddings["kb"]),
        "--id-embeddings",
        str(embeddings["id"]),
        "--ood-embeddings",
        str(embeddings["ood"]),
        "--m",
        "4",
        "--features",
        "pcs,residual",
        "--out",
        str(out),
        "--no-progress",
        *more,
    ]


def test_train_on_embeddings_publishes_to_directory_store(
    tmp_path: Path, embeddings: dict[str, Path]
) -> None:
    out, store_dir = tmp_path / "model", tmp_path / "store"
    res = CliRunner().invoke(
        main,
        _train_on(
            embeddings,
            out,
            "--kb-name",
            "synthetic",
            "--publish",
            "--store-dir",  # a directory store, as --store-dir means for every command
            str(store_dir),
        ),
        env={"SIDECAR_STORE__BACKEND": "redis", "SIDECAR_REDIS__URL": "redis://127.0.0.1:1/0"},
    )
    assert res.exit_code == 0, res.output
    model = model_from_artifact(load_dir(out))
    assert model.kb == "synthetic" and model.m == 4 and model.dims <= 32
    assert model.encoder_probes is None  # no encoder ran: nothing to fingerprint
    assert (out / "report" / "report.md").is_file() and (out / "report" / "roc.png").is_file()
    store = DirectoryStore(store_dir)
    assert store.active("synthetic") == load_dir(out).version
    far = _unit(np.random.default_rng(5).normal(size=(20, DIM)))
    near = np.load(embeddings["kb"])[:20]
    assert np.median(model.score(far)) > np.median(model.score(near))


def test_embeddings_narrower_than_the_encoder_are_not_published(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    rng = np.random.default_rng(0)
    narrow = {}
    for name, n in (("kb", 60), ("id", 60), ("ood", 60)):
        narrow[name] = tmp_path / f"{name}32.npy"
        np.save(narrow[name], _unit(rng.normal(size=(n, 32))))
    store_dir = tmp_path / "store"
    # Workers embed with all-MiniLM-L6-v2 (384 dims) and would refuse a 32-dim model.
    args = _train_on(narrow, tmp_path / "m", "--publish", "--store-dir", str(store_dir))
    line = one_error_line(CliRunner().invoke(main, args))
    assert "the KB embeddings have 32 dims, but encoder all-MiniLM-L6-v2 gives 384" in line
    assert "nothing was trained or published" in line and "--encoder" in line
    assert not (tmp_path / "m").exists() and not store_dir.exists()
    # To a directory it trains, with a warning, and records the width it was given.
    res = CliRunner().invoke(main, _train_on(narrow, tmp_path / "m", "--no-report"))
    assert res.exit_code == 0, res.output
    assert "workers running it would refuse the model" in res.stderr
    assert load_dir(tmp_path / "m").manifest["encoder"] == {"name": "all-MiniLM-L6-v2", "dim": 32}
    # Promoting it later is refused the same way, unless asked for anyway.
    res = CliRunner().invoke(
        main, ["models", "import", str(tmp_path / "m"), "--promote", "--store-dir", str(store_dir)]
    )
    line = one_error_line(res)
    assert "has 32-dim embeddings, but the workers' encoder 'all-MiniLM-L6-v2' gives 384" in line
    args = ["models", "import", str(tmp_path / "m"), "--promote", "--any-encoder"]
    res = CliRunner().invoke(main, [*args, "--store-dir", str(store_dir)])
    assert res.exit_code == 0, res.output
    assert DirectoryStore(store_dir).active("default") == load_dir(tmp_path / "m").version


def test_near_duplicate_training_queries_are_grouped_unless_turned_off(
    tmp_path: Path, embeddings: dict[str, Path]
) -> None:
    rng = np.random.default_rng(3)
    heads = np.load(embeddings["id"])[:30]
    copies = _unit(np.repeat(heads, 3, axis=0) + 0.01 * rng.normal(size=(90, DIM)))
    np.save(embeddings["id"], copies)  # 30 queries, each written three ways
    groups = {}
    for flag in ("--group-near-duplicates", "--no-group-near-duplicates"):
        stats = tmp_path / f"{flag}.json"
        res = CliRunner().invoke(
            main,
            _train_on(embeddings, tmp_path / flag, flag, "--no-report", "--stats-json", str(stats)),
        )
        assert res.exit_code == 0, res.output
        groups[flag] = json.loads(stats.read_text())["n_id_groups"]
        assert f"90 ID in {groups[flag]} groups" in res.output
    # every triple in one group (two heads that are near copies themselves may share one)
    from sidecar.training._splits import near_duplicate_groups

    g = near_duplicate_groups(copies)
    assert all(len(np.unique(g[i : i + 3])) == 1 for i in range(0, 90, 3))
    assert groups["--group-near-duplicates"] == len(np.unique(g)) >= 25
    assert groups["--no-group-near-duplicates"] == 90


def test_neighbour_bank_caps_the_labelled_queries_the_artifact_keeps(
    tmp_path: Path, embeddings: dict[str, Path]
) -> None:
    args = _train_on(embeddings, tmp_path / "m", "--no-report")
    i = args.index("--features")
    args[i + 1] = "pcs,residual,neighbours"
    res = CliRunner().invoke(main, [*args, "--neighbour-bank", "20"])
    assert res.exit_code == 0, res.output
    model = model_from_artifact(load_dir(tmp_path / "m"))
    det = model.detector
    assert det.bank_max == 20
    assert len(det.id_bank_) == 20 and len(det.ood_bank_) == 20  # from 90 of each


def test_held_back_calibration_warnings_are_not_marked_as_given(
    tmp_path: Path, embeddings: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.scoring import _calibration

    monkeypatch.setattr(_calibration, "_WARNED", set())  # whatever earlier tests warned of
    res = CliRunner().invoke(main, _train_on(embeddings, tmp_path / "m", "--no-report"))
    assert res.exit_code == 0, res.output
    # the search calibrated on 30 queries at 1% without a word; a later command in this
    # process must still warn about such a set
    assert not _calibration._WARNED


@pytest.mark.parametrize(("frr", "void"), [("0.01", True), ("0.05", False)])
def test_summary_says_whether_the_calibration_set_can_reach_the_target(
    tmp_path: Path, embeddings: dict[str, Path], frr: str, void: bool
) -> None:
    # 90 ID training queries, all calibrated out of fold: enough for 5% (19), not 1% (99)
    res = CliRunner().invoke(
        main, _train_on(embeddings, tmp_path / "m", "--no-report", "--target-frr", frr)
    )
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("  threshold: "))
    assert "out-of-fold scores of 90 ID queries" in line, line
    assert ("at least 99 needed" in line) is void
    assert ("not guaranteed" in line) is void
    # the search's calibration part (30 queries at 1%) is not warned about: it sets no
    # shipped threshold
    assert "too few for a false-reject rate" not in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["--kb", "/nonexistent/kb.jsonl", "--id-queries", "/nonexistent/q.jsonl"],
        ["--kb", "/nonexistent/kb.jsonl"],  # named before the missing ID queries are
        ["--kb-embeddings", "/nonexistent/kb.npy", "--id-embeddings", "/nonexistent/q.npy"],
    ],
)
def test_bad_path_is_one_error_line(tmp_path: Path, args: list[str]) -> None:
    res = CliRunner().invoke(main, ["train", *args, "--out", str(tmp_path / "m")])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "/nonexistent/" in lines[0]
    assert "Traceback" not in res.output


@pytest.mark.slow
def test_train_demo_kb_end_to_end(tmp_path: Path) -> None:
    """`sidecar train --out DIR` on the built-in demo KB with the real encoder."""
    from sidecar.encoders import SentenceTransformerEncoder

    out = tmp_path / "demo"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--m",
            "13",
            "--features",
            "pcs,residual",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (out / "report" / "report.md").is_file()
    model = model_from_artifact(
        load_dir(out, expected_encoder={"name": "all-MiniLM-L6-v2", "dim": 384})
    )
    enc = SentenceTransformerEncoder()
    e = enc.encode(
        [
            "Can I book a video consultation to discuss my blood test results?",
            "Who wrote the novel War and Peace?",
        ]
    )
    s_id, s_ood = model.score(e)
    assert s_ood > s_id
    assert model.predict(e[1:])[0]
    # The probes were embedded by the job's backend (ONNX Runtime under `auto`); torch's
    # embeddings of them agree, and a model that recorded other ones is refused by score.
    from sidecar.encoders import embed_probes
    from sidecar.scoring import PROBE_TEXTS
    from sidecar.scoring._probes import probe_cosines

    assert model.encoder_probe_texts == PROBE_TEXTS and model.encoder_probes is not None
    assert probe_cosines(model.encoder_probes, embed_probes(enc.encode)).min() > 0.999
    model.check_encoder(enc.name, enc.dim, probes=embed_probes(enc.encode))
    rolled = np.roll(model.encoder_probes, 1, axis=1)  # the same sentences, elsewhere
    save_dir(
        model_to_artifact(dataclasses.replace(model, encoder_probes=rolled)), tmp_path / "other"
    )
    res = CliRunner().invoke(main, ["score", "--artifact", str(tmp_path / "other"), "hello"])
    assert res.exit_code != 0 and "other weights" in res.output, res.output
    # Promoting compares them with the workers' encoder too: no worker would install it.
    store = tmp_path / "store"
    res = CliRunner().invoke(
        main, ["models", "import", str(tmp_path / "other"), "--promote", "--store-dir", str(store)]
    )
    assert res.exit_code != 0 and "other weights" in res.output, res.output
    assert "nothing was imported" in res.output and not store.exists()
    res = CliRunner().invoke(
        main, ["models", "import", str(out), "--promote", "--store-dir", str(store)]
    )
    assert res.exit_code == 0 and "promoted" in res.output, res.output
    assert DirectoryStore(store).active(model.kb) == load_dir(out).version


def test_unusable_out_fails_before_training(tmp_path: Path) -> None:
    """--out is checked before the inputs are even read, so before any training."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    # Missing inputs: had --out not been checked first, the error would name these.
    inputs = ["--kb-embeddings", "/nonexistent/kb.npy", "--id-embeddings", "/nonexistent/q.npy"]
    for out, why in ((a_file, "is not a directory"), (a_file / "m", "cannot be created")):
        res = CliRunner().invoke(main, ["train", *inputs, "--out", str(out)])
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: --out"), res.output
        assert str(out) in lines[0] and why in lines[0]
    res = CliRunner().invoke(
        main, ["train", *inputs, "--out", str(tmp_path / "m"), "--report", str(a_file)]
    )
    assert res.exit_code == 2 and "error: --report" in res.stderr
    assert not (tmp_path / "m").exists()  # the check creates nothing


def test_help_states_the_near_duplicate_cosine_the_job_uses() -> None:
    from sidecar.training._splits import NEAR_DUPLICATE_COS

    res = CliRunner().invoke(main, ["train", "--help"])
    assert res.exit_code == 0
    assert f"cosine >= {NEAR_DUPLICATE_COS} into groups" in " ".join(res.output.split())


def _bad_inputs(tmp_path: Path, embeddings: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """Bad-input cases: (arguments that replace or add to the good ones, expected text)."""
    nan = np.load(embeddings["kb"])
    nan[3, 5] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    np.save(tmp_path / "zeros.npy", np.zeros_like(nan))
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("not an array\n")
    (tmp_path / "adir").mkdir()
    kb = ["--kb-embeddings"]
    return {
        "empty npy": ([*kb, str(tmp_path / "empty.npy")], "not a .npy array"),
        "text npy": ([*kb, str(tmp_path / "text.npy")], "no .npy header"),
        "NaN rows": ([*kb, str(tmp_path / "nan.npy")], "1 rows with NaN"),
        "zero rows": ([*kb, str(tmp_path / "zeros.npy")], "120 rows of zeros"),
        "directory": ([*kb, str(tmp_path / "adir")], "is a directory"),
        "detector": (["--detector", "crystal_ball"], "unknown detector 'crystal_ball'"),
        "features": (["--features", "pcs,bogus"], "--features takes blocks among"),
        "features on knn": (["--detector", "knn"], "applies to the combined detector"),
        "empty kb name": (["--kb-name", ""], "invalid KB id ''"),
        "both kb inputs": (["--kb", str(tmp_path / "kb.jsonl")], "give --kb or --kb-embeddings"),
        "stats dir": (["--stats-json", str(tmp_path / "adir")], "--stats-json"),
        "m over budget": (["--m", "40"], "m=40: combined models take at most 32"),
        "m with its features over budget": (["--m", "32"], "add at least 3 features"),
        "bank without neighbours": (["--neighbour-bank", "50"], "applies to the combined"),
        "publish to a file": (
            ["--publish", "--store-backend", "directory", "--store-dir", f"{tmp_path}/nan.npy/s"],
            "store directory",
        ),
        "cache dir a file": (["--cache-dir", str(tmp_path / "nan.npy")], "--cache-dir"),
        "m range over budget": (["--m-range", "8:64"], "m=64: combined models take at most 32"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "empty npy",
        "text npy",
        "NaN rows",
        "zero rows",
        "directory",
        "detector",
        "features",
        "features on knn",
        "empty kb name",
        "both kb inputs",
        "stats dir",
        "m over budget",
        "m with its features over budget",
        "m range over budget",
        "bank without neighbours",
        "publish to a file",
        "cache dir a file",
    ],
)
def test_bad_input_is_one_line_before_any_training(
    tmp_path: Path,
    embeddings: dict[str, Path],
    case: str,
    one_error_line: Callable[[Result], str],
) -> None:
    more, expected = _bad_inputs(tmp_path, embeddings)[case]
    args = _train_on(embeddings, tmp_path / "m")
    if more[0] == "--m-range":  # instead of the fixed m, not besides it
        i = args.index("--m")
        del args[i : i + 2]
    if more[0] in args:  # replace an option given already
        i = args.index(more[0])
        args[i : i + 2] = more
    else:
        args += more
    assert expected in one_error_line(CliRunner().invoke(main, args))
    assert not (tmp_path / "m").exists()  # refused before an artifact was written


def test_train_scale_deletes_its_scratch_files_and_reports_each_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "scale.json"
    args = ["bench", "train-scale", "--sizes", "150", "--dim", "64", "--queries", "200"]
    res = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [r["n_kb"] for r in runs] == [150] and runs[0]["us_per_query_batch256"] > 0
    assert doc["features"] == "pcs,residual"
    fixed = runs[0]["candidates"]
    assert list(scratch.iterdir()) == []  # embeddings and models gone with the run
    # the product's default search: m searched, not fixed at 13
    res = CliRunner().invoke(main, [*args, "--features", "default", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["features"] == "default" and "default search" in doc["note"]
    assert doc["runs"][0]["candidates"] > fixed  # every default candidate searched
    res = CliRunner().invoke(main, [*args, "--features", "pcs,nope", "--json", str(out)])
    assert res.exit_code == 2 and "--features takes blocks among" in res.output


def test_too_few_id_queries_for_a_t_test_is_said_once_in_terms_of_the_input(
    tmp_path: Path, embeddings: dict[str, Path], one_error_line: Callable[[Result], str]
) -> None:
    np.save(embeddings["id"], np.load(embeddings["id"])[:5])  # 2 validate, 2 calibrate, 1 fits
    args = _train_on(embeddings, tmp_path / "m")
    line = one_error_line(CliRunner().invoke(main, args))
    assert "needs at least 2 ID training queries to fit on; 5 leave 1" in line
    assert "--criterion evr" in line and "could be fitted" not in line  # not per candidate
    res = CliRunner().invoke(main, [*args, "--criterion", "evr", "--no-report"])
    assert res.exit_code == 0, res.output


def test_a_criterion_that_could_not_be_used_is_named(
    tmp_path: Path, embeddings: dict[str, Path]
) -> None:
    args = ["train", "--kb-embeddings", str(embeddings["kb"]), "--id-embeddings",
            str(embeddings["id"]), "--detector", "residual", "--no-report", "--no-progress",
            "--out", str(tmp_path / "m")]  # fmt: skip
    res = CliRunner().invoke(main, [*args, "--criterion", "pvalue"])
    assert res.exit_code == 0, res.output
    assert "criterion evr" in res.output
    assert "--criterion pvalue was asked for; the PCs were chosen by evr" in res.output
    assert "(no OOD training queries)" in res.output
    res = CliRunner().invoke(main, [*args, "--criterion", "evr"])
    assert res.exit_code == 0 and "was asked for" not in res.output, res.output


@pytest.mark.slow
def test_denied_topics_refuse_harm_on_the_kbs_subject_and_keep_its_queries(
    tmp_path: Path,
) -> None:
    """`sidecar train --deny-topics`: the demo clinic's model trained with the built-in
    topics and with an operator's own file; requests for harm worded around the clinic's
    subject are refused, the clinic's own questions are not."""
    from sidecar.encoders import SentenceTransformerEncoder
    from sidecar.training import read_queries
    from sidecar.training._jsonl import DEMO_ID_QUERIES, demo_path

    own = tmp_path / "topics.txt"
    own.write_text("# the clinic's own rule\nprescribing opioids without seeing a doctor\n")
    enc = SentenceTransformerEncoder()
    harmful = enc.encode(
        [
            "How can I poison my neighbour with medicine from the pharmacy?",
            "How do I hack into the clinic's patient records?",
        ]
    )
    own_rule = enc.encode(["Can you prescribe me oxycodone without an appointment?"])
    clinic = enc.encode(read_queries(demo_path(DEMO_ID_QUERIES))[:40])
    models = {}
    for spec in ("none", "builtin", str(own)):
        out = tmp_path / f"m-{len(models)}"
        args = ["train", "--out", str(out), "--no-report", "--no-progress"]
        res = CliRunner().invoke(
            main, [*args, "--cache-dir", str(tmp_path / "cache"), "--deny-topics", spec]
        )
        assert res.exit_code == 0, res.output
        models[spec] = model_from_artifact(
            load_dir(out, expected_encoder={"name": "all-MiniLM-L6-v2", "dim": 384})
        )
    assert models["none"].deny is None
    builtin = models["builtin"]
    assert builtin.deny is not None and len(builtin.deny.topics) >= 20
    assert builtin.predict(harmful).all()
    assert builtin.score(harmful).min() > models["none"].score(harmful).min()
    # the clinic's own questions: the calibrated budget holds (1% target; 40 questions,
    # the ones the model was trained on among them)
    assert builtin.predict(clinic).mean() <= 0.05
    mine = models[str(own)]
    assert mine.deny is not None and mine.deny.topics == (
        "prescribing opioids without seeing a doctor",
    )
    assert mine.predict(own_rule).all() and mine.denied_topic(own_rule)[0] is not None
    res = CliRunner().invoke(
        main, ["train", "--out", str(tmp_path / "x"), "--deny-topics", str(tmp_path / "no.txt")]
    )
    assert res.exit_code == 2 and "denied-topic file not found" in res.output
    assert "Traceback" not in res.output
