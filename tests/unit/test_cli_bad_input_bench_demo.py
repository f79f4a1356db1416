"""Bad input to the benchmarks, ``demo`` and ``prepare-encoder`` is refused up front.

A bad option value or path ends in exit status 2 and a readable message (one ``error:``
line, or click's usage error for a value out of an option's range) before any broker,
worker, encoder or benchmark phase starts; nothing here starts one: where the command
would, it is replaced by a stand-in that fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sidecar.cli import main
from sidecar.errors import SidecarError


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _usage_error(res: Result, *words: str) -> None:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert all(w in res.output for w in words), res.output


def _forbid(monkeypatch: pytest.MonkeyPatch, *targets: str) -> None:
    """Make each dotted ``module.attr`` fail the test if it is called."""

    def boom(*_: Any, **__: Any) -> None:
        raise AssertionError("long work started before the input was checked")

    for target in targets:
        monkeypatch.setattr(target, boom)


# -- prepare-encoder -----------------------------------------------------------------------


def test_prepare_encoder_refuses_an_unusable_dir_before_loading_the_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    _forbid(monkeypatch, "sidecar.encoders.OnnxEncoder")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    line = one_error_line(_invoke("prepare-encoder", "--dir", "afile/sub"))
    assert "--dir afile/sub" in line and "is not a directory" in line
    line = one_error_line(_invoke("prepare-encoder", "--dir", ""))
    assert "--dir is empty" in line
    if Path("/proc/self").is_dir():  # a folder nobody can make anything in, root included
        line = one_error_line(_invoke("prepare-encoder", "--dir", "/proc/nope"))
        assert "--dir /proc/nope" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_prepare_encoder_leaves_no_folder_behind_from_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def stand_in(*_: Any, cache_dir: Any = None, **__: Any) -> None:
        seen.append(cache_dir)
        raise SidecarError("stand-in encoder")

    monkeypatch.setattr("sidecar.encoders.OnnxEncoder", stand_in)
    where = tmp_path / "new" / "sub"
    res = _invoke("prepare-encoder", "--dir", str(where))
    assert res.exit_code == 2 and "stand-in encoder" in res.stderr, res.output
    assert seen == [where]  # the check passed, the export goes where asked
    assert list(tmp_path.iterdir()) == []  # the check made nothing that stayed


# -- demo ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--timeout", "0"], ["--timeout", "x>0"]),
        (["--timeout", "-5"], ["--timeout", "x>0"]),
        (["--limit", "0"], ["--limit", "x>=1"]),
        (["--limit", "-1"], ["--limit", "x>=1"]),
    ],
)
def test_demo_refuses_a_timeout_or_limit_that_cannot_work(
    args: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, "sidecar.local._demo_run.EmbeddedBroker")
    _usage_error(_invoke("demo", "--workdir", str(tmp_path / "w"), *args), *words)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("notaurl", "--redis-url notaurl: not a usable Redis URL"),
        ("", "--redis-url '': not a usable Redis URL"),
        ("redis://127.0.0.1:1/0", "--redis-url redis://127.0.0.1:1/0: no Redis answers"),
        ("redis://:secret@127.0.0.1:1/0", "--redis-url redis://***@127.0.0.1:1/0: no Redis"),
        ("redis://:secret@", "--redis-url redis://***@: not a usable Redis URL (it names no host"),
    ],
)
def test_demo_refuses_an_explicit_redis_url_that_does_not_answer(
    url: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    _forbid(monkeypatch, "sidecar.local._demo_run.EmbeddedBroker")
    line = one_error_line(_invoke("demo", "--redis-url", url, "--workdir", str(tmp_path / "w")))
    assert message in line and "--directory-store" in line
    assert "secret" not in line
    assert not (tmp_path / "w").exists()


def test_demo_still_falls_back_quietly_when_the_settings_redis_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_broker(*_: Any, **__: Any) -> None:
        raise SidecarError("stand-in broker")

    monkeypatch.setattr("sidecar.local._demo_run.EmbeddedBroker", no_broker)
    monkeypatch.setenv("SIDECAR_REDIS__URL", "redis://127.0.0.1:1/0")
    res = _invoke("demo", "--workdir", str(tmp_path / "w"))
    assert f"model store: directory {tmp_path / 'w' / 'store'}" in res.output, res.output
    assert "stand-in broker" in res.stderr
    # and --directory-store needs no Redis
    res = _invoke("demo", "--directory-store", "--workdir", str(tmp_path / "w2"))
    assert "model store: directory" in res.output and "stand-in broker" in res.stderr


# -- bench e2e, swap, train-scale ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["e2e", "--queries", "0"], ["--queries", "x>=1"]),
        (["e2e", "--queries", "-5"], ["--queries", "x>=1"]),
        (["e2e", "--half-rate-queries", "0"], ["--half-rate-queries", "x>=1"]),
        (["e2e", "--half-rate-queries", "-3"], ["--half-rate-queries", "x>=1"]),
        (["e2e", "--batch-max", "0"], ["--batch-max", "1<=x<=4096"]),
        (["e2e", "--batch-max", "5000"], ["--batch-max", "1<=x<=4096"]),
        (["e2e", "--batch-timeout-ms", "-1"], ["--batch-timeout-ms", "x>=0"]),
        (["e2e", "--encoder-threads", "-1"], ["--encoder-threads", "x>=0"]),
        (["swap", "--swap-window", "-1"], ["--swap-window", "x>0"]),
        (["swap", "--swap-window", "0"], ["--swap-window", "x>0"]),
        (["train-scale", "--sizes", ""], ["--sizes", "give at least one KB size"]),
        (["train-scale", "--sizes", ","], ["--sizes", "give at least one KB size"]),
        (["train-scale", "--sizes", " , "], ["--sizes", "give at least one KB size"]),
    ],
)
def test_bench_values_that_cannot_work_are_usage_errors(
    args: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid(monkeypatch, "sidecar.local.EmbeddedBroker", "subprocess.run")
    monkeypatch.chdir(tmp_path)
    _usage_error(_invoke("bench", *args, "--json", "r.json"), *words)
    assert list(tmp_path.iterdir()) == []  # no report, no work dir


# -- bench recalibration -------------------------------------------------------------------


def test_bench_recalibration_says_a_data_dir_that_is_a_file_is_not_a_directory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    _forbid(monkeypatch, "sidecar.encoders.load_encoder")
    a_file = tmp_path / "afile"
    a_file.write_text("")
    out = tmp_path / "r.json"
    res = _invoke("bench", "recalibration", "--benchmark", "clinc150", "--data-dir",
                  str(a_file), "--json", str(out))  # fmt: skip
    assert f"--data-dir {a_file} is not a directory" in one_error_line(res)
    assert not out.exists()


# -- bench detectors -----------------------------------------------------------------------


def test_bench_detectors_strips_names_and_refuses_an_empty_list(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    picked: list[list[str]] = []

    def stand_in(data: Any, m: int, repeats: int, min_time: float, kinds: list[str], *_: Any):
        picked.append(kinds)
        raise SidecarError("stand-in benchmark")

    monkeypatch.setattr("sidecar.bench._detectors._bench_models", stand_in)
    monkeypatch.setattr("sidecar.bench._detectors._synthetic", lambda *_: {})
    out = tmp_path / "r.json"
    base = ["bench", "detectors", "--json", str(out)]
    res = _invoke(*base, "--detectors", " logreg, knn ")
    assert res.exit_code == 2 and "error: stand-in benchmark" in res.stderr, res.output
    assert picked == [["logreg", "knn"]]
    line = one_error_line(_invoke(*base, "--detectors", " nope"))
    assert line == "error: unknown detectors: nope"
    for empty in (",", " , "):
        line = one_error_line(_invoke(*base, "--detectors", empty))
        assert f"--detectors {empty!r} names no detector" in line
    assert len(picked) == 1 and not out.exists()
