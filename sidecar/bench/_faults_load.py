"""The fault benchmark's query producer: a separate process that sends a steady stream.

Run as ``python -m sidecar.bench._faults_load CONFIG`` (CONFIG a JSON object: ``bootstrap``,
``topic``, ``kb``, ``rate``, ``prefix``, ``out``, ``poison_marker``). It sends ``rate``
queries a second, each with a unique id, and appends one JSON line per query to ``out``
once the broker has answered for it: ``id``, ``t_send`` (s, when it was handed to the
producer), ``t_ack`` (when the broker acknowledged it, None when it did not),
``partition``, ``offset``, ``poison`` and ``error``. Commands arrive on stdin, one JSON
object a line: ``{"op": "go"}`` starts the stream (the process connects first, so it can
be started while the workers load); ``{"op": "burst", "n": N, "poison_at": [i, ...]}``
sends N queries at once (those at the given positions carry the poison marker);
``{"op": "stop"}`` stops sending, waits for the outstanding acknowledgements (at most
``drain_s``) and exits 0.

Every send is its own task, so a broker that does not answer delays nothing but its own
acknowledgements: the stream stays steady through an outage, as a real front end's would.
:class:`LoadProcess` starts and commands it from the benchmark.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

CLIENT_ID = "faults-load"  # the Kafka proxy of the benchmark never stalls this client


def _texts() -> list[str]:
    from sidecar.local import demo_data

    return [t for t, _ in demo_data().labelled()]


class _Sender:
    """Sends queries and writes one line per acknowledgement (or failure)."""

    def __init__(self, producer: Any, cfg: dict[str, Any], out: IO[str]) -> None:
        self.producer, self.cfg, self.out = producer, cfg, out
        self.texts = _texts()
        self.pending: set[asyncio.Task[None]] = set()
        self.n = 0

    def send(self, kind: str, poison: bool = False) -> None:
        i = self.n
        self.n += 1
        qid = f"{self.cfg['prefix']}-{kind}{i:06d}"
        text = self.texts[i % len(self.texts)]
        if poison:
            text = f"{text} {self.cfg['poison_marker']}"
        task = asyncio.ensure_future(self._one(qid, text, poison))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _one(self, qid: str, text: str, poison: bool) -> None:
        t_send = time.time()
        doc = {"id": qid, "kb": self.cfg["kb"], "text": text, "ts": int(t_send * 1000)}
        row: dict[str, Any] = {"id": qid, "t_send": t_send, "poison": poison}
        try:
            fut = await self.producer.send(
                self.cfg["topic"], json.dumps(doc).encode(), key=qid.encode()
            )
            md = await fut
            row.update(t_ack=time.time(), partition=md.partition, offset=md.offset, error=None)
        except Exception as exc:  # not sent: the broker never acknowledged it
            row.update(t_ack=None, partition=None, offset=None, error=f"{type(exc).__name__}")
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()


def _read_commands(loop: asyncio.AbstractEventLoop, q: asyncio.Queue[dict[str, Any]]) -> None:
    for line in sys.stdin:
        if line.strip():
            loop.call_soon_threadsafe(q.put_nowait, json.loads(line))
    loop.call_soon_threadsafe(q.put_nowait, {"op": "stop"})


async def _main(cfg: dict[str, Any]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=cfg["bootstrap"],
        client_id=CLIENT_ID,
        linger_ms=0,
        acks="all",
        request_timeout_ms=int(cfg.get("request_timeout_s", 40.0) * 1000),
    )
    await producer.start()
    commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_read_commands, args=(loop, commands), daemon=True).start()
    with open(cfg["out"], "a", encoding="utf-8") as out:
        s = _Sender(producer, cfg, out)
        while (await commands.get())["op"] != "go":  # connected; the stream starts on "go"
            pass
        rate, t0, k = float(cfg["rate"]), time.monotonic(), 0
        while True:
            wait = t0 + k / rate - time.monotonic() if rate > 0 else 0.5
            try:
                cmd = await asyncio.wait_for(commands.get(), max(wait, 0.0))
            except TimeoutError:
                s.send("s")
                k += 1
                continue
            if cmd["op"] == "stop":
                break
            if cmd["op"] == "burst":
                marked = set(cmd.get("poison_at", ()))
                for j in range(int(cmd["n"])):
                    s.send("p" if j in marked else "b", poison=j in marked)
        if s.pending:
            await asyncio.wait(set(s.pending), timeout=float(cfg.get("drain_s", 60.0)))
        for task in list(s.pending):
            task.cancel()
    await producer.stop()


class LoadProcess:
    """The producer process, seen from the benchmark: start, burst, stop, read back."""

    def __init__(self, cfg: dict[str, Any], log_path: Path) -> None:
        self.cfg = cfg
        self.out = Path(cfg["out"])
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> LoadProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar.bench._faults_load", json.dumps(self.cfg)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    async def go(self, timeout_s: float = 60.0) -> None:
        """Start the stream; return once the broker has acknowledged the first query."""
        self.command(op="go")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.out.exists() and self.out.stat().st_size > 0:
                return
            if self.proc is None or self.proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the query producer did not start; see {self.log_path}")

    def command(self, **cmd: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def burst(self, n: int, poison_at: tuple[int, ...] = ()) -> None:
        self.command(op="burst", n=n, poison_at=list(poison_at))

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """Stop sending, wait for the acknowledgements; kill by pid if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.command(op="stop")
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout_s)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def records(self) -> list[dict[str, Any]]:
        """Every line written so far (one per query the producer finished with)."""
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a kill
                continue
        return rows


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
