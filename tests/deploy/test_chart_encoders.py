"""The chart's encoder choice and language settings reach the worker as settings it loads;
the schema refuses an encoder that is neither packaged nor a path."""

from __future__ import annotations

from typing import Any

import pytest
from _chart_render import RELEASE

from sidecar.encoders import encoder_names
from sidecar.settings import ScoringSettings, load_settings

pytestmark = pytest.mark.deploy
FULLNAME = f"{RELEASE}-ood-sidecar"


def _env(render: Any, scoring: dict[str, Any] | None) -> dict[str, str]:
    values = None if scoring is None else {"scoring": scoring}
    data: dict[str, str] = render(values)[("ConfigMap", f"{FULLNAME}-env")]["data"]
    return data


@pytest.mark.parametrize("name", encoder_names())
def test_every_packaged_encoder_renders_and_loads_as_a_setting(
    render: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(render, {"encoder": name, "languages": ["en", "nl"]})
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings().scoring
    assert settings.encoder == name and settings.languages == ("en", "nl")
    assert settings.detect_language is True


def test_language_detection_defaults_on_and_can_be_switched_off(render: Any) -> None:
    env = _env(render, None)
    assert env["SIDECAR_SCORING__LANGUAGES"] == "[]"
    off = _env(render, {"detectLanguage": False})["SIDECAR_SCORING__DETECT_LANGUAGE"]
    assert ScoringSettings(detect_language=off).detect_language is False


@pytest.mark.parametrize(
    "scoring",
    [{"encoder": "use-multilingual"}, {"encoder": ""}, {"languages": ["Dutch"]}],
)
def test_the_schema_refuses_an_unknown_encoder_or_language(
    render_raw: Any, scoring: dict[str, Any]
) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="scoring"):
        render_raw({"scoring": scoring})


def test_a_local_encoder_directory_is_still_accepted(render: Any) -> None:
    assert _env(render, {"encoder": "/models/my-encoder"})["SIDECAR_SCORING__ENCODER"] == (
        "/models/my-encoder"
    )


@pytest.mark.parametrize("fallback", [None, "dead_letter", "encode"])
def test_the_embedding_fallback_reaches_the_workers_settings(
    render: Any, fallback: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(render, None if fallback is None else {"embeddingFallback": fallback})
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_settings().scoring.embedding_fallback == (fallback or "dead_letter")


def test_the_schema_refuses_an_unknown_embedding_fallback(render_raw: Any) -> None:
    helm_python = pytest.importorskip("helm_python")
    with pytest.raises(helm_python.HelmError, match="embeddingFallback"):
        render_raw({"scoring": {"embeddingFallback": "skip"}})
