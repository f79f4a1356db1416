"""``sidecar demo`` end to end: one command, real broker, real worker, exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_runs_end_to_end_and_prints_verdicts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "demo",
            "--directory-store",
            "--limit",
            "12",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "12 verdicts, 2 dead letters" in out
    assert "DLQ  reason=undecodable" in out and "DLQ  reason=empty_text" in out
    assert "worker stopped (exit code 0)" in out
    rows = [line for line in out.splitlines() if line.startswith("demo-")]
    assert len(rows) == 12 and all((" ID " in r) or (" OOD " in r) for r in rows)
    # The last line says where the published model stayed, as a command that works.
    store = tmp_path / "store"
    assert out.splitlines()[-1].endswith(f"sidecar models list --store-dir {store}")
    listed = subprocess.run(
        [sys.executable, "-m", "sidecar", "models", "list", "--store-dir", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "default" in listed.stdout, listed.stderr


def test_the_multilingual_turn_streams_through_the_worker_with_languages(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar", "demo", "--directory-store", "--limit", "2",
         "--multilingual", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "loading the encoder use-multilingual-v3" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("lang-")]
    assert len(rows) == 42
    # the worker's verdicts carry the detected language of every question
    told = {row[3] if row[3] != "!" else row[4] for row in rows}
    assert told <= {"en", "de", "es", "fr", "it", "nl", "und"} and len(told) >= 6
    for lang in ("de", "es", "fr", "it", "nl"):
        assert f"multilingual turn, {lang}: " in out
