"""An encoder behind a shared embedding server: any OpenAI-compatible ``/v1/embeddings``
endpoint (infinity, text-embeddings-inference, vLLM, a hosted API).

**Identity.** The encoder is named after ``scoring.encoder`` (``all-MiniLM-L6-v2`` by
default), whatever the server calls its model (``embedding_server.model``): models record
and are matched by that name and width. The name says which model a detector expects; the
probe sentences say whether the server runs its weights. A model records the probe
embeddings of the encoder that embedded its training data, and a worker embeds them
through the server before it installs a model, refusing it when they differ (lowest cosine
under :data:`~sidecar.scoring.MIN_PROBE_COSINE`). So a model trained locally with
all-MiniLM-L6-v2 serves through a server running the same weights, and the other way
round, while a server running other weights under the same name is refused.

**Requests.** Texts are sent in requests of at most ``max_batch``; at most
``concurrency`` requests are in flight per process, whichever thread asks. A 429, a 5xx,
a timeout or a connection error is retried after an exponential backoff with jitter, or
after the server's ``Retry-After`` (seconds or an HTTP date); the retries of one request
end at its deadline (``deadline_s`` after it was first sent) with
:class:`~sidecar.errors.EncoderUnavailable`. A 401, 403, 404 or an answer that is not
embeddings raises :class:`~sidecar.errors.EncoderRefused` at once, a 400, 413 or 422
:class:`~sidecar.errors.EncoderInputRejected`. Rows come back L2-normalised.

**Secrets.** The API key travels in the ``Authorization`` header only; messages never
hold it (an error body that echoes it is redacted) and the URL they show has its
credentials and key parameters masked.

The client is httpx's synchronous one: every caller is a thread (the worker's encoder
thread and readiness checks, the training job), and a request blocks only its own.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from sidecar.encoders._encoder import encoder_dim, encoder_label
from sidecar.encoders._http_wire import (
    INPUT_STATUS,
    RETRY_STATUS,
    error_message,
    parse_retry_after,
    read_embeddings,
    request_body,
)
from sidecar.encoders._probes import embed_probes
from sidecar.errors import ConfigError, EncoderInputRejected, EncoderRefused, EncoderUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerState:
    """What the last finished request said about the server.

    ``reachable`` is None until a request has finished; ``error`` is why the last one
    failed; ``since`` (epoch s) is when ``reachable`` last changed.
    """

    reachable: bool | None = None
    error: str | None = None
    served_model: str | None = None
    since: float = 0.0


class _Retry(Exception):
    """One attempt failed in a way that another may not: why, and the server's wait."""

    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.wait_s = reason, wait_s


