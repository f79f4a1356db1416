"""The settings reference page lists every setting of the settings model.

The page (docs/reference/settings.md) is filled at build time from
docs/scripts/reference_tables.py; these tests fail when a setting is missing from the
generated table, has no description, or when the page no longer asks for the table.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "settings.md"
TABLES = REPO / "docs" / "scripts" / "reference_tables.py"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_tables", TABLES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_tables", module)
    spec.loader.exec_module(module)
    return module


def _leaf_settings(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[str]:
    """Every leaf setting as its environment variable, walked independently of the page
    generator."""
    names: list[str] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += _leaf_settings(annotation, (*prefix, name))
        else:
            names.append("SIDECAR_" + "__".join(p.upper() for p in (*prefix, name)))
    return names


def test_the_page_asks_for_the_generated_table() -> None:
    assert "<!-- generated: settings -->" in PAGE.read_text(encoding="utf-8")


def test_every_setting_has_a_row_with_its_variable_and_default(tables: ModuleType) -> None:
    markdown = tables.settings_markdown(Settings)
    expected = _leaf_settings(Settings)
    assert len(expected) > 40  # the walk found the sections
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    missing = [env for env in expected if not any(f"`{env}`" in row for row in rows)]
    assert missing == [], f"settings missing from the reference page: {missing}"
    assert tables.missing_settings(markdown, Settings) == []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4, row
        assert cells[2], f"no default shown: {row}"


def test_every_setting_is_described(tables: ModuleType) -> None:
    undescribed = [r.path for r in tables.settings_rows(Settings) if not r.description]
    assert undescribed == [], (
        "settings without a description: give them Field(description=...) in "
        f"sidecar/settings/: {undescribed}"
    )


def test_defaults_and_secrets_are_shown(tables: ModuleType) -> None:
    rows = {r.env: r for r in tables.settings_rows(Settings)}
    assert rows["SIDECAR_KAFKA__BROKERS"].default == "`kafka://127.0.0.1:9092`"
    assert rows["SIDECAR_SCORING__KBS"].default == '`["default"]`'
    assert rows["SIDECAR_STORE__HMAC_KEY"].secret
    assert rows["SIDECAR_STORE__HMAC_KEY"].secret_file == "store__hmac_key"
    assert not rows["SIDECAR_WEB__PORT"].secret


def test_a_setting_left_off_the_page_is_reported(tables: ModuleType) -> None:
    class Extra(BaseModel):
        """A section the page was generated without."""

        knob: int = Field(3, description="a new knob")

    class Grown(Settings):
        extra: Extra = Extra()

    page_before = tables.settings_markdown(Settings)
    assert tables.missing_settings(page_before, Grown) == ["SIDECAR_EXTRA__KNOB"]
    assert tables.missing_settings(tables.settings_markdown(Grown), Grown) == []
