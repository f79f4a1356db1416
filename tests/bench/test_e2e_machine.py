"""The e2e bench's machine facts and CPU placement: what the report says about the CPU,
which CPUs each process may use, CPU time, and the embeddings path's record encoding."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sidecar.bench._e2e_machine import (
    CPU_FLAGS,
    CpuClock,
    CpuPlan,
    allowed_cpus,
    cpu_info,
    cpu_plan,
    cpu_seconds,
    cpu_usage,
    limiting_side,
    pinned_process,
    spawning_on,
)
from sidecar.errors import DataError

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
cpu MHz\t\t: 2699.998
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni amx_tile amx_bf16 xsave

processor\t: 1
model name\t: Some Other CPU
flags\t\t: fpu
"""

two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 CPUs this process may use",
)


def test_cpu_info_reads_the_first_cpu_and_keeps_the_relevant_flags_in_order() -> None:
    info = cpu_info(CPUINFO)
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert info["cpu_mhz"] == 2700.0
    assert info["flags"] == [
        "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
        "amx_tile", "amx_bf16",
    ]  # fmt: skip
    assert "fpu" not in info["flags"] and "xsave" not in info["flags"]
    assert info["virtual_machine"] is False
    assert cpu_info(CPUINFO.replace("xsave", "xsave hypervisor"))["virtual_machine"] is True
    assert info["cpu_count"] == os.cpu_count()
    assert info["cpus_allowed"] == sorted(os.sched_getaffinity(0))


def test_cpu_info_of_an_unreadable_or_foreign_cpuinfo_is_empty_not_an_error() -> None:
    info = cpu_info("")
    assert info["cpu_model"] is None and info["cpu_mhz"] is None and info["flags"] == []
    assert cpu_info("model name : X\ncpu MHz : n/a\n")["cpu_mhz"] is None


def test_this_machine_s_flags_are_a_subset_of_the_known_ones() -> None:
    info = cpu_info()
    assert set(info["flags"]) <= set(CPU_FLAGS)
    if Path("/proc/cpuinfo").exists():
        assert info["cpu_model"]


def test_the_plan_splits_the_lowest_cpu_from_the_rest() -> None:
    assert cpu_plan(False) == CpuPlan() and not CpuPlan().pinned
    assert cpu_plan(False).describe()["pinned"] is False
    two = cpu_plan(True, {1, 0})
    assert two.load_cpus == (0,) and two.worker_cpus == (1,) and two.pinned
    assert two.describe() == {
        "pinned": True,
        "broker": [0],
        "load_generator": [0],
        "worker": [1],
        "encoder_only": [1],
    }
    four = cpu_plan(True, {7, 3, 5, 4})
    assert four.load_cpus == (3,) and four.worker_cpus == (4, 5, 7)
    with pytest.raises(DataError, match="at least 2 CPUs"):
        cpu_plan(True, {0})


@two_cpus
def test_a_child_started_on_cpus_has_them_and_the_caller_keeps_its_own() -> None:
    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    with spawning_on((cpu,)):
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.stdout.strip() == str([cpu])
    assert os.sched_getaffinity(0) == mine
    with spawning_on(None):
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.stdout.strip() == str(sorted(mine))


@two_cpus
def test_pinning_this_process_pins_every_thread_and_gives_them_back() -> None:
    import threading

    mine = sorted(os.sched_getaffinity(0))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with pinned_process((mine[0],)):
            assert allowed_cpus(os.getpid()) == [mine[0]]
            assert os.sched_getaffinity(t.native_id) == {mine[0]}  # type: ignore[arg-type]
        assert allowed_cpus(os.getpid()) == mine
        assert os.sched_getaffinity(t.native_id) == set(mine)  # type: ignore[arg-type]
    finally:
        stop.set()
        t.join()


def test_cpu_seconds_grow_with_work_and_a_gone_process_has_none() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    x = 0
    for i in range(3_000_000):
        x += i
    after = cpu_seconds(os.getpid())
    assert after is not None and after > before
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert cpu_seconds(dead.pid) is None and cpu_seconds(None) is None
    sample = CpuClock({"me": os.getpid(), "dead": dead.pid}).sample()
    assert sample["dead"] is None and sample["me"] is not None and sample["me"][0] >= after


