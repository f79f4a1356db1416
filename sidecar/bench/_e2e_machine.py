"""Which machine, and which part of it, an end-to-end figure had: the CPU model and the
vector flags the encoder's speed turns on, the load average, each process's allowed CPUs
and CPU time, and the pinning of the broker and load generator apart from the worker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import DataError

# The flags the encoder's kernels (ONNX Runtime, torch's oneDNN) pick their code paths by.
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine as an e2e report records it.

    ``cpuinfo`` is the text of ``/proc/cpuinfo`` (read when None). ``flags`` keeps those
    of :data:`CPU_FLAGS` the first CPU has; ``cpus_allowed`` is this process's affinity,
    ``cpu_count`` the machine's logical CPUs. Missing facts are None, never an error.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first CPU's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name") or None,
        "cpu_mhz": _float(fields.get("cpu MHz")),
        "flags": [f for f in CPU_FLAGS if f in flags],
        # A virtual machine's CPUs may be hyperthreads of one host core whatever it says.
        "virtual_machine": "hypervisor" in flags,
        "threads_per_core": threads_per_core(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": allowed_cpus(os.getpid()),
    }


def threads_per_core(cpu: int = 0) -> int | None:
    """How many logical CPUs share ``cpu``'s core, as the kernel's topology says."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n or None


def _float(text: str | None) -> float | None:
    try:
        return round(float(text), 1) if text else None
    except ValueError:
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded; None where the OS has none."""
    if not hasattr(os, "getloadavg"):
        return None
    return [round(x, 2) for x in os.getloadavg()]


@dataclass(frozen=True)
class CpuPlan:
    """Where each process of the benchmark may run.

    ``load_cpus``: the broker and this process (the load generator and collector);
    ``worker_cpus``: the worker and the encoder-only child. Both None: not pinned, every
    process shares every CPU this process was allowed.
    """

    load_cpus: tuple[int, ...] | None = None
    worker_cpus: tuple[int, ...] | None = None

    @property
    def pinned(self) -> bool:
        return self.load_cpus is not None

    def describe(self) -> dict[str, Any]:
        """The plan as the report's ``placement.plan``."""
        if not self.pinned:
            return {"pinned": False, "note": "broker, load generator and worker share every CPU"}
        return {
            "pinned": True,
            "broker": list(self.load_cpus or ()),
            "load_generator": list(self.load_cpus or ()),
            "worker": list(self.worker_cpus or ()),
            "encoder_only": list(self.worker_cpus or ()),
        }


def cpu_plan(pin: bool, allowed: set[int] | None = None) -> CpuPlan:
    """Pinned: the lowest allowed CPU to the broker and the load generator, the rest to
    the worker (on 2 CPUs, 1 + 1). Not pinned: :class:`CpuPlan` with no sets.

    Raises
    ------
    DataError
        Pinning asked for, but fewer than 2 CPUs are allowed (or affinity is not
        supported here).
    """
    if not pin:
        return CpuPlan()
    if allowed is None:
        if not hasattr(os, "sched_getaffinity"):
            raise DataError("--pin needs CPU affinity (Linux sched_setaffinity)")
        allowed = os.sched_getaffinity(0)
    cpus = sorted(allowed)
    if len(cpus) < 2:
        raise DataError(f"--pin needs at least 2 CPUs to split, this process may use {cpus}")
    return CpuPlan(load_cpus=(cpus[0],), worker_cpus=tuple(cpus[1:]))


