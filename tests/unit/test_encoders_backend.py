"""``load_encoder``'s backend choice, with small fakes of the project's two encoders, and
the encoder width read from a model's configs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sidecar.encoders._load as encoder_mod
import sidecar.encoders._onnx as onnx_mod
from sidecar.encoders import load_encoder
from sidecar.errors import ConfigError
from sidecar.settings import ScoringSettings


class _FakeTorch:
    backend = "torch"

    def __init__(self, name: str, **kw: Any) -> None:
        self.name, self.kw = name, kw


class _FakeOnnx:
    backend = "onnx"
    fail: Exception | None = None
    calls = 0

    def __init__(self, name: str, **kw: Any) -> None:
        type(self).calls += 1
        if self.fail is not None:
            raise self.fail
        self.name, self.kw = name, kw


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> type[_FakeOnnx]:
    monkeypatch.setattr(encoder_mod, "SentenceTransformerEncoder", _FakeTorch)
    monkeypatch.setattr(onnx_mod, "OnnxEncoder", _FakeOnnx)
    _FakeOnnx.fail, _FakeOnnx.calls = None, 0
    return _FakeOnnx


def test_auto_is_the_default_and_takes_onnx_when_it_loads(fakes: type[_FakeOnnx]) -> None:
    assert ScoringSettings().encoder_backend == "auto"
    enc = load_encoder(ScoringSettings(encoder_threads=1))
    assert enc.backend == "onnx" and fakes.calls == 1


def test_auto_falls_back_to_torch_and_says_why(
    fakes: type[_FakeOnnx], caplog: pytest.LogCaptureFixture
) -> None:
    fakes.fail = ConfigError("the onnx backend supports Transformer + Pooling pipelines")
    with caplog.at_level(logging.WARNING, logger="sidecar.encoders._encoder"):
        enc = load_encoder(ScoringSettings(encoder_threads=1))
    assert enc.backend == "torch" and fakes.calls == 1
    assert "Transformer + Pooling" in caplog.text and "running torch" in caplog.text


def test_auto_with_bfloat16_or_a_gpu_goes_straight_to_torch(fakes: type[_FakeOnnx]) -> None:
    assert load_encoder(ScoringSettings(encoder_dtype="bfloat16")).backend == "torch"
    assert load_encoder(ScoringSettings(device="cuda")).backend == "torch"
    assert fakes.calls == 0


def test_explicit_onnx_does_not_fall_back(fakes: type[_FakeOnnx]) -> None:
    fakes.fail = ConfigError("needs the onnxruntime package")
    with pytest.raises(ConfigError, match="onnxruntime"):
        load_encoder(ScoringSettings(encoder_backend="onnx"))
    with pytest.raises(ConfigError, match="float32 on the CPU"):
        load_encoder(ScoringSettings(encoder_backend="onnx", device="cuda"))
    assert load_encoder(ScoringSettings(encoder_backend="torch")).backend == "torch"


def test_the_encoder_width_is_read_from_its_configs_without_loading_it(
    tmp_path: Path, encoder_configs: Callable[[int], Path]
) -> None:
    import json

    from sidecar.encoders._encoder import encoder_dim

    assert encoder_dim("all-MiniLM-L6-v2") == 384  # the packaged default
    assert encoder_dim(str(encoder_configs(48))) == 48
    # a Dense layer after the pooling sets the width; two pooling modes concatenate
    d = encoder_configs(16)
    modules = json.loads((d / "modules.json").read_text())
    (d / "2_Dense").mkdir()
    (d / "2_Dense" / "config.json").write_text(json.dumps({"out_features": 8}))
    dense = {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (d / "modules.json").write_text(json.dumps([*modules, dense]))
    assert encoder_dim(str(d)) == 8
    (d / "modules.json").write_text(json.dumps(modules))
    pooling = {"word_embedding_dimension": 16, "pooling_mode_mean_tokens": True}
    pooling["pooling_mode_max_tokens"] = True
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert encoder_dim(str(d)) == 32
    # configs that do not say, or an encoder not on this machine: unknown, not an error
    (d / "modules.json").write_text("[{")
    assert encoder_dim(str(d)) is None
    assert encoder_dim(str(tmp_path / "elsewhere")) is None
