"""``sidecar check``: figures on held-out queries and release gates, through click's
CliRunner, on models trained from synthetic embeddings into a directory store."""

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

DIM = 32


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, encoder_configs: Callable[[int], Path]
) -> dict[str, Path]:
    """Embeddings (KB, training and held-out ID / OOD queries), an artifact directory and
    a directory store holding two versions of KB 'synthetic' (the second one active)."""
    root = tmp_path_factory.mktemp("check")
    rng = np.random.default_rng(0)
    basis = rng.normal(size=(6, DIM))

    def id_like(n: int) -> np.ndarray:
        return _unit(rng.normal(size=(n, 6)) @ basis + 0.8 * rng.normal(size=(n, DIM)))

    paths = {"root": root, "store": root / "store", "art": root / "art"}
    paths["encoder"] = encoder_configs(DIM)  # the width the embeddings have
    for name, arr in (
        ("kb", id_like(150)),
        ("id", id_like(120)),
        ("ood", _unit(rng.normal(size=(120, DIM)))),
        ("id_held", id_like(200)),
        ("ood_held", _unit(rng.normal(size=(40, DIM)))),
        ("wide", _unit(rng.normal(size=(5, DIM + 1)))),
    ):
        paths[name] = root / f"{name}.npy"
        np.save(paths[name], arr)
    for m, out in (("3", root / "first"), ("5", paths["art"])):
        res = CliRunner().invoke(
            main,
            [
                "train",
                *("--kb-embeddings", str(paths["kb"]), "--id-embeddings", str(paths["id"])),
                *("--ood-embeddings", str(paths["ood"]), "--m", m, "--features", "pcs,residual"),
                *("--kb-name", "synthetic", "--out", str(out), "--no-report", "--no-progress"),
                *("--encoder", str(paths["encoder"])),
                *("--publish", "--store-backend", "directory", "--store-dir", str(paths["store"])),
            ],
        )
        assert res.exit_code == 0, res.output
    return paths


def _check(setup: dict[str, Path], *args: str) -> Result:
    return CliRunner().invoke(
        main,
        [
            "check",
            *("--id-embeddings", str(setup["id_held"]), "--ood-embeddings", str(setup["ood_held"])),
            *args,
        ],
    )


def test_figures_are_the_models_own_at_its_threshold(setup: dict[str, Path]) -> None:
    out = setup["root"] / "figures.json"
    res = _check(setup, "--artifact", str(setup["art"]), "--json", str(out))
    assert res.exit_code == 0, res.output
    model = model_from_artifact(load_dir(setup["art"]))
    s_id = model.score(np.load(setup["id_held"]))
    s_ood = model.score(np.load(setup["ood_held"]))
    doc = json.loads(out.read_text())
    got = doc["checked"]
    assert got["version"] == load_dir(setup["art"]).version and doc["against"] is None
    assert got["false_reject"]["count"] == int(np.sum(s_id > model.threshold))
    assert got["ood_accept"]["count"] == int(np.sum(s_ood <= model.threshold))
    assert (got["n_id"], got["n_ood"]) == (200, 40)
    fr = got["false_reject"]
    assert fr["low"] <= fr["rate"] <= fr["high"] and fr["high"] > fr["rate"]
    assert doc["gates"] == [] and doc["passed"] is True
    assert "false-reject rate" in res.output and "OOD accept rate" in res.output


def test_a_failed_gate_exits_1_and_conservative_judges_the_interval_end(
    setup: dict[str, Path],
) -> None:
    art = ["--artifact", str(setup["art"])]
    model = model_from_artifact(load_dir(setup["art"]))
    accepted = float(np.mean(model.score(np.load(setup["ood_held"])) <= model.threshold))
    limit = f"{accepted + 0.01:.4f}"  # the point estimate passes ...
    res = _check(setup, *art, "--max-ood-accept", limit)
    assert res.exit_code == 0, res.output
    assert f"gate --max-ood-accept {float(limit):g}: met" in res.output
    # ... the upper end of its 95% interval over 40 queries does not
    out = setup["root"] / "conservative.json"
    res = _check(setup, *art, "--max-ood-accept", limit, "--conservative", "--json", str(out))
    assert res.exit_code == 1, res.output
    assert "FAILED" in res.output
    doc = json.loads(out.read_text())
    assert doc["passed"] is False and doc["conservative"] is True
    assert doc["gates"][0]["measured"] == doc["checked"]["ood_accept"]["high"]
    from sidecar.training._metrics import auroc

    a = auroc(model.score(np.load(setup["id_held"])), model.score(np.load(setup["ood_held"])))
    assert 0.5 < a < 1.0
    assert _check(setup, *art, "--min-auroc", f"{a - 0.001:.6f}").exit_code == 0
    res = _check(setup, *art, "--min-auroc", f"{a + 0.001:.6f}", "--max-frr", "1")
    assert (
        res.exit_code == 1 and "gate --min-auroc" in res.output and "--max-frr 1: met" in res.output
    )


