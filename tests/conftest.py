"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from hypothesis import HealthCheck, settings

# Nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (tests that set max_examples
# themselves keep it). "bounded", the default: 80 examples per property, what the CI run
# affords (the record fuzz, tests/unit/test_records_fuzz.py, takes seconds); "long":
# 100,000 per property (the record fuzz's long run, see docs/research/hostile-input.md).
_FUZZ = {
    "deadline": None,  # a 1 MB record takes milliseconds; timing is not the property
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile(
    "bounded",
    max_examples=80,
    # the same examples on every CI run (a new failure is a new bug, not a new draw)
    derandomize=bool(os.environ.get("CI")),
    **_FUZZ,
)
# HYPOTHESIS_MAX_EXAMPLES sets another count for it (a shorter run on a busy machine).
settings.register_profile(
    "long", max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "100000")), **_FUZZ
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "bounded"))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The evaluation data beside the checkout (``../shared/data``)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"evaluation data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def encoder_configs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``dim`` -> a directory holding only the sentence-transformers configs of a
    ``dim``-wide encoder (no weights): what ``sidecar train --encoder`` reads a model's
    width from when it trains on synthetic embeddings of that width."""
    import json

    def make(dim: int) -> Path:
        directory = tmp_path_factory.getbasetemp() / f"encoder-{dim}d"  # one per width
        (directory / "1_Pooling").mkdir(parents=True, exist_ok=True)
        modules = [
            {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        (directory / "modules.json").write_text(json.dumps(modules))
        pooling = {"word_embedding_dimension": dim, "pooling_mode_mean_tokens": True}
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        return directory

    return make


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
