"""Options that cannot work are refused up front, before any data is read or trained on:
a usage error for a value or a combination, one ``error:`` line for an output path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sidecar.cli import main


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _usage_error(res: Result, *words: str) -> None:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output  # one line
    assert all(w in res.output for w in words), res.output


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["--log-level", "bogus", "settings"], "sidecar"),  # the root group's own option
        (["nosuch"], "sidecar"),
        (["models", "promote"], "sidecar models promote"),  # a missing argument
        (["bench", "e2e", "--json", "x", "--queries", "0"], "sidecar bench e2e"),
        (["check", "--artifact", "a"], "sidecar check"),  # the command's own UsageError
    ],
)
def test_usage_errors_are_one_line_that_points_at_the_help(args: list[str], command: str) -> None:
    res = CliRunner().invoke(main, args, prog_name="sidecar")
    _usage_error(res, f"(see '{command} --help')")
    assert "Usage:" not in res.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--out", "o", "--seed", "-1"], ["--seed", "-1"]),
        (["eval", "--benchmark", "covid", "--data-dir", "d", "--json", "x", "--seed", "-1"],
         ["--seed"]),
        (["bench", "detectors", "--json", "x", "--seed", "-1"], ["--seed"]),
        (["bench", "detectors", "--json", "x", "--scale-n", "1000,abc"],
         ["'abc' is not an integer"]),
        (["bench", "detectors", "--json", "x", "--scale-m", "0"], ["0 is below 1"]),
        (["bench", "detectors", "--json", "x", "--repeats", "0"], ["--repeats"]),
        (["bench", "detectors", "--json", "x", "--n-train", "-5"], ["--n-train"]),
        (["bench", "detectors", "--json", "."], ["--json", "is a directory"]),
        (["bench", "train-scale", "--json", "x", "--sizes", "abc"], ["'abc' is not an integer"]),
        (["bench", "train-scale", "--json", "x", "--sizes", "0"], ["0 is below 100"]),
        (["bench", "train-scale", "--json", "x", "--queries", "0"], ["--queries"]),
        (["train", "--out", "o", "--no-promote"], ["--no-promote applies to --publish"]),
        (["train", "--out", "o", "--store-dir", "s"], ["--store-dir applies to --publish"]),
        (["train", "--out", "o", "--report", "r", "--no-report"], ["contradict"]),
        (["train", "--out", "o", "--m", "5", "--m-range", "3:8"], ["not both"]),
    ],
)  # fmt: skip
def test_values_and_combinations_that_cannot_work_are_usage_errors(
    args: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _usage_error(_invoke(*args), *words)
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing trained


def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    missing_data = str(tmp_path / "no_such_data")  # read only after the output check
    for args in (
        ["eval", "--benchmark", "covid", "--data-dir", missing_data, "--json", str(a_dir)],
        ["bench", "train-scale", "--json", str(a_dir)],
        ["bench", "recalibration", "--benchmark", "clinc150", "--data-dir", missing_data,
         "--json", str(a_dir)],
    ):  # fmt: skip
        assert f"--json {a_dir} is a directory" in one_error_line(_invoke(*args)), args
    report_file = tmp_path / "report_file"
    report_file.write_text("")
    args = ["eval", "--benchmark", "covid", "--data-dir", missing_data, "--json",
            str(tmp_path / "x.json"), "--report", str(report_file / "sub")]  # fmt: skip
    assert "is not a directory" in one_error_line(_invoke(*args))


def test_an_encoder_directory_without_a_model_is_one_error_line(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    res = _invoke("train", "--out", str(tmp_path / "o"), "--no-progress", "--encoder", str(empty))
    assert "holds no sentence-transformers model" in one_error_line(res)
    (empty / "config.json").write_text("{}")  # transformers cannot tell what model this is
    res = _invoke("train", "--out", str(tmp_path / "o"), "--no-progress", "--encoder", str(empty))
    assert "is not a usable model" in one_error_line(res)


def test_log_level_is_case_insensitive() -> None:
    res = _invoke("--log-level", "debug", "models", "--help")
    assert res.exit_code == 0, res.output


def test_a_file_where_a_directory_belongs_is_named_as_such(tmp_path: Path) -> None:
    from sidecar.cli._root import _describe

    a_file = tmp_path / "regular_file"
    a_file.write_text("")
    try:
        (a_file).mkdir()
    except FileExistsError as exc:
        assert _describe(exc) == f"{a_file} already exists and is not a directory"
    else:  # pragma: no cover - mkdir over a file always fails
        raise AssertionError("mkdir over a file succeeded")
    taken_dir = tmp_path / "taken"
    taken_dir.mkdir()
    try:
        taken_dir.mkdir()
    except FileExistsError as exc:
        assert _describe(exc) == f"File exists: {taken_dir}"  # a real clash keeps its words
    else:  # pragma: no cover - mkdir over a directory always fails
        raise AssertionError("mkdir over a directory succeeded")


def test_train_refuses_queries_without_a_kb_and_an_out_dir_of_other_files(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"text": "how do I reset my password"}\n')
    for option in ("--id-queries", "--ood-queries"):
        res = _invoke("train", "--out", str(tmp_path / "o"), "--no-progress", option, str(queries))
        assert "training queries were given without a KB" in one_error_line(res)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    res = _invoke("train", "--out", str(busy), "--no-progress")
    assert "holds other files" in one_error_line(res)
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]


def test_a_reader_that_stops_early_is_not_an_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from model_store import DirectoryStore, build_artifact

    store = DirectoryStore(tmp_path / "store")
    store.put(build_artifact(kb="kb", encoder={"name": "e", "dim": 2}, model={}, arrays={}))
    # `sidecar models list | head -1`: the pipe is closed before the command writes to it
    cmd = [sys.executable, "-m", "sidecar", "models", "list", "--store-dir", str(store.root)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # as for a writer stopped by SIGPIPE
    assert err == ""  # no "error: Broken pipe", no traceback at exit


def test_a_broken_pipe_that_is_not_stdout_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from model_store import DirectoryStore

    def peer_gone(self: DirectoryStore) -> list[str]:  # as a socket write would fail
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    (tmp_path / "store").mkdir()
    monkeypatch.setattr(DirectoryStore, "kbs", peer_gone)
    args = ["models", "list", "--store-dir", str(tmp_path / "store")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and res.output.startswith("error:"), res.output
    assert "Broken pipe" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["--debug", *args])
    assert res.exit_code == 2 and "Traceback" in res.output  # --debug shows where it was
    assert "peer_gone" in res.output and "BrokenPipeError" in res.output


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--detectors", "max_cosine", "--features", "pcs"], "apply to the combined detector"),
        (["--features", "pcs,bogus"], "--features takes blocks among"),
        (["--features", "pcs,residual", "--neighbour-bank", "100"], "neighbours block"),
    ],
)
def test_eval_grid_options_are_refused_before_any_data_is_read(
    extra: list[str], words: str, tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    args = ["eval", "--benchmark", "covid", "--data-dir", str(tmp_path / "no_such_data"),
            "--json", str(tmp_path / "x.json"), *extra]  # fmt: skip
    assert words in one_error_line(_invoke(*args))
    assert not (tmp_path / "x.json").exists()
