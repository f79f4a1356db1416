"""TCP proxies the fault benchmark puts between a worker and a real server, to cut it off.

:class:`TcpProxy` forwards 127.0.0.1:``port`` to a server's port on a thread of its own.
``cut()`` closes every connection through it and refuses new ones (the server looks
gone to whoever uses the proxy, and stays up for everyone else); ``restore()`` listens
again on the same port. With ``kafka_stall`` set it also reads the Kafka request frames
that pass from the clients to the broker and, while :meth:`hold` says so, holds a
connection from its first matching request on (that request and everything after it on
that connection, so the order the broker sees is kept) until the hold ends. ``produce``
holds Produce requests: the verdicts cannot be delivered, as when a producer's buffer
is full or a topic's leader is unreachable, while fetches, heart-beats and commits
still pass. ``all`` holds every request: a broker that is back but not yet open to its
clients (the benchmark creates its topics first). Clients whose ``client_id`` starts
with ``exempt_prefix`` (the benchmark's own) are never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from typing import Any

_PRODUCE_API_KEY = 0


class TcpProxy:
    """A cuttable TCP forwarder ``127.0.0.1:port -> 127.0.0.1:target_port``."""

    def __init__(
        self, port: int, target_port: int, *, kafka_stall: bool = False, exempt_prefix: str = ""
    ) -> None:
        self.port, self.target_port = port, target_port
        self.kafka_stall, self.exempt_prefix = kafka_stall, exempt_prefix
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._released: asyncio.Event | None = None  # set: nothing is held
        self._mode = "produce"  # what is held while _released is clear
        self._exempt = exempt_prefix  # whose requests pass during the hold
        self.held_requests = 0

    # -- control, from any thread -----------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        """Close every connection and refuse new ones."""
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def stall_produce(self, on: bool) -> None:
        """Hold (on) or release (off) the Kafka Produce requests of non-exempt clients."""
        self.hold("produce" if on else None)

    def hold(self, mode: str | None, exempt: str | None = None) -> None:
        """Hold the non-exempt clients' ``produce`` requests, ``all`` of them, or none;
        ``exempt`` narrows who passes for this hold (default: ``exempt_prefix``)."""

        async def flip() -> None:
            if self._released is None:
                self._released = asyncio.Event()
            if mode is None:
                self._released.set()
            else:
                self._mode = mode
                self._exempt = exempt or self.exempt_prefix
                self._released.clear()

        self._call(flip())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._cut(), timeout=5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # -- on the proxy's loop ----------------------------------------------------------------

    async def _listen(self) -> None:
        if self._released is None:
            self._released = asyncio.Event()
            self._released.set()
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            c_writer.transport.abort()
            return
        self._writers.update((c_writer, s_writer))
        up = self._frames if self.kafka_stall else self._pipe
        tasks = [
            asyncio.ensure_future(up(c_reader, s_writer)),
            asyncio.ensure_future(self._pipe(s_reader, c_writer)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (c_writer, s_writer):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client -> broker, one Kafka request at a time, holding Produce while stalled."""
        assert self._released is not None
        with contextlib.suppress(Exception):
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", size)[0])
                if not self._released.is_set() and _held(body, self._exempt, self._mode):
                    self.held_requests += 1
                    await self._released.wait()
                writer.write(size + body)
                await writer.drain()


def _held(body: bytes, exempt_prefix: str, mode: str = "produce") -> bool:
    """Whether a request is held: from a client that is not exempt, and a Produce (mode
    ``produce``) or any request (mode ``all``).

    The request header: api_key int16, api_version int16, correlation_id int32, then
    client_id as a nullable int16-length string (in every header version).
    """
    if len(body) < 10:
        return False
    if mode == "produce" and struct.unpack(">h", body[:2])[0] != _PRODUCE_API_KEY:
        return False
    n = struct.unpack(">h", body[8:10])[0]
    client_id = body[10 : 10 + n].decode("utf-8", "replace") if n > 0 else ""
    return not (exempt_prefix and client_id.startswith(exempt_prefix))
