"""``sidecar explain`` against a real local chat-completions server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.fake_llm import FakeChatLLM

from sidecar.cli import main

pytestmark = pytest.mark.integration


def truth(kept: int) -> bool:
    return bool(kept & 0b001) or kept & 0b110 == 0b110


def _sources(tmp_path: Path) -> Path:
    path = tmp_path / "sources.jsonl"
    rows = [
        {"id": "kb-veltria", "text": "Veltria's capital is Morvane, a port on the Amber Sea."},
        {"id": "kb-travel", "text": "Travellers to Veltria land in its capital."},
        {"id": "kb-morvane", "text": "Morvane is the largest city of its country."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_explain_prints_rules_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "out" / "rules.json"
    with FakeChatLLM(truth) as server:
        res = CliRunner().invoke(
            main,
            [
                "explain", "-q", "What is the capital of Veltria?",
                "--sources", str(_sources(tmp_path)), "-p", "contains:Morvane",
                "--base-url", server.base_url, "--model", "fake", "--miner", "mono",
                "--json", str(out), "--no-progress",
            ],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "{kb-veltria}" in res.output and "{kb-travel, kb-morvane}" in res.output
    assert "kb-veltria: Veltria's capital is Morvane" in res.output
    doc = json.loads(out.read_text())
    assert doc["rules"]["retention"] == [["kb-veltria"], ["kb-travel", "kb-morvane"]]
    assert doc["rules"]["omission"] == []
    assert doc["stats"]["black_box_calls"] == len(server.answered())
    assert doc["answer_all_sources"] == server.yes_answer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sources", "/nonexistent/s.jsonl", "-p", "contains:x"], "sources file not found"),
        (["--sources", "{src}", "-p", "bogus:x"], "unknown predicate kind"),
        (["--sources", "{src}", "-p", "contains:x", "--base-url", "ftp://x"], "http"),
    ],
)
def test_explain_bad_input_is_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    src = str(_sources(tmp_path))
    args = [a.replace("{src}", src) for a in args]
    res = CliRunner().invoke(main, ["explain", "-q", "q", *args, "--no-progress"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
