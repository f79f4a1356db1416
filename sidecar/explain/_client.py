"""Black boxes: the protocol and an OpenAI-compatible chat-completions client.

The client works with vLLM, llama.cpp's server, Ollama and hosted APIs. Decoding is
pinned (temperature, top_p, max_tokens, seed); vote ``i`` of a kept set is the request
with seed ``seed + i``. Concurrency is bounded; 429 and 5xx answers, timeouts, transport
errors and unreadable bodies are retried with exponential backoff (a server's
``Retry-After`` wins); after ``max_retries`` the client raises
:class:`~sidecar.errors.BlackBoxError`. Other 4xx answers fail at once.

An optional on-disk cache stores each answer as ``<sha256>.json`` keyed by the model,
the decoding parameters, the prompt and the seed, so an interrupted run resumes without
asking again.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from sidecar.errors import BlackBoxError, BlackBoxRefused, ConfigError
from sidecar.explain._prompt import Messages
from sidecar.settings import ExplainSettings

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_MAX_WAIT_S = 60.0


@runtime_checkable
class BlackBox(Protocol):
    """An LLM that answers chat messages; ``seed`` selects one reproducible sample."""

    @property
    def name(self) -> str: ...

    async def complete(self, messages: Messages, *, seed: int) -> str: ...

    async def aclose(self) -> None: ...


class AnswerCache:
    """Answers on disk, one JSON file per (model, params, prompt, seed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(model: str, params: dict[str, Any], messages: Messages, seed: int) -> str:
        doc = {"model": model, "params": params, "messages": messages, "seed": seed}
        blob = json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    def get(self, key: str) -> str | None:
        path = self.directory / f"{key}.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ignoring unreadable cache entry %s", path)
            return None
        answer = doc.get("answer") if isinstance(doc, dict) else None
        return answer if isinstance(answer, str) else None

    def put(self, key: str, answer: str, meta: dict[str, Any]) -> None:
        # write-then-rename so a crash never leaves half a file behind
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({**meta, "answer": answer}, fh, ensure_ascii=False)
        os.replace(tmp, self.directory / f"{key}.json")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class _Retryable(Exception):
    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.wait_s = wait_s


class ChatCompletionsClient:
    """An OpenAI-compatible ``/chat/completions`` endpoint as a black box.

    Parameters
    ----------
    settings : ExplainSettings
        Base URL, model, key, decoding, concurrency, timeout, retries and cache dir.
    backoff_s : float, optional
        First backoff (default ``settings.backoff_s``); doubles each retry, with jitter,
        capped at 60 s.
    transport : httpx.AsyncBaseTransport, optional
        For tests that need one; the default is a normal network transport.
    """

    def __init__(
        self,
        settings: ExplainSettings,
        *,
        backoff_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        from sidecar.settings import mask_url_password

        if not settings.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                "explain base_url must be http(s)://..., "
                f"got {mask_url_password(settings.base_url)!r}"
            )
        self.settings = settings
        self.backoff_s = settings.backoff_s if backoff_s is None else backoff_s
        # The endpoint's path under base_url; a query (?api_key=...) stays a query.
        base = httpx.URL(settings.base_url)
        self._url = str(base.copy_with(path=base.path.rstrip("/") + "/chat/completions"))
        # What messages name: no credentials or key parameters of the URL.
        self._shown_url = mask_url_password(self._url)
        self._api_key = settings.api_key.get_secret_value() if settings.api_key else None
        headers = {"Content-Type": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._http = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(settings.timeout_s), transport=transport
        )
        self._semaphore = asyncio.Semaphore(settings.concurrency)
        self._cache = AnswerCache(settings.cache_dir) if settings.cache_dir else None
        self._jitter = random.Random(settings.seed)
        self.requests_sent = 0
        self.cache_hits = 0

    @property
    def name(self) -> str:
        return self.settings.model

    @property
    def params(self) -> dict[str, Any]:
        s = self.settings
        return {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens}

    async def complete(self, messages: Messages, *, seed: int) -> str:
        """The model's answer to ``messages`` with decoding seed ``seed``."""
        key = AnswerCache.key(self.settings.model, self.params, messages, seed)
        if self._cache is not None and (hit := self._cache.get(key)) is not None:
            self.cache_hits += 1
            return hit
        body = {"model": self.settings.model, "messages": messages, "seed": seed, **self.params}
        answer = await self._post_with_retries(body)
        if self._cache is not None:
            self._cache.put(key, answer, {"model": self.settings.model, "seed": seed})
        return answer

    async def _post_with_retries(self, body: dict[str, Any]) -> str:
        attempts = self.settings.max_retries + 1
        last = ""
        for attempt in range(attempts):
            try:
                async with self._semaphore:
                    return await self._post_once(body)
            except _Retryable as exc:
                last = str(exc)
                if attempt + 1 == attempts:
                    break
                backoff = self.backoff_s * 2**attempt * (0.5 + self._jitter.random())
                wait = min(_MAX_WAIT_S, exc.wait_s if exc.wait_s is not None else backoff)
                log.info(
                    "black box: %s; retry %s/%s in %.2f s",
                    self._redacted(last),
                    attempt + 1,
                    attempts - 1,
                    wait,
                )
                await asyncio.sleep(wait)
        raise BlackBoxError(
            f"{self._shown_url}: {self._redacted(last)} (after {attempts} attempts)"
        )

    async def _post_once(self, body: dict[str, Any]) -> str:
        self.requests_sent += 1
        try:
            resp = await self._http.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timeout ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"transport error ({type(exc).__name__}: {exc})") from exc
        if resp.status_code in _RETRY_STATUS:
            raise _Retryable(
                f"HTTP {resp.status_code}", parse_retry_after(resp.headers.get("retry-after"))
            )
        if resp.status_code >= 400:
            body_text = self._redacted(resp.text[:200])
            raise BlackBoxRefused(f"{self._shown_url}: HTTP {resp.status_code}: {body_text}")
        try:
            doc = resp.json()
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retryable(f"unreadable response ({type(exc).__name__})") from exc
        if not isinstance(content, str):
            raise _Retryable("response content is not a string")
        return content

    def _redacted(self, text: str) -> str:
        """``text`` without the API key, should an endpoint echo it back in an error."""
        return text.replace(self._api_key, "***") if self._api_key else text

    async def aclose(self) -> None:
        await self._http.aclose()
