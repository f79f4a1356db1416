"""A real local HTTP server speaking the chat-completions schema, for tests and demos.

It answers only from the source markers (``[S<k>]``) present in the prompt it receives,
through a declared truth table over kept sets, so a client that fails to drop a source
gets a different answer. It can add seeded noise (for the voting path) and inject
faults (429 with ``Retry-After``, 500, a stall longer than the client's timeout, or a body
that is not JSON) on chosen requests, and it logs every request it answered.

It runs its own event loop in a daemon thread; use it as a context manager.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sidecar.explain._predicates import JUDGE_SYSTEM
from sidecar.local import free_port

_MARKER = re.compile(r"\[S(\d+)\]")
FAULTS = ("429", "500", "timeout", "badjson")


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it: kept set, seed, and the fault it got, if any."""

    kept: int
    seed: int | None
    fault: str | None
    judge: bool = False


class FakeChatLLM:
    """A chat-completions server whose answer is a function of the kept-set markers.

    Parameters
    ----------
    truth : callable ``kept_mask -> bool``
        ``True`` answers ``yes_answer``, ``False`` answers ``no_answer``.
    noise : float
        Probability that a (kept set, seed) pair gets the other answer; seeded by
        ``noise_seed``, so the same request always gets the same answer.
    stall_s : float
        How long a ``timeout`` fault stalls before answering.
    """

    def __init__(
        self,
        truth: Callable[[int], bool],
        *,
        yes_answer: str = "The capital of Veltria is Morvane.",
        no_answer: str = "I do not know.",
        noise: float = 0.0,
        noise_seed: int = 0,
        stall_s: float = 2.0,
    ) -> None:
        self.truth = truth
        self.yes_answer = yes_answer
        self.no_answer = no_answer
        self.noise = noise
        self.noise_seed = noise_seed
        self.stall_s = stall_s
        self.port = free_port()
        self.log: list[LoggedRequest] = []
        self._faults: list[str] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, *faults: str) -> None:
        """Fail the next requests, one fault each, in order."""
        bad = [f for f in faults if f not in FAULTS]
        if bad:
            raise ValueError(f"unknown faults {bad}; use {FAULTS}")
        with self._lock:
            self._faults.extend(faults)

    def answered(self) -> list[LoggedRequest]:
        """Requests that got a real answer (no fault), judge requests excluded."""
        return [r for r in self.log if r.fault is None and not r.judge]

    def kept_from_prompt(self, text: str) -> int:
        mask = 0
        for k in _MARKER.findall(text):
            mask |= 1 << (int(k) - 1)
        return mask

    def _answer(self, kept: int, seed: int | None) -> str:
        value = self.truth(kept)
        if self.noise > 0:
            coin = random.Random(f"{self.noise_seed}:{kept}:{seed}").random()
            value = value != (coin < self.noise)
        return self.yes_answer if value else self.no_answer

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        messages = body.get("messages") or []
        seed = body.get("seed")
        judge = bool(messages) and messages[0].get("content") == JUDGE_SYSTEM
        user = "\n".join(m.get("content", "") for m in messages if m.get("role") == "user")
        kept = self.kept_from_prompt(user)
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
            self.log.append(LoggedRequest(kept=kept, seed=seed, fault=fault, judge=judge))
        if fault == "429":
            return web.json_response(
                {"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"}
            )
        if fault == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if fault == "timeout":
            await asyncio.sleep(self.stall_s)
        if fault == "badjson":
            return web.Response(text="{not json", content_type="application/json")
        if judge:
            content = "yes" if self.yes_answer.lower() in user.lower() else "no"
        else:
            content = self._answer(kept, seed)
        return web.json_response(
            {
                "id": f"fake-{len(self.log)}",
                "object": "chat.completion",
                "model": body.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        runner = web.AppRunner(app, handle_signals=False)
        self._runner = runner
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def start(self) -> FakeChatLLM:
        self._thread = threading.Thread(target=self._serve, name="fake-llm", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake LLM server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self) -> FakeChatLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
