"""Layout figures of a checkout, from its code.

Module and package import cycles (from ``../shared/tools/house.py`` where it is present),
cross-package imports of private modules (``sidecar.X._y`` from outside ``sidecar.X``:
statements and distinct module pairs), modules over 400 lines, functions over 80 lines and
lines per package::

    python benchmarks/studies/layout_metrics.py [CHECKOUT]   # JSON on stdout

The issue-26 note quotes its output for main before and after the redesign
(``benchmarks/results/layout_issue26.json``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for the two product packages."""
    out = {}
    for base in ("sidecar", "model_store"):
        for p in (root / base).rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def package(module: str) -> str:
    parts = module.split(".")
    return "model_store" if parts[0] == "model_store" else ".".join(parts[:2])


def _private_target(target: str, importer: str, mods: dict[str, Path]) -> str | None:
    """The private module ``target`` reaches in another package, or None."""
    parts = target.split(".")
    if parts[0] != "sidecar" or len(parts) < 3 or package(target) == package(importer):
        return None
    if not any(s.startswith("_") and not s.startswith("__") for s in parts[2:]):
        return None
    if target in mods or ".".join(parts[:-1]) in mods:
        return ".".join(parts[:3])
    return None


def measure(root: Path) -> dict[str, Any]:
    mods = modules(root)
    statements, pairs = 0, set()
    long_functions, big_modules, lines = [], [], Counter()
    for name, path in mods.items():
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        lines[package(name) if "." in name else name] += n
        if n > MAX_MODULE_LINES:
            big_modules.append((n, str(path.relative_to(root))))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append((length, f"{path.relative_to(root)}:{node.name}"))
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            reached = {t for t in (_private_target(t, name, mods) for t in targets) if t}
            pairs |= {(name, t) for t in reached}
            statements += bool(reached)
    house_py = root.parent / "shared" / "tools" / "house.py"
    house = None
    if house_py.is_file():
        run = subprocess.run(
            [sys.executable, str(house_py), str(root)], capture_output=True, text=True
        )
        house = run.stdout.strip().splitlines()[-1]
    return {
        "house": house,
        "cross_package_private_import_statements": statements,
        "cross_package_private_module_pairs": len(pairs),
        f"modules_over_{MAX_MODULE_LINES}_lines": sorted(big_modules, reverse=True),
        f"functions_over_{MAX_FUNCTION_LINES}_lines": len(long_functions),
        "longest_functions": sorted(long_functions, reverse=True)[:8],
        "lines_per_package": dict(lines.most_common()),
        "modules": len(mods),
    }


if __name__ == "__main__":
    checkout = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    print(json.dumps(measure(checkout), indent=1))
