"""Reference tables generated from the code, so that the site cannot drift from it.

- :func:`settings_markdown`: every setting of the pydantic settings model, with its
  environment variable, type, default and description.
- :func:`reason_codes_markdown`: every dead-letter reason code, read from the modules that
  define a ``REASONS`` tuple (the constant's value and the comment written beside it).
- :func:`metrics_markdown`: every Prometheus metric the package creates.

``docs/hooks.py`` puts these tables into the pages at build time;
``tests/unit/test_docs_settings.py`` checks the settings table against the model. The
reason codes and metrics are read from the source text (``ast``), not imported, so that
moving a module does not break the page.
"""

from __future__ import annotations

import ast
import enum
import io
import json
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ENV_PREFIX = "SIDECAR_"
ENV_DELIMITER = "__"


@dataclass(frozen=True)
class SettingRow:
    """One leaf setting of the model."""

    path: str  # "kafka.brokers"
    env: str  # "SIDECAR_KAFKA__BROKERS"
    type: str
    default: str
    description: str
    secret: bool

    @property
    def secret_file(self) -> str:
        return self.path.replace(".", ENV_DELIMITER)


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in get_args(annotation))
    args = [a for a in get_args(annotation) if a is not type(None)]
    if origin is not None and args and len(args) < len(get_args(annotation)):
        return _type_name(args[0]) + " or none"
    if origin in (tuple, list) and args:
        return f"list of {_type_name(args[0])}"
    if isinstance(annotation, type):
        if issubclass(annotation, SecretStr):
            return "secret"
        if issubclass(annotation, Path):
            return "path"
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, tuple | list):
        return f"`{json.dumps(list(value))}`"
    mib = 1024 * 1024
    if isinstance(value, int) and value >= mib and value % mib == 0:
        return f"`{value}` ({value // mib} MiB)"
    return f"`{value}`"


def _constraints(info: FieldInfo) -> str:
    words = []
    for meta in info.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(meta, name, None)
            if bound is not None:
                words.append(f"{sign} {bound}")
    return ", ".join(words)


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def settings_rows(settings_cls: type[BaseModel]) -> Iterator[SettingRow]:
    """Every leaf setting, depth first, in the model's order."""

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> Iterator[SettingRow]:
        for name, info in model.model_fields.items():
            path = (*prefix, name)
            if _is_section(info.annotation):
                yield from walk(info.annotation, path)  # type: ignore[arg-type]
                continue
            dotted = ".".join(path)
            description = (info.description or "").strip()
            bounds = _constraints(info)
            type_name = _type_name(info.annotation)
            yield SettingRow(
                path=dotted,
                env=ENV_PREFIX + ENV_DELIMITER.join(p.upper() for p in path),
                type=f"{type_name} ({bounds})" if bounds else type_name,
                default=_default(info),
                description=description,
                secret="secret" in type_name,
            )

    yield from walk(settings_cls, ())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_markdown(settings_cls: type[BaseModel], heading_level: int = 2) -> str:
    """One table per section: setting, environment variable, type, default, description."""
    hashes = "#" * heading_level
    by_section: dict[str, list[SettingRow]] = {}
    for row in settings_rows(settings_cls):
        by_section.setdefault(row.path.split(".")[0] if "." in row.path else "", []).append(row)
    out: list[str] = []
    for section, rows in by_section.items():
        info = settings_cls.model_fields.get(section)
        doc = ""
        if info is not None and _is_section(info.annotation):
            doc = (info.annotation.__doc__ or "").strip().split("\n\n")[0]  # type: ignore[union-attr]
        out.append(f"{hashes} `{section}`" if section else f"{hashes} Top level")
        out.append("")
        if doc:
            out.append(" ".join(doc.split()))
            out.append("")
        out.append("| setting and environment variable | type | default | description |")
        out.append("|---|---|---|---|")
        for r in rows:
            desc = _cell(r.description)
            if r.secret:
                desc += f" Secret: also read from the file `{r.secret_file}`."
            name = f"`{r.path}`<br>`{r.env}`"
            cells = (name, _cell(r.type), _cell(r.default), desc.strip())
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def missing_settings(markdown: str, settings_cls: type[BaseModel]) -> list[str]:
    """Environment variables of the model that have no table row in ``markdown``."""
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    return [
        r.env
        for r in settings_rows(settings_cls)
        if not any(f"`{r.path}`" in line and f"`{r.env}`" in line for line in rows)
    ]


# ---------------------------------------------------------------------------------------
# Dead-letter reason codes


@dataclass(frozen=True)
class ReasonCode:
    code: str
    meaning: str
    module: str  # dotted module that defines it