class HttpEncoder:
    """Embeds through an OpenAI-compatible ``/v1/embeddings`` endpoint (see the module
    docstring).

    Parameters
    ----------
    name : str
        The encoder's name (``scoring.encoder``): what models record and are matched by.
    base_url : str
        The endpoint's base URL; requests go to ``<base_url>/embeddings``.
    model : str
        The model name sent to the server (default: ``name``).
    api_key : str, optional
        Sent as ``Authorization: Bearer <api_key>``.
    dim : int, optional
        The server's embedding width; default: ``name``'s local configs, else the width
        of the server's first answer.
    timeout_s, deadline_s : float
        One request's timeout; the time one request may take with its retries.
    max_retries : int
        Retries of one request at most (the deadline may end them sooner).
    backoff_s, backoff_max_s : float
        First wait between tries, doubled per retry with jitter, and its ceiling.
    concurrency : int
        Requests in flight at once, for every caller together.
    max_batch : int
        Texts per request at most.
    encoding_format : {"base64", "float"}
    ca_file : path, optional
        CA bundle for the server's certificate (default: the system's).
    transport : httpx.BaseTransport, optional
        For tests that need one; the default is the network.
    """

    backend = "http"
    remote = True

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str = "",
        api_key: str | None = None,
        dim: int | None = None,
        timeout_s: float = 10.0,
        deadline_s: float = 30.0,
        max_retries: int = 6,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        concurrency: int = 4,
        max_batch: int = 32,
        encoding_format: str = "base64",
        ca_file: str | Path | None = None,
        transport: Any = None,
    ) -> None:
        import httpx

        from sidecar.settings import mask_url_password

        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"embedding server URL must be http(s)://..., got {mask_url_password(base_url)!r}"
            )
        self._name = encoder_label(name)
        self.model = model or name
        self._dim = dim or encoder_dim(name)
        base = httpx.URL(base_url)
        # The endpoint under base_url; a query (?api-version=...) stays a query.
        self._url = str(base.copy_with(path=base.path.rstrip("/") + "/embeddings"))
        self.url = mask_url_password(self._url)  # what messages and /readyz show
        self.timeout_s, self.deadline_s = float(timeout_s), float(deadline_s)
        self.max_retries, self.max_batch = int(max_retries), int(max_batch)
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.concurrency = int(concurrency)
        self.encoding_format = encoding_format
        self._api_key = api_key
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        verify: Any = True
        if ca_file:
            try:
                verify = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"embedding_server.ca_file {str(ca_file)!r} is not a readable CA bundle: "
                    f"{exc.strerror or exc}"
                ) from None
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            ),
            verify=verify,
            transport=transport,
            follow_redirects=False,
        )
        self._httpx = httpx
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._suspended: str | None = None
        self._state = ServerState(since=time.time())
        self._jitter = random.Random()
        self.requests = self.retries = 0

    @classmethod
    def from_settings(cls, server: Any, *, name: str, transport: Any = None) -> HttpEncoder:
        """The encoder an ``EmbeddingServerSettings`` section describes, named ``name``."""
        if not server.base_url:
            raise ConfigError(
                "scoring.encoder_backend=http needs embedding_server.base_url (the server's "
                "OpenAI-compatible URL, e.g. http://embeddings:7997/v1)"
            )
        return cls(
            name,
            base_url=server.base_url,
            model=server.model,
            api_key=server.api_key.get_secret_value() if server.api_key else None,
            dim=server.dim or None,
            timeout_s=server.timeout_s,
            deadline_s=server.deadline_s,
            max_retries=server.max_retries,
            backoff_s=server.backoff_s,
            backoff_max_s=server.backoff_max_s,
            concurrency=server.concurrency,
            max_batch=server.max_batch,
            encoding_format=server.encoding_format,
            ca_file=server.ca_file,
            transport=transport,
        )

    # -- the Encoder protocol ------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        """The embedding width. Where neither the settings nor the encoder's local configs
        say it, the first call asks the server for the probe sentences (and raises
        :class:`~sidecar.errors.EncoderUnavailable` if it does not answer)."""
        if self._dim is None:
            self.probe()
        assert self._dim is not None
        return self._dim

    @property
    def known_dim(self) -> int | None:
        """The width if known without asking the server."""
        return self._dim

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Embed ``texts`` through the server: ndarray (n, dim), float32, unit rows.

        ``batch_size`` is the local encoders' forward-pass size and is not used: requests
        carry ``max_batch`` texts. Raises :class:`~sidecar.errors.EncoderUnavailable`
        (also at once while :meth:`suspend` holds a reason),
        :class:`~sidecar.errors.EncoderRefused` or
        :class:`~sidecar.errors.EncoderInputRejected`.
        """
        reason = self._suspended
        if reason is not None:
            raise EncoderUnavailable(reason)
        return self._embed(list(texts))

    def probe(self, *, deadline_s: float | None = None) -> np.ndarray:
        """The probe sentences' embeddings by the server, even while suspended;
        ``deadline_s`` instead of the encoder's own (a quick readiness check)."""
        return embed_probes(lambda texts: self._embed(texts, deadline_s))

    # -- state ---------------------------------------------------------------------------

    def suspend(self, reason: str | None) -> None:
        """While ``reason`` is set, :meth:`encode` raises ``EncoderUnavailable(reason)``
        without asking the server; None lifts it. A worker suspends the encoder when the
        server's vectors no longer match the models it serves."""
        if reason != self._suspended:
            if reason is None:
                log.warning("embedding server %s: embedding again", self.url)
            else:
                log.error("embedding server %s: not embedding: %s", self.url, reason)
        self._suspended = reason

    @property
    def suspended(self) -> str | None:
        return self._suspended

    def state(self) -> ServerState:
        return self._state

    def describe(self) -> dict[str, Any]:
        """The server as ``/readyz`` shows it (no key, a masked URL)."""
        st = self._state
        return {
            "url": self.url,
            "model": self.model,
            "served_model": st.served_model,
            "dim": self._dim,
            "reachable": st.reachable,
            "error": st.error,
            "suspended": self._suspended,
            "requests": self.requests,
            "retries": self.retries,
        }

    def close(self) -> None:
        """Stop: a retry that is waiting gives up at once; the connections close."""
        self._closed.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- requests ------------------------------------------------------------------------

    def _embed(self, texts: list[str], deadline_s: float | None = None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        step = self.max_batch
        chunks = [texts[i : i + step] for i in range(0, len(texts), step)]
        if len(chunks) == 1:
            return self._request(chunks[0], deadline_s)
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.concurrency, thread_name_prefix="sidecar-embed"
                    )
        parts = self._pool.map(lambda chunk: self._request(chunk, deadline_s), chunks)
        return np.concatenate(list(parts))

    def _request(self, texts: list[str], deadline_s: float | None = None) -> np.ndarray:
        """One request for ``texts`` (at most ``max_batch``), retried until its deadline."""
        started = time.monotonic()
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        deadline = started + deadline_s
        body = json.dumps(request_body(texts, self.model, self.encoding_format)).encode()
        tries = 0
        while True:
            if self._closed.is_set():
                raise EncoderUnavailable(f"embedding server {self.url}: the encoder is closed")
            tries += 1
            try:
                return self._attempt(body, len(texts), deadline)
            except _Retry as exc:
                why = exc.reason
                wait = exc.wait_s if exc.wait_s is not None else self._backoff(tries)
            left = deadline - time.monotonic()
            if tries > self.max_retries or wait >= left:
                after = f"{tries} tries in {time.monotonic() - started:.1f} s"
                if tries <= self.max_retries:
                    after += f"; the next could not start before the {deadline_s:g} s deadline"
                self._failed(f"{why} ({after})")
            self.retries += 1
            log.info("embedding server %s: %s; retry %s in %.2f s", self.url, why, tries, wait)
            if self._closed.wait(wait):
                raise EncoderUnavailable(f"embedding server {self.url}: the encoder is closed")

    def _attempt(self, body: bytes, n: int, deadline: float) -> np.ndarray:
        httpx = self._httpx
        left = deadline - time.monotonic()
        if not self._slots.acquire(timeout=max(left, 0.0)):
            self._failed(f"all {self.concurrency} request slots stayed busy until the deadline")
        try:
            self.requests += 1
            timeout = max(min(self.timeout_s, deadline - time.monotonic()), 0.001)
            resp = self._client.post(self._url, content=body, timeout=timeout)
        except httpx.TimeoutException:
            raise _Retry(f"no answer within {timeout:.1f} s") from None
        except httpx.TransportError as exc:
            raise _Retry(f"unreachable ({type(exc).__name__}: {self._redact(str(exc))})") from None
        finally:
            self._slots.release()
        status = resp.status_code
        if 200 <= status < 300:
            return self._read(resp.content, n)
        said = self._redact(error_message(resp.content))
        if status in RETRY_STATUS:
            wait = parse_retry_after(resp.headers.get("retry-after"))
            raise _Retry(f"HTTP {status}: {said}", wait)
        if status in INPUT_STATUS:
            self._mark(True, None)
            raise EncoderInputRejected(f"embedding server {self.url}: HTTP {status}: {said}")
        self._refused(f"HTTP {status}: {said}")

    def _read(self, content: bytes, n: int) -> np.ndarray:
        try:
            E, served = read_embeddings(content, n, self._dim)
        except EncoderRefused as exc:
            self._refused(self._redact(str(exc)))
        except EncoderInputRejected as exc:
            self._mark(True, None)
            raise EncoderInputRejected(f"embedding server {self.url}: {exc}") from None
        with self._lock:
            if self._dim is None:
                self._dim = int(E.shape[1])
                log.info("embedding server %s: %s-dim embeddings", self.url, self._dim)
            elif E.shape[1] != self._dim:  # two first answers of different widths
                self._refused(f"answers {E.shape[1]}-dim embeddings, {self._dim} expected")
        self._mark(True, None, served)
        return E

    def _backoff(self, tries: int) -> float:
        base = self.backoff_s * 2 ** (tries - 1)
        return float(min(self.backoff_max_s, base * (0.5 + self._jitter.random())))

    def _failed(self, why: str) -> NoReturn:
        message = f"embedding server {self.url}: {why}"
        self._mark(False, message)
        raise EncoderUnavailable(message)

    def _refused(self, why: str) -> NoReturn:
        message = f"embedding server {self.url}: {why}"
        self._mark(False, message)
        raise EncoderRefused(message)

    def _mark(self, reachable: bool, error: str | None, served: str | None = None) -> None:
        old = self._state
        if reachable and old.reachable is False:
            log.warning("embedding server %s answers again", self.url)
        elif not reachable and old.reachable is not False:
            log.warning("%s", error)
        since = old.since if old.reachable == reachable else time.time()
        self._state = ServerState(reachable, error, served or old.served_model, since)

    def _redact(self, text: str) -> str:
        """``text`` without the API key, should a server or a proxy echo it back."""
        return text.replace(self._api_key, "***") if self._api_key else text
