"""Bad input on the command line: eval-report, explain, score and models read one line.

A wrong path or a bad file ends in one ``error:`` line and exit status 2, never a
traceback; a read-only command never creates the store directory it was pointed at.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from model_store import DirectoryStore, build_artifact, save_dir
from sidecar.cli import main
from sidecar.errors import DataError
from sidecar.evaluation._eval_json import read_eval_json
from sidecar.explain import load_sources
from sidecar.explain._prompt import sources_from_records
from sidecar.persistence import model_to_artifact

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


# -- eval-report ---------------------------------------------------------------------------


def _eval_doc(**changes: Any) -> dict[str, Any]:
    row = {"auroc": 0.9, "balanced_accuracy": 0.85, "us_per_query": 2.0}
    doc: dict[str, Any] = {"benchmark": "x", "kbs": {"a": {"d": dict(row)}}, "mean": {"d": row}}
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_eval_doc(kbs=5, mean=[]), "kbs must be an object, not a number"),
        (_eval_doc(kbs={}, mean={}), "kbs holds no KB"),
        (_eval_doc(mean={}), "mean holds no detector"),
        (_eval_doc(mean=[]), "mean must be an object, not a list"),
        (_eval_doc(kbs={"a": []}), "kbs.a must be an object"),
        (_eval_doc(kbs={"a": {"d": 0.9}}), "kbs.a.d must be an object"),
        (_eval_doc(kbs={"a": {"d": {"auroc": "z"}}}), "kbs.a.d.auroc must be a number"),
        (_eval_doc(mean={"d": {"auroc": "z"}}), "mean.d.auroc must be a number"),
        (_eval_doc(mean={"d": {"us_per_query": None}}), "mean.d.us_per_query must be a number"),
        (_eval_doc(targets=[{"target": "t"}]), "targets[0] has no measured, met"),
        (
            _eval_doc(seed_spread={"mean": {"d": {"auroc": {"median": "m"}}}}),
            "seed_spread.mean.d.auroc has no min, max",
        ),
        (
            _eval_doc(pvalue_vs_evr={"detectors": {"d": {"paper_accuracy": {}, "auroc": {}}}}),
            "pvalue_vs_evr.detectors.d.paper_accuracy has no evr, pvalue, mean_diff",
        ),
    ],
)
def test_eval_report_with_wrong_types_is_one_line_naming_file_and_field(
    tmp_path: Path, doc: dict[str, Any], message: str, one_error_line: Callable[[Result], str]
) -> None:
    src = tmp_path / "eval.json"
    src.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="^" + str(src).replace(".", r"\.")):
        read_eval_json(src)
    line = one_error_line(_invoke("eval-report", str(src), "--out", str(tmp_path / "out")))
    assert str(src) in line and message in line, line


MULTILINGUAL = {"xsid", "sib200"}


def test_eval_report_still_reads_every_recorded_eval(tmp_path: Path) -> None:
    recorded = sorted(BENCHMARKS.glob("eval_*.json"))
    # xsid / sib200 runs are per-language reports of another shape (no eval-report draws)
    docs = {src: json.loads(src.read_text()) for src in recorded}
    monolingual = [src for src, d in docs.items() if d["benchmark"] not in MULTILINGUAL]
    # unseen-OOD runs report per held-out family, and are refused by name
    unseen = [src for src in monolingual if docs[src].get("ood_protocol") == "unseen-ood"]
    standard = [src for src in monolingual if src not in unseen]
    assert standard and unseen
    for src in standard:
        assert read_eval_json(src)["kbs"], src
    for src in unseen:
        with pytest.raises(DataError, match="report of the unseen-ood OOD protocol"):
            read_eval_json(src)
    src = tmp_path / "eval.json"
    src.write_text(json.dumps(_eval_doc()))
    res = _invoke("eval-report", str(src))
    assert res.exit_code == 0, res.output


# -- explain --------------------------------------------------------------------------------


def test_explain_sources_that_are_not_utf8_are_one_line(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    with pytest.raises(DataError, match=r"bin\.jsonl:1: not UTF-8"):
        load_sources(binary)
    line = one_error_line(
        _invoke("explain", "-q", "x", "--sources", str(binary), "-p", "contains:P")
    )
    assert f"{binary}:1: not UTF-8" in line
    later = tmp_path / "later.jsonl"
    later.write_bytes(b'{"text": "fine"}\n\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"later\.jsonl:3: not UTF-8"):
        load_sources(later)


def test_explain_bad_source_line_names_the_file_and_line(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text('{"text": "one"}\n\n{"id": "b"}\n')
    with pytest.raises(DataError, match=r"s\.jsonl:3: source 2 must be an object"):
        load_sources(src)
    line = one_error_line(_invoke("explain", "-q", "x", "--sources", str(src), "-p", "contains:P"))
    assert f"{src}:3: source 2" in line
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "x", "text": "1"}\n\n{"id": "x", "text": "2"}\n')
    with pytest.raises(DataError, match=r"dup\.jsonl:3: source ids must be unique.*dup\.jsonl:1"):
        load_sources(dup)
    # Records without a file (the explain agent) keep the plain message.
    with pytest.raises(DataError, match=r"^source 1 must be"):
        sources_from_records([{"id": "x"}])


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://", "http://host:port/v1", "http://h\t:9/v1", "HTTP://h/v1"]
)
def test_explain_a_base_url_that_is_no_url_is_one_line(
    url: str, tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "a", "text": "one"}\n')
    args = ["explain", "-q", "x", "--sources", str(src), "-p", "contains:P", "--base-url", url]
    line = one_error_line(_invoke(*args))
    assert "explain.base_url" in line and "retrying" not in line


def test_explain_an_empty_query_is_one_line(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "a", "text": "one"}\n')
    line = one_error_line(_invoke("explain", "-q", "  ", "--sources", str(src), "-p", "contains:P"))
    assert "--query is empty" in line  # as the explain agent refuses one


def test_explain_json_that_cannot_be_written_is_refused_before_any_call(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    # The endpoint does not exist: a call would fail with another message, after retries.
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "a", "text": "one"}\n')
    args = ["explain", "-q", "x", "--sources", str(src), "-p", "contains:P"]
    args += ["--base-url", "http://127.0.0.1:9/v1", "--json", str(tmp_path)]
    line = one_error_line(_invoke(*args))
    assert f"--json {tmp_path} is a directory" in line


# -- score and models: paths ---------------------------------------------------------------


def test_score_file_without_queries_says_so(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    line = one_error_line(_invoke("score", "--file", str(empty)))
    assert f"{empty} holds no queries" in line
    assert "give query TEXTS" not in line
    res = CliRunner().invoke(main, ["score", "--file", "-"], input="\n")
    assert "standard input holds no queries" in one_error_line(res)


def test_score_missing_file_is_exit_2_in_one_line(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    nope = tmp_path / "nope.txt"
    line = one_error_line(_invoke("score", "--file", str(nope)))
    assert line == f"error: --file {nope}: not found"


@pytest.mark.parametrize(
    "args",
    [
        ("score", "x", "--kb", "demo"),
        ("models", "list"),
        ("models", "show", "demo"),
        ("models", "export", "demo", "active", "OUT"),
    ],
)
def test_read_only_commands_refuse_a_missing_store_dir(
    tmp_path: Path, args: tuple[str, ...], one_error_line: Callable[[Result], str]
) -> None:
    missing = tmp_path / "typo"
    args = tuple(str(tmp_path / "out") if a == "OUT" else a for a in args)
    line = one_error_line(_invoke(*args, "--store-dir", str(missing)))
    assert f"store directory {missing} does not exist" in line
    assert not missing.exists()
    assert not (tmp_path / "out").exists()


def _artifact(i: int = 0) -> Any:
    return build_artifact(
        kb="demo",
        encoder={"name": "e", "dim": 4},
        model={"kind": "combined", "i": i},
        arrays={"w": np.full(4, float(i))},
    )


def test_writing_commands_still_create_the_store_dir(tmp_path: Path) -> None:
    from sidecar.scoring import fit_ood_model

    # import loads what it stores: a real (KB-only) model, not _artifact()'s stand-in
    kb = np.random.default_rng(0).normal(size=(12, 4))
    model = fit_ood_model(
        kb="demo", encoder={"name": "e", "dim": 4}, kb_embeddings=kb[:8],
        id_embeddings=kb[8:], detector="residual", target_frr=0.3, k=3,
    )  # fmt: skip
    art = save_dir(model_to_artifact(model), tmp_path / "art")
    store = tmp_path / "new-store"
    res = _invoke("models", "import", str(art), "--store-dir", str(store))
    assert res.exit_code == 0, res.output
    assert DirectoryStore(store).versions("demo")


def test_export_refuses_a_non_empty_directory_of_other_files(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    store_dir = tmp_path / "store"
    store = DirectoryStore(store_dir)
    v0, v1 = store.put(_artifact(0)), store.put(_artifact(1))
    where = ("--store-dir", str(store_dir))

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    line = one_error_line(_invoke("models", "export", "demo", v0, str(busy), *where))
    assert str(busy) in line and "not empty" in line
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]

    # A new or empty directory, and the same version again in place, are fine.
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (tmp_path / "new", empty, tmp_path / "new"):
        res = _invoke("models", "export", "demo", v0, str(target), *where)
        assert res.exit_code == 0, res.output
    # Another version over an export is refused: the old manifest stays.
    before = (empty / "manifest.json").read_bytes()
    line = one_error_line(_invoke("models", "export", "demo", v1, str(empty), *where))
    assert f"no export of demo/{v1}" in line
    assert (empty / "manifest.json").read_bytes() == before
