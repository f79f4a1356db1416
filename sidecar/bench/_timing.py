"""Timing and machine facts shared by ``sidecar bench detectors``: medians of auto-sized
loops, and what the machine is (its CPU's vector extension and LLVM target move the
compiled scans' figures, its load average every figure)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def timeit(fn: Callable[[], Any], *, repeats: int, min_time: float = 0.02) -> float:
    """Median seconds per call over ``repeats`` runs of an auto-sized loop."""
    fn()  # warm-up
    loops, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time or loops >= 1 << 16:
            break
        loops *= 4 if t < min_time / 8 else 2
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        runs.append((time.perf_counter() - t0) / loops)
    return float(np.median(runs))


def us_per_query(
    fn: Callable[[np.ndarray], Any], X: np.ndarray, repeats: int, min_time: float
) -> float:
    return 1e6 * timeit(lambda: fn(X), repeats=repeats, min_time=min_time) / X.shape[0]


def cpu_facts() -> dict[str, Any]:
    """The CPU's model name and widest vector extension, where /proc/cpuinfo tells, and
    the CPU LLVM compiles for (the compiled L-inf scans' speed turns on them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first CPU's block is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    vector = next((f for f in ("avx512f", "avx2", "sse4_2") if f in flags), None)
    import llvmlite.binding

    # What numba compiles for: the host CPU unless NUMBA_CPU_NAME names another.
    cpu_name = os.environ.get("NUMBA_CPU_NAME") or None
    facts = {
        "cpu_model": fields.get("model name") or None,
        "vector_isa": vector,
        "llvm_cpu": cpu_name or llvmlite.binding.get_host_cpu_name(),
    }
    if cpu_name:
        # Unset, numba keeps the host's features (AVX-512 included) whatever the name.
        facts["llvm_cpu_features"] = os.environ.get("NUMBA_CPU_FEATURES", "host")
    return facts


def machine_facts() -> dict[str, Any]:
    import scipy
    import sklearn

    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_facts(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit_learn": sklearn.__version__,
        "load_average_1m_at_start": load[0],
    }
