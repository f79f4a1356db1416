"""Run ``sidecar worker`` as a child process (for the demo, the benchmarks and the tests).

The child gets its settings through ``SIDECAR_<SECTION>__<FIELD>`` environment variables,
exactly as in production, is waited on until ``/readyz`` answers 200, and is stopped by
its pid (SIGTERM first: the worker drains its batch and commits).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import SecretStr

from sidecar.errors import BrokerError
from sidecar.settings import Settings

log = logging.getLogger(__name__)


def settings_env(settings: Settings) -> dict[str, str]:
    """Every field of ``settings`` as ``SIDECAR_<SECTION>__<FIELD>`` variables."""
    env: dict[str, str] = {}
    for section in type(settings).model_fields:
        values = getattr(settings, section)
        for name in type(values).model_fields:
            v = getattr(values, name)
            if v is None:
                continue
            if isinstance(v, SecretStr):
                v = v.get_secret_value()
            if isinstance(v, bool):
                s = "true" if v else "false"
            elif isinstance(v, tuple | list):
                s = json.dumps(list(v))
            else:
                s = str(v)
            env[f"SIDECAR_{section.upper()}__{name.upper()}"] = s
    return env


@dataclass
class WorkerProcess:
    """One ``python -m sidecar worker`` child process.

    Parameters
    ----------
    settings : Settings
        Passed to the child as environment variables (``web.port`` must be set and free).
    log_path : Path, optional
        The child's stdout and stderr; default: discarded.
    extra_env : mapping, optional
        More environment (e.g. ``OMP_NUM_THREADS``).
    """

    settings: Settings
    log_path: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    log_level: str = "INFO"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.web.port}"

    def start(self) -> WorkerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        env.update(settings_env(self.settings))
        env.update(self.extra_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        cmd = [sys.executable, "-m", "sidecar", "--log-level", self.log_level, "worker"]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.info("worker pid %s on port %s", self.proc.pid, self.settings.web.port)
        return self

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, Any]:
        """GET ``path`` on the worker's web port: (status, JSON or text)."""
        import httpx

        r = httpx.get(self.base_url + path, timeout=timeout_s)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def wait_ready(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Block until ``/readyz`` says ready; returns its document.

        Raises
        ------
        BrokerError
            The worker exited or did not become ready in time (the log tail is attached).
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise BrokerError(f"worker exited while starting:\n{self.log_tail()}")
            try:
                status, last = self.get("/readyz")
                if status == 200:
                    return dict(last)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BrokerError(f"worker not ready after {timeout_s:.0f} s: {last}\n{self.log_tail()}")

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait (the worker drains and commits), SIGKILL if it hangs; exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("worker pid %s ignored SIGTERM; killing it", self.proc.pid)
                self.proc.kill()
                self.proc.wait(timeout=10)
        code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.terminate()