def test_cpu_usage_is_per_query_and_per_wall_second() -> None:
    u = cpu_usage(
        {"worker": (1.0, 0.5), "broker": (2.0, 1.0), "gen": (0.0, None), "gone": None},
        {"worker": (3.0, 1.5), "broker": (2.5, 0.9), "gen": (0.4, 0.1)},
        elapsed_s=4.0,
        queries=1000,
    )
    assert u["worker"] == {
        "cpu_s": 2.0, "cores_busy": 0.5, "cpu_ms_per_query": 2.0,
        "run_queue_wait_ms_per_query": 1.0, "cores_waiting": 0.25,
    }  # fmt: skip
    assert u["broker"] == {  # a thread that ended took its wait with it: no figure
        "cpu_s": 0.5, "cores_busy": 0.125, "cpu_ms_per_query": 0.5,
        "run_queue_wait_ms_per_query": None, "cores_waiting": None,
    }  # fmt: skip
    assert u["gen"] is not None and u["gen"]["run_queue_wait_ms_per_query"] is None
    assert u["gone"] is None
    assert "other_processes" not in u  # no whole-machine sample, no figure for the others


def test_the_other_processes_are_the_machine_less_the_benchmark() -> None:
    from sidecar.bench._e2e_machine import MACHINE, machine_cpu_seconds

    u = cpu_usage(
        {"worker": (1.0, 0.0), "broker": (0.0, 0.0), MACHINE: (10.0, 1.0)},
        {"worker": (3.0, 0.0), "broker": (1.0, 0.0), MACHINE: (17.0, 1.4)},
        elapsed_s=4.0,
        queries=100,
    )
    assert u["other_processes"] == {"cpu_s": 4.0, "cores_busy": 1.0}
    assert u["steal"] == {"cores": 0.1}
    assert MACHINE not in u
    now = machine_cpu_seconds()
    if Path("/proc/stat").exists():
        assert now is not None and now[0] > 0.0


def test_two_busy_processes_on_one_cpu_wait_in_the_run_queue() -> None:
    import time

    from sidecar.bench._e2e_machine import run_queue_wait_seconds

    if run_queue_wait_seconds(os.getpid()) is None:
        pytest.skip("no schedstat here")
    assert run_queue_wait_seconds(None) is None
    spin = [sys.executable, "-c", "while True: pass"]
    with spawning_on((min(os.sched_getaffinity(0)),)):
        procs = [subprocess.Popen(spin) for _ in range(2)]
    try:
        time.sleep(1.0)
        waits = [run_queue_wait_seconds(p.pid) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(w is not None and w > 0.05 for w in waits), waits


def test_the_limit_is_the_side_that_ran_out_of_cpu() -> None:
    def use(worker: float, broker: float, gen: float) -> dict[str, dict[str, float]]:
        return {
            n: {"cores_busy": b, "cpu_ms_per_query": b} for n, b in
            (("worker", worker), ("broker", broker), ("load_generator", gen))
        }  # fmt: skip

    pinned = cpu_plan(True, {0, 1})
    side = limiting_side(use(0.4, 0.6, 0.38), pinned, 2)
    assert side == {
        "load_side_busy_share": 0.98,
        "worker_busy_share": 0.4,
        "load_side_demand": 0.98,
        "worker_demand": 0.4,
        "side": "broker + load generator",
    }
    assert limiting_side(use(0.99, 0.2, 0.1), pinned, 2)["side"] == "worker"
    # Another job took half the worker's CPU: busy 0.5, but it waited as long as it ran.
    starved = use(0.5, 0.3, 0.2)
    starved["worker"]["cores_waiting"] = 0.6
    side = limiting_side(starved, pinned, 2)
    assert side["worker_busy_share"] == 0.5 and side["worker_demand"] == 1.1
    assert side["side"] == "worker"
    shared_use: dict[str, Any] = {**use(0.9, 0.5, 0.4), "other_processes": {"cores_busy": 1.0}}
    shared = limiting_side(shared_use, CpuPlan(), 2)
    assert shared == {"benchmark_busy_share": 0.9, "machine_busy_share": 1.4, "side": "worker"}


def test_the_embedding_travels_as_base64_of_little_endian_float32() -> None:
    from sidecar.bench._e2e_embeddings import embedding_b64

    v = np.array([1.0, -0.5, 3.25e-8, 0.0], dtype=np.float64)
    raw = base64.b64decode(embedding_b64(v))
    assert len(raw) == 16
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), v.astype(np.float32))
    assert raw[:4] == b"\x00\x00\x80\x3f"  # 1.0f, little-endian


def test_thread_counts_and_the_thread_pool_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from sidecar.bench._e2e_machine import thread_count, thread_env

    before = thread_count(os.getpid())
    assert before is not None and before >= 1
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert thread_count(os.getpid()) == before + 1
    finally:
        stop.set()
        t.join()
    assert thread_count(None) is None
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = thread_env()
    assert env["OPENBLAS_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in env
