"""What importing a package pulls in: the worker's stream package and the store's users
must not load scikit-learn, torch or the LLM client before they need them (every worker
start and every `sidecar models ...` command would pay for it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

WEIGHTS = {
    "sidecar.stream": ("sklearn", "scipy", "torch", "httpx", "sidecar.explain"),
    "sidecar.persistence": ("sklearn", "scipy", "torch", "sidecar.scoring"),
    "sidecar.hotswap": ("sklearn", "scipy", "torch", "sidecar.scoring"),
    "sidecar.cli": ("sklearn", "torch", "faust", "sidecar.scoring"),
    "sidecar.scoring": ("torch", "redis", "model_store", "faust", "sidecar.settings"),
}


@pytest.fixture(scope="module")
def loaded() -> dict[str, str]:
    """For each package, the modules of its list that a fresh interpreter has loaded
    after importing it; the interpreters run side by side."""
    runs = {
        package: subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys, {package}; "
                f"print(' '.join(m for m in {absent!r} if m in sys.modules))",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for package, absent in WEIGHTS.items()
    }
    return {package: run.communicate(timeout=120)[0].strip() for package, run in runs.items()}


@pytest.mark.parametrize("package", sorted(WEIGHTS))
def test_importing_a_package_loads_only_what_it_needs(loaded: dict[str, str], package: str) -> None:
    assert loaded[package] == ""
