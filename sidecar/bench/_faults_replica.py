"""A worker slot of the fault benchmark: the ``sidecar worker`` process in it (or the
benchmark's poisoned variant), SIGKILL by pid, and every start and exit it went through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.local import WorkerProcess, settings_env


class BenchWorker(WorkerProcess):
    """:class:`WorkerProcess` with the benchmark's entry point where a scenario needs one
    (the poison encoder, :mod:`sidecar.bench._faults_worker`); else ``sidecar worker``."""

    poison_marker: str | None = None

    def start(self) -> BenchWorker:
        if self.poison_marker is None:
            super().start()
            return self
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        env.update(settings_env(self.settings))
        env.update(self.extra_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        assert self.log_path is not None
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in terminate()/kill()
        cmd = [sys.executable, "-m", "sidecar.bench._faults_worker"]
        cmd += ["--log-level", self.log_level, "--poison-marker", self.poison_marker]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self


@dataclass
class Replica:
    """One worker slot: the process now in it, and every start and exit it went through."""

    name: str
    settings: Any
    log_path: Path
    poison_marker: str | None = None
    restart: bool = True  # the supervisor restarts the worker when it exits
    restart_delay_s: float = 1.0
    worker: BenchWorker | None = None
    starts: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    _stopping: bool = False
    _restart_at: float | None = None

    def spawn(self) -> None:
        w = BenchWorker(
            self.settings,
            log_path=self.log_path,
            extra_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
        w.poison_marker = self.poison_marker
        self.worker = w.start()
        self.starts.append({"t": time.time(), "pid": w.pid})

    @property
    def pid(self) -> int | None:
        return self.worker.pid if self.worker else None

    def alive(self) -> bool:
        return bool(self.worker and self.worker.proc and self.worker.proc.poll() is None)

    def sigkill(self) -> float:
        """SIGKILL the worker now (by pid); returns when it was sent."""
        assert self.worker is not None and self.worker.proc is not None
        t = time.time()
        os.kill(self.worker.proc.pid, signal.SIGKILL)
        return t

    def get(self, path: str, timeout_s: float = 1.0) -> tuple[int, Any]:
        assert self.worker is not None
        return self.worker.get(path, timeout_s)
