"""The rules benchmark's building blocks on tiny inputs."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sidecar.bench._hotpot import SimulatedHotpotLLM, load_hotpot
from sidecar.bench._rules import (
    compare_miners,
    hotpot_record,
    summarise,
    synthetic_table,
)
from sidecar.cli import main
from sidecar.errors import DataError


def test_compare_miners_is_exact_on_every_synthetic_kind() -> None:
    recs = []
    for kind in ("monotone", "antitone", "monotone_noisy", "random"):
        table = synthetic_table(kind, 6, random.Random(kind))

        async def sample(mask: int, i: int, table: dict[int, bool] = table) -> bool:
            return table[mask]

        rec = asyncio.run(compare_miners(6, sample, brute=True))
        assert rec["exact"] is True
        assert rec["evaluations"]["dual"] <= rec["evaluations"]["two_mono_shared_cache"]
        assert 0 < rec["dual_vs_two_mono_calls"] <= 1
        recs.append(rec)
    assert summarise(recs)["exact"] == "4/4"


def test_monotone_tables_are_monotone() -> None:
    table = synthetic_table("monotone", 5, random.Random(3))
    assert all(table[t | 1 << i] >= table[t] for t in range(32) for i in range(5))


def test_hotpot_loader_and_simulated_black_box(shared_data: Path) -> None:
    path = shared_data / "hotpotqa" / "hotpotqa_train_hipporag100.jsonl"
    items = load_hotpot(path, limit=2, n_sources=4)
    assert len(items) == 2 and all(len(it.sources) == 4 for it in items)
    assert all(len(it.supporting) == 2 for it in items)
    rec = asyncio.run(hotpot_record(items[0], SimulatedHotpotLLM(items[0], 0), brute=True))
    assert rec["exact"] is True
    assert rec["answer_all_sources"] == items[0].answer
    support = sum(1 << i for i in items[0].supporting)
    # the simulated box answers from supporting paragraphs only
    assert all(sum(1 << i for i in r) & support == sum(1 << i for i in r)
               for r in rec["rules"]["retention"])  # fmt: skip


def _hotpot_line(**drop: None) -> str:
    doc = {
        "_id": "q1",
        "question": "Who?",
        "answer": "Ada",
        "supporting_facts": [["A", 0]],
        "context": [["A", ["Ada wrote it."]], ["B", ["Bob did not."]]],
    }
    return json.dumps({k: v for k, v in doc.items() if k not in drop}) + "\n"


def test_hotpot_loader_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(_hotpot_line() + "\n" + _hotpot_line(supporting_facts=None))
    with pytest.raises(DataError, match=r"h\.jsonl:3: not a HotpotQA record: no field 'supporting"):
        load_hotpot(path, limit=2, n_sources=2)
    (item,) = load_hotpot(path, limit=1, n_sources=2)  # the blank line is no record
    assert item.supporting == [0] and len(item.sources) == 2
    path.write_text("[1]\n")
    with pytest.raises(DataError, match=r"h\.jsonl:1: .*not an object"):
        load_hotpot(path, limit=1, n_sources=2)


def test_hotpot_loader_rejects_binary_and_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"\x89\xff\xfe\x00garbage")
    with pytest.raises(DataError, match=r"h\.jsonl: not UTF-8 text"):
        load_hotpot(path, limit=1, n_sources=2)
    path.write_text("\n")
    with pytest.raises(DataError, match=r"h\.jsonl: holds no HotpotQA records$"):
        load_hotpot(path, limit=1, n_sources=2)
    path.write_text(_hotpot_line())
    with pytest.raises(DataError, match="no HotpotQA records after skipping 1"):
        load_hotpot(path, limit=1, n_sources=2, skip=1)


def _bench_rules(*args: str) -> Result:
    return CliRunner().invoke(
        main,
        ["bench", "rules", "--n-min", "2", "--n-max", "2", "--tables", "1", "--no-progress",
         "--hotpot-questions", "1", *args],
    )  # fmt: skip


def test_bench_rules_says_how_to_do_without_the_default_hotpot_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    monkeypatch.chdir(tmp_path)  # where ../shared/data does not exist
    line = one_error_line(_bench_rules("--json", str(tmp_path / "r.json")))
    assert "relative to the current directory" in line
    assert "--hotpot PATH" in line and "--hotpot-questions 0" in line
    assert not (tmp_path / "r.json").exists()  # failed before the synthetic part
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = one_error_line(_bench_rules("--json", str(tmp_path / "r.json"), "--hotpot", str(empty)))
    assert "holds no HotpotQA records" in line


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any part of the benchmark (the synthetic miners, the packaged LLM) fails the test."""

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("the benchmark started before its inputs were checked")

    monkeypatch.setattr("sidecar.bench._rules_run.compare_miners", boom)
    monkeypatch.setattr("sidecar.explain.LocalSmolLM2", boom)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json", "{tmp}"], "--json {tmp} is a directory"),
        (["--json", "{tmp}/a_file/r.json"], "--json {tmp}/a_file exists and is not a directory"),
        (["--llm-questions", "1"], "--llm-questions needs --local-model or --base-url"),
        (["--base-url", "ftp://x"], "--base-url must be http(s)://..., got 'ftp://x'"),
        (["--llm-questions", "1", "--base-url", "ftp://x"], "--base-url must be http(s)://"),
        (["--llm-questions", "1", "--local-model", "--llm-skip", "2"],
         "--llm-skip 2 skips past the end of {tmp}/h.jsonl (2 records)"),
        (["--hotpot", "{tmp}"], "--hotpot {tmp} is a directory, not a HotpotQA JSONL file"),
    ],
)  # fmt: skip
def test_bench_rules_checks_every_input_before_the_synthetic_part(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
) -> None:
    _no_work(monkeypatch)
    (tmp_path / "h.jsonl").write_text(_hotpot_line() + "\n" + _hotpot_line())  # two records
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "r.json"
    argv = ["--json", str(out), "--hotpot", str(tmp_path / "h.jsonl")]
    argv += [a.format(tmp=tmp_path) for a in args]  # a later --json or --hotpot wins
    assert message.format(tmp=tmp_path) in one_error_line(_bench_rules(*argv))
    assert not out.exists()
