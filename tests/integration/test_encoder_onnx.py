"""The ONNX Runtime encoder backend against the torch one (loads and exports the model)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sidecar.errors import ConfigError
from sidecar.scoring import SentenceTransformerEncoder, load_encoder
from sidecar.settings import ScoringSettings
from sidecar.stream._demo import demo_data


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


_RELOAD = """
import json, sys
import numpy as np
from sidecar.scoring import load_encoder
from sidecar.settings import ScoringSettings
enc = load_encoder(ScoringSettings(encoder_backend="onnx", encoder_threads=1,
                                   onnx_cache_dir=sys.argv[1]))
texts = json.loads(sys.argv[2])
print(json.dumps({"torch": "torch" in sys.modules, "backend": enc.backend,
                  "emb": enc.encode(texts).tolist()}))
"""


def test_a_checked_export_serves_without_importing_torch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sc = ScoringSettings(encoder_backend="onnx", encoder_threads=1, onnx_cache_dir=tmp_path)
    first = load_encoder(sc)  # exports and checks against torch, stores the probe reference
    refs = sorted(tmp_path.glob("*.probes-*.npy"))
    assert len(refs) == 1
    texts = [*[t for t, _ in demo_data().labelled()][:12], "word " * 600]
    want = first.encode(texts)

    out = subprocess.run(
        [sys.executable, "-c", _RELOAD, str(tmp_path), json.dumps(texts)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["backend"] == "onnx" and doc["torch"] is False
    np.testing.assert_allclose(np.asarray(doc["emb"], dtype=np.float32), want, atol=1e-6)

    # A damaged reference is not trusted: the load checks the export against torch again
    # and writes a good reference back.
    np.save(refs[0], -np.load(refs[0]), allow_pickle=False)
    with caplog.at_level(logging.WARNING, logger="sidecar.scoring._onnx"):
        again = load_encoder(sc)
    assert "checking it against torch" in caplog.text
    np.testing.assert_allclose(again.encode(texts), want, atol=1e-6)
    ok = subprocess.run(
        [sys.executable, "-c", _RELOAD, str(tmp_path), json.dumps(texts[:1])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(ok.stdout.strip().splitlines()[-1])["torch"] is False
