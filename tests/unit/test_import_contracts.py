"""The import contracts in pyproject.toml hold on the tree, and each one breaks when the
import it forbids is added (to a scratch copy): a rule that cannot fail guards nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    args = [str(LINT), "--no-cache"] + [a for c in contracts for a in ("--contract", c)]
    return subprocess.run(
        args, cwd=root, env={"PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120
    )


def test_every_contract_holds_on_the_tree() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# (contract id, file to change, the forbidden import appended to it)
BREACHES = [
    ("layers", "sidecar/scoring/_gmm.py", "import sidecar.stream"),
    ("layers", "sidecar/training/_grid.py", "import sidecar.evaluation"),
    ("layers", "sidecar/stream/_records.py", "import sidecar.local"),
    ("layers", "sidecar/explain/_lattice.py", "import sidecar.hotswap"),
    ("scoring-pure", "sidecar/scoring/_model.py", "import model_store"),
    ("scoring-pure", "sidecar/scoring/_gmm.py", "import torch"),
    ("explain-no-stream", "sidecar/explain/_lattice.py", "import faust"),
    ("explain-no-stream", "sidecar/explain/_prompt.py", "import redis"),
    ("store-leaf", "model_store/_files.py", "import sidecar.errors"),
    ("private", "sidecar/cli/_settings.py", "from sidecar.training._search import search"),
    ("acyclic", "sidecar/scoring/_base.py", "import sidecar.scoring._model"),
]


@pytest.fixture(scope="module")
def breached(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[int, str]]:
    """Each breach in a scratch copy of its own, linted for its contract, all at once (the
    runs are independent; together they take the time of about two)."""
    runs = {}
    for i, (contract, where, line) in enumerate(BREACHES):
        root = tmp_path_factory.mktemp(f"breach{i}")
        for part in ("sidecar", "model_store"):
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "pyproject.toml", root)
        with (root / where).open("a", encoding="utf-8") as f:
            f.write(f"\n{line}  # noqa\n")
        runs[i] = subprocess.Popen(
            [str(LINT), "--no-cache", "--contract", contract],
            cwd=root,
            env={"PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return {i: (run.wait(timeout=120), run.communicate()[0]) for i, run in runs.items()}


@pytest.mark.parametrize("i", range(len(BREACHES)), ids=[f"{c}:{w}" for c, w, _ in BREACHES])
def test_each_contract_breaks_on_the_import_it_forbids(
    breached: dict[int, tuple[int, str]], i: int
) -> None:
    returncode, output = breached[i]
    assert returncode == 1 and "BROKEN" in output, output


def test_no_private_module_imports_its_own_package() -> None:
    """``sidecar.X._y`` importing ``sidecar.X`` is a cycle through the package's
    ``__init__`` that the sibling contract cannot see; siblings import each other directly."""
    import ast

    offenders = []
    for path in sorted((REPO / "sidecar").glob("*/_*.py")):
        if path.name == "__init__.py":
            continue
        own = f"sidecar.{path.parent.name}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == own:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