@contextlib.contextmanager
def spawning_on(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Inside, the calling thread runs on ``cpus``: a child process started here inherits
    them (every thread it ever makes, unlike pinning its pid afterwards). None: no change."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def pinned_process(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Inside, every thread of this process (and any it starts) runs on ``cpus``; after,
    each thread has its old CPUs back (new ones the main thread's). None: no change."""
    if cpus is None:
        yield
        return
    pid = os.getpid()
    before: dict[int, set[int]] = {}
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            before[tid] = os.sched_getaffinity(tid)
    pin_threads(pid, cpus)
    try:
        yield
    finally:
        main = before.get(pid) or os.sched_getaffinity(0)
        for tid in _threads(pid):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, before.get(tid, main))


def pin_threads(pid: int, cpus: set[int] | tuple[int, ...]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (threads it makes later inherit)."""
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, cpus)


def allowed_cpus(pid: int | None) -> list[int] | None:
    """The CPUs any thread of ``pid`` may run on (the union over its threads)."""
    if pid is None or not hasattr(os, "sched_getaffinity"):
        return None
    cpus: set[int] = set()
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            cpus |= os.sched_getaffinity(tid)
    return sorted(cpus) or None


def thread_count(pid: int | None) -> int | None:
    """How many threads process ``pid`` runs now."""
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


# Environment variables that size the numeric libraries' thread pools (OpenBLAS under
# numpy and scipy, OpenMP, MKL, numba): set or not, a report says which.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def thread_env() -> dict[str, str]:
    """Those of :data:`THREAD_ENV` set in this process (its children inherit them)."""
    return {k: os.environ[k] for k in THREAD_ENV if k in os.environ}


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (all its threads, not its
    children), from ``/proc/<pid>/stat``; None when it cannot be read."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields after it follow the last ')'.
    rest = stat.rsplit(")", 1)[1].split()
    utime, stime = int(rest[11]), int(rest[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def run_queue_wait_seconds(pid: int | None) -> float | None:
    """Seconds the live threads of ``pid`` have spent runnable but waiting for a CPU
    (``/proc/<pid>/task/*/schedstat``, its second field); None when not readable."""
    if pid is None:
        return None
    total, seen = 0, False
    for tid in _threads(pid):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue
        total, seen = total + int(fields[1]), True
    return total / 1e9 if seen else None


@dataclass(frozen=True)
class CpuClock:
    """CPU time and run-queue wait of the benchmark's processes, sampled around a phase.

    ``pids`` names each process (``worker``, ``broker``, ``load_generator``).
    """

    pids: Mapping[str, int | None]

    def sample(self) -> dict[str, tuple[float, float | None] | None]:
        out: dict[str, tuple[float, float | None] | None] = {}
        for name, pid in self.pids.items():
            cpu = cpu_seconds(pid)
            out[name] = None if cpu is None else (cpu, run_queue_wait_seconds(pid))
        out[MACHINE] = machine_cpu_seconds()
        return out


# The benchmark's own processes, as a CpuClock names them.
PROCESSES = ("worker", "broker", "load_generator")
# The whole machine's entry in a CpuClock sample: (busy CPU seconds, stolen seconds).
MACHINE = "machine"


def machine_cpu_seconds() -> tuple[float, float | None] | None:
    """CPU seconds every process of the machine has been busy (user, nice, system, irq,
    softirq) and the seconds the hypervisor gave this VM's CPUs to others (steal), from
    ``/proc/stat``; None when not readable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    ticks = [int(x) for x in first[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / hz, ticks[7] / hz


def cpu_usage(
    before: Mapping[str, tuple[float, float | None] | None],
    after: Mapping[str, tuple[float, float | None] | None],
    elapsed_s: float,
    queries: int,
) -> dict[str, dict[str, float | None] | None]:
    """Per process: CPU seconds in the phase, cores it kept busy (CPU seconds over the
    phase's wall time), CPU milliseconds per query, and the milliseconds per query its
    threads waited, runnable, for a CPU (a thread that ended meanwhile drops out: None
    where the sum went down)."""
    out: dict[str, dict[str, float | None] | None] = {}
    for name, b in before.items():
        a = after.get(name)
        if a is None or b is None or elapsed_s <= 0 or queries <= 0:
            out[name] = None
            continue
        if name == MACHINE:
            continue
        cpu = a[0] - b[0]
        wait = a[1] - b[1] if a[1] is not None and b[1] is not None else None
        out[name] = {
            "cpu_s": round(cpu, 3),
            "cores_busy": round(cpu / elapsed_s, 3),
            "cpu_ms_per_query": round(1000.0 * cpu / queries, 4),
            "run_queue_wait_ms_per_query": (
                round(1000.0 * wait / queries, 4) if wait is not None and wait >= 0 else None
            ),
            "cores_waiting": (
                round(wait / elapsed_s, 3) if wait is not None and wait >= 0 else None
            ),
        }
    m0, m1 = before.get(MACHINE), after.get(MACHINE)
    if m0 is not None and m1 is not None and elapsed_s > 0:
        ours = sum(float(u["cpu_s"] or 0.0) for u in out.values() if u is not None)
        steal = m1[1] - m0[1] if m1[1] is not None and m0[1] is not None else None
        # Every other process of the machine: other jobs, and this process's own children.
        out["other_processes"] = {
            "cpu_s": round(max(m1[0] - m0[0] - ours, 0.0), 3),
            "cores_busy": round(max(m1[0] - m0[0] - ours, 0.0) / elapsed_s, 3),
        }
        out["steal"] = {"cores": round(steal / elapsed_s, 3)} if steal is not None else None
    return out


def limiting_side(usage: Mapping[str, Any], plan: CpuPlan, cpus: int) -> dict[str, Any]:
    """Which side of the machine ran out of CPU first in a saturation phase.

    Pinned: the broker and the load generator share ``plan.load_cpus``, the worker has
    ``plan.worker_cpus``; each side's demand on its own CPUs (cores kept busy plus cores'
    worth of threads runnable but waiting, per CPU of the side) is compared: above 1 the
    side wanted more CPU than it had (other jobs on the machine take from either side, and
    the wait shows it where the busy share alone would not). Not pinned:
    every process shares the ``cpus`` CPUs; ``benchmark_busy_share`` is the share of them
    the benchmark's processes kept busy, ``machine_busy_share`` with every other process
    too, and ``side`` names the process with the most CPU per query.
    """

    def busy(name: str, key: str = "cores_busy") -> float:
        u = usage.get(name)
        return float(u.get(key) or 0.0) if u else 0.0

    load = busy("broker") + busy("load_generator")
    worker = busy("worker")
    if plan.pinned:
        n_load = max(len(plan.load_cpus or ()), 1)
        n_worker = max(len(plan.worker_cpus or ()), 1)
        waiting = busy("broker", "cores_waiting") + busy("load_generator", "cores_waiting")
        load_demand = (load + waiting) / n_load
        worker_demand = (worker + busy("worker", "cores_waiting")) / n_worker
        return {
            "load_side_busy_share": round(load / n_load, 3),
            "worker_busy_share": round(worker / n_worker, 3),
            "load_side_demand": round(load_demand, 3),
            "worker_demand": round(worker_demand, 3),
            "side": "broker + load generator" if load_demand >= worker_demand else "worker",
        }
    total = load + worker
    per_query = {
        name: float(usage[name]["cpu_ms_per_query"])
        for name in PROCESSES
        if usage.get(name) is not None
    }
    others = busy("other_processes")
    return {
        "benchmark_busy_share": round(total / max(cpus, 1), 3),
        "machine_busy_share": round((total + others) / max(cpus, 1), 3),
        "side": max(per_query, key=lambda k: per_query[k]) if per_query else None,
    }
