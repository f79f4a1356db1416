"""The embedding server section: an OpenAI-compatible ``/v1/embeddings`` endpoint that
embeds for every process when ``scoring.encoder_backend`` is ``http``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sidecar.settings._fields import _not_blank, _Section, mask_url_password


class EmbeddingServerSettings(_Section):
    """A shared embedding server (``scoring.encoder_backend = http``).

    The encoder keeps the name ``scoring.encoder`` gives it (what models record and are
    matched by); the server is asked for ``model``. Workers compare the server's vectors
    of the probe sentences with each model's before installing it.
    """

    base_url: str = Field(
        "",
        description="OpenAI-compatible base URL; requests go to <base_url>/embeddings "
        "(e.g. http://embeddings:7997/v1); empty: no server",
    )
    model: str = Field(
        "",
        description="model name sent to the server; empty: scoring.encoder",
    )
    api_key: SecretStr | None = Field(
        None,
        description="sent as a bearer token; give it as the secret file embedding_server__api_key",
    )
    dim: int = Field(
        0,
        ge=0,
        description="the server's embedding width; 0: read from scoring.encoder's configs "
        "where they are on this machine, else taken from the server's first answer",
    )
    timeout_s: float = Field(10.0, gt=0, description="timeout of one request")
    deadline_s: float = Field(
        30.0,
        gt=0,
        description="longest one request (max_batch texts at most) may take with its "
        "retries; a worker answers a batch that misses it with scoring.fail_mode",
    )
    max_retries: int = Field(
        6, ge=0, description="retries of a 429, 5xx, timeout or connection error"
    )
    backoff_s: float = Field(
        0.2, gt=0, description="first retry wait, doubled per retry, with jitter"
    )
    backoff_max_s: float = Field(
        5.0, gt=0, description="longest wait between retries (a Retry-After header wins)"
    )
    concurrency: int = Field(
        4, ge=1, le=64, description="requests in flight to the server at once, per process"
    )
    max_batch: int = Field(
        32,
        ge=1,
        le=2048,
        description="most texts in one request (the server's limit); larger batches are split",
    )
    encoding_format: Literal["base64", "float"] = Field(
        "base64",
        description="how vectors travel: base64 (compact float32, what the OpenAI clients "
        "ask for) or float (JSON numbers, for servers without base64)",
    )
    check_interval_s: float = Field(
        10.0,
        gt=0,
        description="how often a worker embeds the probe sentences to check the server "
        "(every second while it does not answer)",
    )
    ca_file: Path | None = Field(
        None, description="CA bundle that signs the server's certificate; empty: the system's"
    )

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "embedding_server.api_key", "unset it for a server without one")

    @field_validator("ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        # The chart always sets the variable; an empty value means the system's CAs.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("base_url")
    @classmethod
    def _url_with_a_host(cls, v: str) -> str:
        if not v:
            return v
        import httpx

        shown = mask_url_password(v)  # a key may ride in the query (?api_key=...)
        if not v.startswith(("http://", "https://")) or any(c.isspace() for c in v):
            raise ValueError(
                f"embedding_server.base_url must be http(s)://HOST[:PORT]/..., got {shown!r}"
            )
        try:
            host = httpx.URL(v).host
        except httpx.InvalidURL as exc:
            raise ValueError(f"embedding_server.base_url {shown!r} is not a URL: {exc}") from None
        if not host:
            raise ValueError(f"embedding_server.base_url {shown!r} names no host")
        return v

    @model_validator(mode="after")
    def _backoff_within_deadline(self) -> EmbeddingServerSettings:
        if self.backoff_s > self.backoff_max_s:
            raise ValueError(
                f"embedding_server.backoff_s ({self.backoff_s}) is longer than backoff_max_s "
                f"({self.backoff_max_s})"
            )
        return self

    @property
    def masked_url(self) -> str:
        """``base_url`` without credentials or key parameters, for messages and logs."""
        return mask_url_password(self.base_url)
