"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

# Nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The evaluation data beside the checkout (``../shared/data``)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"evaluation data not found at {SHARED_DATA}")
    return SHARED_DATA


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


@pytest.fixture
def one_error_line() -> Callable[[Result], str]:
    """Checks that a CLI run failed the way bad input must (exit status 2, one `error:`
    line on stderr, no traceback) and returns that line."""
    return _one_error_line
