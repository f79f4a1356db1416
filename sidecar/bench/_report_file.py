"""Where a benchmark's report lands: one indented JSON file, its folder made if need be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` as indented JSON with a final newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
