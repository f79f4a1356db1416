"""Fixtures that render the Helm chart through helm-python-sdk (Helm's Go engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _chart_render import CHART_DIR, NAMESPACE, RELEASE, Manifests, parse_manifests

Render = Callable[..., Manifests]


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    helm_python = pytest.importorskip("helm_python")
    with helm_python.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render_raw(chart: Any) -> Callable[..., dict[str, str]]:
    def _render(values: dict[str, Any] | None = None) -> dict[str, str]:
        rendered: dict[str, str] = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        return rendered

    return _render


@pytest.fixture(scope="session")
def render(render_raw: Callable[..., dict[str, str]]) -> Render:
    def _render(values: dict[str, Any] | None = None) -> Manifests:
        return parse_manifests(render_raw(values))

    return _render
