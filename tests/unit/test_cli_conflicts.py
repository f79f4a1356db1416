"""Options that contradict each other, or say nothing, are refused in one line before
anything starts, instead of one of them being silently ignored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sidecar.cli import main


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["models", "list", "--store-dir", ""], "'--store-dir': is empty"),
        (["models", "import", "art", "--store-dir", " "], "'--store-dir': is empty"),
        (["models", "list", "--redis-url", ""], "'--redis-url': is empty"),
        (
            ["demo", "--redis-url", "redis://127.0.0.1:1/0", "--directory-store"],
            "give --redis-url or --directory-store, not both",
        ),
        (
            [
                *("explain", "-q", "q", "-p", "contains:x", "--sources", "s.jsonl"),
                *("--local-model", "--base-url", "http://llm.local/v1"),
            ],
            "leave out --base-url and --model",
        ),
    ],
)
def test_contradicting_or_empty_options_are_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_error_line: Callable[[Result], str],
    args: list[str],
    words: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.jsonl").write_text('{"text": "a source"}\n')
    line = one_error_line(CliRunner().invoke(main, args))
    assert words in line, line
    assert list(tmp_path.iterdir()) == [tmp_path / "s.jsonl"]  # nothing was written


def test_the_default_detector_without_ood_queries_names_what_trains_without(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    for name in ("kb", "id"):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(40, 384)).astype(np.float32))
    args = ["train", "--kb-embeddings", str(tmp_path / "kb.npy")]
    args += ["--id-embeddings", str(tmp_path / "id.npy"), "--out", str(tmp_path / "o")]
    line = one_error_line(CliRunner().invoke(main, [*args, "--no-report", "--no-progress"]))
    assert "'combined' needs OOD training queries (--ood-queries" in line
    assert "--detector residual" in line
