"""The ONNX Runtime encoder backend against the torch one (loads and exports the model)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sidecar.encoders import SentenceTransformerEncoder, load_encoder
from sidecar.errors import ConfigError
from sidecar.local._demo import demo_data
from sidecar.settings import ScoringSettings


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
from sidecar.encoders import load_encoder
from sidecar.settings import ScoringSettings
prebuilt = sys.argv[3] if len(sys.argv) > 3 else None
enc = load_encoder(ScoringSettings(encoder_backend="onnx", encoder_threads=1,
                                   onnx_cache_dir=sys.argv[1], onnx_prebuilt_dir=prebuilt))
texts = json.loads(sys.argv[2])
print(json.dumps({"torch": "torch" in sys.modules, "backend": enc.backend,
                  "export": str(enc.export_path), "emb": enc.encode(texts).tolist()}))
"""


def _reload(cache: Path, texts: list[str], prebuilt: Path | None = None) -> tuple[dict, str]:
    """Load the encoder in a fresh interpreter: (what it reports, its stderr)."""
    args = [sys.executable, "-c", _RELOAD, str(cache), json.dumps(texts)]
    out = subprocess.run(
        args + ([str(prebuilt)] if prebuilt else []),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_checked_export_serves_without_importing_torch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sc = ScoringSettings(encoder_backend="onnx", encoder_threads=1, onnx_cache_dir=tmp_path)
    first = load_encoder(sc)  # exports and checks against torch, stores the probe reference
    refs = sorted(tmp_path.glob("*.probes-*.npy"))
    assert len(refs) == 1
    texts = [*[t for t, _ in demo_data().labelled()][:12], "word " * 600]
    want = first.encode(texts)

    doc, _ = _reload(tmp_path, texts)
    assert doc["backend"] == "onnx" and doc["torch"] is False
    np.testing.assert_allclose(np.asarray(doc["emb"], dtype=np.float32), want, atol=1e-6)

    # A damaged reference is not trusted: the load checks the export against torch again
    # and writes a good reference back.
    np.save(refs[0], -np.load(refs[0]), allow_pickle=False)
    with caplog.at_level(logging.WARNING, logger="sidecar.encoders._onnx"):
        again = load_encoder(sc)
    assert "checking it against torch" in caplog.text
    np.testing.assert_allclose(again.encode(texts), want, atol=1e-6)
    assert _reload(tmp_path, texts[:1])[0]["torch"] is False


def test_a_prepared_export_serves_from_its_own_directory_without_writing(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from sidecar.cli import main

    pre, cache = tmp_path / "prebuilt", tmp_path / "cache"
    res = CliRunner().invoke(main, ["prepare-encoder", "--dir", str(pre)])
    assert res.exit_code == 0, res.output
    files = sorted(pre.iterdir())
    assert [f.suffix for f in files] == [".onnx", ".npy"]
    # the export and the probe reference it was checked against, by name
    assert files[0].name in res.output and files[1].name in res.output
    # readable by the worker's uid when made by another (the image is built as root)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in files)
    before = {f.name: (f.stat().st_mtime_ns, f.stat().st_size) for f in files}
    texts = [t for t, _ in demo_data().labelled()][:8]
    want = SentenceTransformerEncoder(threads=1).encode(texts)

    doc, _ = _reload(cache, texts, prebuilt=pre)
    assert doc["backend"] == "onnx" and doc["torch"] is False
    assert Path(doc["export"]).parent == pre
    assert np.sum(np.asarray(doc["emb"]) * want, axis=1).min() > 0.99999
    assert not cache.exists()  # nothing exported, nothing written
    assert {f.name: (f.stat().st_mtime_ns, f.stat().st_size) for f in pre.iterdir()} == before

    # A prebuilt export that does not check out is passed over for the cache.
    bad = tmp_path / "bad"
    shutil.copytree(pre, bad)
    ref = next(bad.glob("*.npy"))
    np.save(ref, -np.load(ref), allow_pickle=False)
    doc, err = _reload(pre, texts, prebuilt=bad)
    assert "trying the cache" in err
    assert doc["torch"] is False and Path(doc["export"]).parent == pre


_ORT_SESSION = """
import sidecar  # noqa: F401  (first, as in every entry point of the product)
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
assert sess.run(None, {"x": np.ones(1, np.float32)})[0][0] == 1.0
"""


def _ort_state_after_a_session(home: Path, opt_out: str | None) -> list[str]:
    """Files onnxruntime leaves under ``home`` after one session in a fresh process."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")
    }
    env["HOME"] = str(home)
    if opt_out is not None:
        env["ORT_DISABLE_TELEMETRY"] = opt_out
    home.mkdir()
    subprocess.run([sys.executable, "-c", _ORT_SESSION], env=env, check=True, timeout=120)
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def test_onnx_runtime_telemetry_is_off_unless_the_operator_turns_it_on(tmp_path: Path) -> None:
    allowed = _ort_state_after_a_session(tmp_path / "allowed", opt_out="0")
    if not allowed:
        pytest.skip("this onnxruntime build keeps no telemetry state: nothing to switch off")
    # e.g. .cache/Microsoft/DeveloperTools/.onnxruntime/deviceid and its event cache
    assert any("Microsoft" in p for p in allowed), allowed
    assert _ort_state_after_a_session(tmp_path / "default", opt_out=None) == []
