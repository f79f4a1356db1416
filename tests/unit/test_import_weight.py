"""What importing a package pulls in: the worker's stream package and the store's users
must not load scikit-learn, torch or the LLM client before they need them (every worker
start and every `sidecar models ...` command would pay for it)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("package", "absent"),
    [
        ("sidecar.stream", ("sklearn", "scipy", "torch", "httpx", "sidecar.explain")),
        ("sidecar.persistence", ("sklearn", "scipy", "torch", "sidecar.scoring")),
        ("sidecar.hotswap", ("sklearn", "scipy", "torch", "sidecar.scoring")),
        ("sidecar.cli", ("sklearn", "torch", "faust", "sidecar.scoring")),
        ("sidecar.scoring", ("torch", "redis", "model_store", "faust", "sidecar.settings")),
    ],
)
def test_importing_a_package_loads_only_what_it_needs(
    package: str, absent: tuple[str, ...]
) -> None:
    code = f"import sys, {package}; print(' '.join(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
