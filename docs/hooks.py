"""mkdocs hooks: the generated parts of the site.

- ``<!-- generated: NAME -->`` markers in a page are replaced by a table generated from
  the code (docs/scripts/reference_tables.py): ``settings``, ``dlq-scoring``,
  ``dlq-explain``, ``messages-scoring``, ``messages-explain``, ``metrics``.
- Sphinx-style roles in docstrings (``:func:`name```), which mkdocstrings prints as raw
  text, become cross-references on the API pages (see :func:`on_page_content`).
- The figures under ``assets/figures/`` are redrawn from the recorded benchmark JSON
  (docs/scripts/draw_figures.py) at every build, so the site never shows a stale one;
  the committed PNGs are what the README shows on a code host.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "docs" / "scripts"
# The reference pages document the checkout the site is built from.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _script(name: str) -> ModuleType:
    """A module of docs/scripts/, loaded by path (mkdocs loads this file by path too)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


MARKER = re.compile(r"<!--\s*generated:\s*([a-z-]+)\s*-->")


def _generate(name: str) -> str:
    tables = _script("reference_tables")

    if name == "settings":
        from sidecar.settings import Settings

        return tables.settings_markdown(Settings)
    if name == "dlq-scoring":
        return tables.reason_codes_markdown(REPO, "scoring")
    if name == "dlq-explain":
        return tables.reason_codes_markdown(REPO, "explain")
    if name == "messages-scoring":
        return tables.message_schemas_markdown(REPO, "scoring")
    if name == "messages-explain":
        return tables.message_schemas_markdown(REPO, "explain")
    if name == "metrics":
        return tables.metrics_markdown(REPO)
    raise ValueError(f"unknown generated block {name!r}")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda m: _generate(m.group(1)), markdown)


# A role as mkdocstrings renders it: the role's name as text, then the target in <code>.
ROLE = re.compile(
    r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj|const):"
    r"<code>~?\.?(?P<name>[A-Za-z_][\w.]*)(?P<call>\(\))?</code>"
)
DIRECTIVE = re.compile(r"^:::\s+(?P<ident>[\w.]+)", re.MULTILINE)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Turn docstring roles into autorefs links, or plain code where no target exists.

    A name the page's own package documents (``run_e2e_bench`` on the ``sidecar.bench``
    page) or a dotted path from the top (``sidecar.training.train``) links to its entry;
    ``optional`` lets mkdocs-autorefs render anything else as plain code, without a warning.
    """
    directive = DIRECTIVE.search(page.markdown or "")
    base = directive.group("ident") if directive else None

    def link(m: re.Match[str]) -> str:
        name = m.group("name")
        qualified = name.startswith(("sidecar.", "model_store")) or base is None
        ident = name if qualified else f"{base}.{name}"
        title = f"<code>{name}{m.group('call') or ''}</code>"
        return f'<autoref identifier="{ident}" optional>{title}</autoref>'

    return ROLE.sub(link, html)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, png in _script("draw_figures").render().items():
        uri = f"assets/figures/{name}"
        old = files.get_file_from_path(uri)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, uri, content=png))
    return files