def test_against_measures_the_serving_version_on_the_same_queries(
    setup: dict[str, Path],
) -> None:
    store = DirectoryStore(setup["store"])
    active = store.active("synthetic")
    (first,) = [v for v in store.versions("synthetic") if v != active]
    out = setup["root"] / "against.json"
    args = ["--store-dir", str(setup["store"]), "--kb", "synthetic", "--json", str(out)]
    report = setup["root"] / "against_report"
    res = _check(
        setup, *args, "--version", first[:8], "--against", "active", "--report", str(report)
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert (doc["checked"]["version"], doc["against"]["version"]) == (first, active)
    page = (report / "check.md").read_text()
    assert f"`{first[:12]}`" in page and f"`{active[:12]}`" in page
    for png in ("roc.png", "hist_checked.png", "hist_against.png"):
        assert (report / png).stat().st_size > 1000, png
    assert f"against active, version {active[:12]}" in res.output
    served = model_from_artifact(store.get("synthetic", active))
    flagged = int(np.sum(served.score(np.load(setup["id_held"])) > served.threshold))
    assert doc["against"]["false_reject"]["count"] == flagged


def _workers_run(encoder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings' scoring.encoder (the workers') is the one the models were built with."""
    monkeypatch.setenv("SIDECAR_SCORING__ENCODER", str(encoder))


def test_promote_only_when_the_gates_hold(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    _workers_run(setup["encoder"], monkeypatch)
    store_dir = tmp_path / "store"
    shutil.copytree(setup["store"], store_dir)
    store = DirectoryStore(store_dir)
    active = store.active("synthetic")
    (first,) = [v for v in store.versions("synthetic") if v != active]
    stats = tmp_path / "cand.json"
    stats.write_text(json.dumps({"version": first, "train_total_s": 1.0}))
    base = ["--store-dir", str(store_dir), "--kb", "synthetic", "--version-from", str(stats)]
    # a perfect model only: no ID query refused and no OOD query accepted
    res = _check(setup, *base, "--promote", "--max-frr", "0", "--max-ood-accept", "0")
    assert res.exit_code == 1 and "FAILED" in res.output, res.output
    assert f"not promoted: synthetic/{first} failed a gate" in res.output
    assert store.active("synthetic") == active  # a failed gate promotes nothing
    res = _check(setup, *base, "--promote", "--max-frr", "1", "--against", "active")
    assert res.exit_code == 0 and f"promoted synthetic/{first}" in res.output, res.output
    assert store.active("synthetic") == first
    res = _check(setup, *base, "--promote", "--max-frr", "1")  # a retrain that changed nothing
    assert res.exit_code == 0 and f"already active: synthetic/{first}" in res.output


def test_a_stats_file_names_its_kb_as_well_as_its_version(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    stats, out = tmp_path / "stats.json", tmp_path / "m"
    train = [
        "train",
        *("--kb-embeddings", str(setup["kb"]), "--id-embeddings", str(setup["id"])),
        *("--ood-embeddings", str(setup["ood"]), "--m", "5", "--features", "pcs,residual"),
        *("--kb-name", "synthetic", "--encoder", str(setup["encoder"])),
        *("--out", str(out), "--no-progress", "--stats-json", str(stats)),
    ]
    res = CliRunner().invoke(main, train)
    assert res.exit_code == 0, res.output
    doc = json.loads(stats.read_text())
    assert doc["kb"] == "synthetic" and doc["version"] == load_dir(setup["art"]).version
    # no --kb needed: the stats file says which KB (the settings would say 'default')
    base = ["--store-dir", str(setup["store"]), "--version-from", str(stats)]
    res = _check(setup, *base)
    assert res.exit_code == 0, res.output
    assert f"KB 'synthetic', version {doc['version'][:12]}" in res.output
    res = _check(setup, *base, "--kb", "other")
    assert res.exit_code == 2 and "is a model of KB 'synthetic', not 'other'" in res.output
    # an earlier run's report does not stay beside a model trained without one
    assert (out / "report" / "report.md").is_file()
    res = CliRunner().invoke(main, [*train, "--no-report"])
    assert res.exit_code == 0, res.output
    assert not (out / "report").exists() and load_dir(out).version == doc["version"]


def test_an_artifact_against_a_version_of_a_named_store(setup: dict[str, Path]) -> None:
    store = DirectoryStore(setup["store"])
    active = store.active("synthetic")
    out = setup["root"] / "art_against.json"
    art = ["--artifact", str(setup["art"]), "--store-dir", str(setup["store"])]
    res = _check(setup, *art, "--against", "previous", "--json", str(out))
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["checked"]["version"] == active == load_dir(setup["art"]).version
    assert doc["against"]["version"] != active  # the first version, from that store
    res = _check(setup, *art)  # the store options would do nothing here
    assert res.exit_code == 2 and "apply to --against" in res.output, res.output


def test_promoting_a_model_of_another_encoder_than_the_workers_is_refused(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    # The settings name the default encoder; the models were built with a 32-dim one.
    store = DirectoryStore(tmp_path / "store")
    version = store.put(load_dir(setup["art"]))
    args = ["--store-dir", str(tmp_path / "store"), "--kb", "synthetic", "--version", version]
    res = _check(setup, *args, "--max-frr", "1", "--promote")
    assert res.exit_code == 2 and "nothing was checked or promoted" in res.output, res.output
    assert "all-MiniLM-L6-v2" in res.output and store.active("synthetic") is None
    res = _check(setup, *args, "--max-frr", "1", "--promote", "--any-encoder")
    assert res.exit_code == 0 and store.active("synthetic") == version, res.output
    res = _check(setup, *args, "--max-frr", "1", "--any-encoder")
    assert res.exit_code == 2 and "--any-encoder applies to --promote" in res.output


def test_a_first_release_has_nothing_to_compare_with(
    setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_store import load_dir

    _workers_run(setup["encoder"], monkeypatch)
    store = DirectoryStore(tmp_path / "store")
    version = store.put(load_dir(setup["art"]))  # stored, never promoted
    args = ["--store-dir", str(tmp_path / "store"), "--kb", "synthetic", "--version", version]
    res = _check(setup, *args, "--against", "active", "--max-frr", "1", "--promote")
    assert res.exit_code == 0, res.output
    assert "against active: KB 'synthetic' has no such version yet" in res.output
    assert store.active("synthetic") == version
    # a version id that matches nothing is an error, not a comparison skipped
    res = _check(setup, *args, "--against", "ffffffff")
    assert res.exit_code == 2 and "has no version 'ffffffff'" in res.output, res.output


def test_training_queries_given_as_held_out_are_flagged(setup: dict[str, Path]) -> None:
    out = setup["root"] / "nb"
    res = CliRunner().invoke(
        main,
        [
            "train",
            *("--kb-embeddings", str(setup["kb"]), "--id-embeddings", str(setup["id"])),
            *("--ood-embeddings", str(setup["ood"]), "--m", "4"),
            *("--features", "pcs,residual,neighbours", "--out", str(out)),
            *("--no-report", "--no-progress"),
        ],
    )
    assert res.exit_code == 0, res.output
    report = setup["root"] / "nb.json"
    args = ["--artifact", str(out), "--json", str(report)]
    res = CliRunner().invoke(
        main, ["check", *args, "--id-embeddings", str(setup["id"]), "--ood-embeddings",
               str(setup["ood_held"])],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    copies = json.loads(report.read_text())["checked"]["training_copies"]
    assert copies["id"] > 0 and copies["ood"] == 0
    assert "repeat the model's training queries" in res.output
    res = _check(setup, *args)  # truly held out: nothing to warn about
    assert res.exit_code == 0 and "repeat the model" not in res.output
    assert json.loads(report.read_text())["checked"]["training_copies"] == {"id": 0, "ood": 0}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--id-embeddings", "{wide}"],
            f"ID embeddings have {DIM + 1} dims, the model's encoder {DIM}",
        ),
        (["--id-embeddings", "{root}/missing.npy"], "missing.npy"),
        (["--json", "{root}"], "--json"),
        (["--against", "active"], "store directory"),
        (["--version-from", "{root}/id_held.npy"], "id_held.npy: not a JSON file"),
    ],
)
def test_bad_input_is_one_error_line(
    setup: dict[str, Path],
    args: list[str],
    expected: str,
    one_error_line: Callable[[Result], str],
) -> None:
    filled = [a.format(**{k: str(v) for k, v in setup.items()}) for a in args]
    res = CliRunner().invoke(
        main,
        [
            "check",
            *("--id-embeddings", str(setup["id_held"])),
            *(filled if "--version-from" in filled else ["--artifact", str(setup["art"]), *filled]),
        ],
        env={"SIDECAR_STORE__BACKEND": "directory", "SIDECAR_STORE__DIRECTORY": "/nonexistent"},
    )
    assert expected in one_error_line(res)


def test_a_report_without_ood_queries_has_no_roc(setup: dict[str, Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["check", "--artifact", str(setup["art"]), "--id-embeddings", str(setup["id_held"]),
         "--report", str(tmp_path / "r")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "hist_checked.png").is_file()
    assert not (tmp_path / "r" / "roc.png").exists()
    assert "| checked |" in (tmp_path / "r" / "check.md").read_text()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "give --id-queries or --id-embeddings"),
        (["--id-embeddings", "x.npy", "--id-queries", "x.jsonl"], "not both"),
        (["--id-embeddings", "x.npy", "--min-auroc", "0.9"], "--min-auroc needs --ood-queries"),
        (["--id-embeddings", "x.npy", "--promote"], "--promote needs at least one gate"),
        (["--id-embeddings", "x.npy", "--promote", "--max-frr", "0.1"], "leave out --artifact"),
        (["--id-embeddings", "x.npy", "--version", "active"], "leave out --version"),
    ],
)
def test_usage_errors_are_refused_before_any_work(
    setup: dict[str, Path], args: list[str], expected: str
) -> None:
    res = CliRunner().invoke(main, ["check", "--artifact", str(setup["art"]), *args])
    assert res.exit_code == 2 and expected in res.output, res.output
