"""The chat-completions client never repeats its API key or a key in its URL in an error,
even when the endpoint echoes the Authorization header back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from sidecar.cli import main
from sidecar.errors import BlackBoxError, BlackBoxRefused
from sidecar.explain import ChatCompletionsClient
from sidecar.settings import ExplainSettings

KEY = "sk-S3cr3tV4lue"


def _echoing(status: int) -> httpx.MockTransport:
    def reply(request: httpx.Request) -> httpx.Response:
        # The key in the query stays a query; the endpoint's path goes under base_url.
        assert request.url.path == "/v1/chat/completions"
        assert request.url.params["api_key"] == KEY
        said = request.headers.get("authorization", "")
        return httpx.Response(status, json={"error": {"message": f"bad key {said}"}})

    return httpx.MockTransport(reply)


def _ask(client: ChatCompletionsClient) -> str:
    async def go() -> str:
        try:
            return await client.complete([{"role": "user", "content": "hi"}], seed=0)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(("status", "error"), [(401, BlackBoxRefused), (500, BlackBoxError)])
def test_an_echoed_key_is_redacted(status: int, error: type[Exception]) -> None:
    settings = ExplainSettings(
        base_url=f"http://llm.local/v1?api_key={KEY}", api_key=KEY, max_retries=1
    )
    client = ChatCompletionsClient(settings, backoff_s=0.001, transport=_echoing(status))
    with pytest.raises(error) as raised:
        _ask(client)
    message = str(raised.value)
    assert KEY not in message, message
    assert f"HTTP {status}" in message and "api_key=***" in message
    if status == 401:
        assert "bad key Bearer ***" in message


def test_a_settings_error_does_not_show_a_key_in_the_url(
    tmp_path: Path, one_error_line: Callable[[Result], str]
) -> None:
    env = {"SIDECAR_SECRETS_DIR": str(tmp_path)}
    env["SIDECAR_EXPLAIN__BASE_URL"] = f"ftp://llm.local/v1?api_key={KEY}"
    line = one_error_line(CliRunner(env=env).invoke(main, ["settings"]))
    assert "explain.base_url" in line and "api_key=***" in line and KEY not in line