def _comments_by_line(source: str) -> dict[int, str]:
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return comments


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def reason_codes(root: Path, package: str = "sidecar") -> list[ReasonCode]:
    """Every code listed in a module-level ``REASONS`` tuple under ``root/package``."""
    found: list[ReasonCode] = []
    for path in sorted((root / package).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "REASONS" not in source:
            continue
        tree = ast.parse(source)
        comments = _comments_by_line(source)
        lines = source.splitlines()
        constants: dict[str, tuple[str, str]] = {}
        listed: list[str] = []
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target = node.targets[0]
            if not isinstance(target, ast.Name):
                continue
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                meaning = comments.get(node.lineno, "")
                if not meaning:  # a comment block right above the constant
                    block: list[str] = []
                    line = node.lineno - 1
                    while line >= 1 and lines[line - 1].lstrip().startswith("#"):
                        block.insert(0, comments.get(line, ""))
                        line -= 1
                    meaning = " ".join(block)
                constants[target.id] = (node.value.value, meaning)
            elif target.id == "REASONS" and isinstance(node.value, ast.Tuple | ast.List):
                listed = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
        module = _module_name(path, root)
        for name in listed:
            if name in constants:
                code, meaning = constants[name]
                found.append(ReasonCode(code=code, meaning=meaning, module=module))
    return found


def reason_codes_markdown(root: Path, kind: Literal["scoring", "explain"]) -> str:
    """A table of the scoring path's codes, or of the explanation agent's (``explain_*``)."""
    rows = [r for r in reason_codes(root) if r.code.startswith("explain_") == (kind == "explain")]
    if not rows:
        raise RuntimeError(f"no {kind} dead-letter reason codes found under {root}")
    out = ["| code | cause | defined in |", "|---|---|---|"]
    for r in rows:
        meaning = r.meaning[:1].upper() + r.meaning[1:] if r.meaning else ""
        out.append(f"| `{r.code}` | {_cell(meaning)} | `{r.module}` |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Prometheus metrics


@dataclass(frozen=True)
class Metric:
    name: str  # as exposed (a counter gets _total)
    kind: str
    labels: tuple[str, ...]
    help: str
    module: str


_METRIC_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}


def metrics(root: Path, package: str = "sidecar") -> list[Metric]:
    """Every ``Counter`` / ``Gauge`` / ``Histogram`` created with literal arguments."""
    found: list[Metric] = []
    for path in sorted((root / package).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "prometheus_client" not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            kind = _METRIC_KINDS.get(node.func.id)
            if kind is None or len(node.args) < 2:
                continue
            name_node, help_node = node.args[0], node.args[1]
            if not (isinstance(name_node, ast.Constant) and isinstance(help_node, ast.Constant)):
                continue
            labels: tuple[str, ...] = ()
            label_node = node.args[2] if len(node.args) > 2 else None
            for kw in node.keywords:
                if kw.arg == "labelnames":
                    label_node = kw.value
            if isinstance(label_node, ast.List | ast.Tuple):
                labels = tuple(e.value for e in label_node.elts if isinstance(e, ast.Constant))
            name = str(name_node.value)
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"
            found.append(Metric(name, kind, labels, str(help_node.value), _module_name(path, root)))
    return found


def metrics_markdown(root: Path) -> str:
    rows = metrics(root)
    if not rows:
        raise RuntimeError(f"no Prometheus metrics found under {root}")
    out = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in rows:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        out.append(f"| `{m.name}` | {m.kind} | {labels} | {_cell(m.help)} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Message schemas: the docstrings of the modules that define the records


def _inline(line: str) -> str:
    line = line.replace("``", "`")
    for role in (":data:", ":func:", ":class:", ":meth:"):
        line = line.replace(role, "")
    return line.replace("`~", "`")


def _rst_to_markdown(doc: str) -> str:
    """The little reStructuredText the module docstrings use, as Markdown."""
    out: list[str] = []
    lines = doc.strip().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.endswith("::"):
            out.append(_inline(line))
            continue
        if line.strip() != "::":
            out.append(_inline(line[:-2].rstrip() + ":"))
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            block.append(lines[i][4:])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        while block and not block[0].strip():
            block.pop(0)
        out += ["", "```text", *block, "```", ""]
    return "\n".join(out)


def message_schemas_markdown(root: Path, kind: Literal["scoring", "explain"]) -> str:
    """The docstring of the module whose ``REASONS`` are the scoring path's (or the
    explanation agent's), which describes the records it reads and writes."""
    modules = {r.module for r in reason_codes(root) if r.code.startswith("explain_") == (
        kind == "explain")}  # fmt: skip
    if len(modules) != 1:
        raise RuntimeError(f"expected one module with the {kind} reason codes, got {modules}")
    module = modules.pop()
    path = root / Path(*module.split("."))
    source_path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(source_path.read_text(encoding="utf-8"))) or ""
    # The first line is the module's summary; the page has its own heading.
    body = doc.split("\n", 1)[1] if "\n" in doc else ""
    return _rst_to_markdown(body) + f"\n\n*From the docstring of `{module}`.*\n"
