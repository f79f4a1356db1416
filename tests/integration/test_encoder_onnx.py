"""The ONNX Runtime encoder backend against the torch one (loads and exports the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import ConfigError
from sidecar.scoring import SentenceTransformerEncoder, load_encoder
from sidecar.settings import ScoringSettings
from sidecar.stream._demo import demo_data

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")


def test_onnx_backend_embeds_like_torch_and_exports_once(tmp_path: Path) -> None:
    sc = ScoringSettings(encoder_backend="onnx", encoder_threads=1, onnx_cache_dir=tmp_path)
    enc = load_encoder(sc)
    exported = sorted(tmp_path.glob("*.onnx"))
    assert len(exported) == 1 and exported[0].name.startswith("all-MiniLM-L6-v2-")
    stamp = exported[0].stat().st_mtime_ns

    texts = [t for t, _ in demo_data().labelled()]
    ref = SentenceTransformerEncoder(threads=1).encode(texts)
    got = enc.encode(texts, batch_size=16)
    assert got.dtype == np.float32 and got.shape == ref.shape == (len(texts), enc.dim)
    assert np.sum(ref * got, axis=1).min() > 0.99999
    assert enc.encode([]).shape == (0, enc.dim)

    again = load_encoder(sc)  # a second replica: the cached export, not a new one
    assert exported[0].stat().st_mtime_ns == stamp
    np.testing.assert_allclose(again.encode(texts[:5]), got[:5], atol=1e-6)


def test_the_default_backend_runs_onnx_on_the_packaged_model(tmp_path: Path) -> None:
    enc = load_encoder(ScoringSettings(encoder_threads=1, onnx_cache_dir=tmp_path))
    assert enc.backend == "onnx"


def test_onnx_backend_refuses_bfloat16() -> None:
    sc = ScoringSettings(encoder_backend="onnx", encoder_dtype="bfloat16")
    with pytest.raises(ConfigError, match="float32"):
        load_encoder(sc)
