"""The Redis, store, scoring, web, explanation and logging sections."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from sidecar.settings._fields import (
    _ENV_ONLY,
    DEFAULT_ENCODER,
    _check_kb,
    _not_blank,
    _not_empty_path,
    _Section,
    mask_url_password,
)


class RedisSettings(_Section):
    """The Redis that holds the model store."""

    # A plain str because redis-py and existing callers take one; it may carry a password
    # (redis://:pw@host), so the default repr leaves it out and __repr_args__ adds it masked.
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        repr=False,
        description="the Redis that holds the model store (rediss:// for TLS; an ACL user "
        "as redis://USER@host:port/0); put no password in it",
    )
    password: SecretStr | None = Field(
        None, description="Redis password; give it as the secret file redis__password"
    )
    key_prefix: str = Field("oodsc", description="prefix of every key the model store writes")
    socket_timeout_s: float = Field(5.0, gt=0, description="socket timeout of every Redis command")
    ssl_ca_file: str | None = Field(
        None,
        description="with a rediss:// url: PEM bundle of the CA(s) that signed the Redis "
        "server's certificate (then only they are trusted); default: the system's CAs",
    )
    ssl_cert_file: str | None = Field(
        None, description="with a rediss:// url: client certificate (PEM) for mutual TLS"
    )
    ssl_key_file: str | None = Field(
        None, description="its private key (PEM, unencrypted; omit when the cert file holds it)"
    )

    @field_validator("password")
    @classmethod
    def _password_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "redis.password", "unset it for no password")

    @field_validator("ssl_ca_file", "ssl_cert_file", "ssl_key_file", mode="before")
    @classmethod
    def _empty_file_is_none(cls, v: Any) -> Any:
        # an empty variable (a chart value left "") means no file, not the working directory
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _tls_files_need_rediss(self) -> RedisSettings:
        # redis-py ignores them on a redis:// URL: the store would be spoken to in plain
        # text by an operator who believes otherwise. The URL is not echoed (a password
        # may be in it).
        given = [f"redis.{n}" for n in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file")
                 if getattr(self, n)]  # fmt: skip
        if _ENV_ONLY.get() or not given:
            return self
        if not self.url.strip().lower().startswith("rediss://"):
            raise ValueError(
                f"{' and '.join(given)} set, but redis.url is not a rediss:// URL: use "
                "rediss://HOST:PORT/DB for TLS, or unset them"
            )
        if self.ssl_key_file and not self.ssl_cert_file:
            raise ValueError("redis.ssl_key_file needs redis.ssl_cert_file (its certificate)")
        return self

    @property
    def masked_url(self) -> str:
        """``url`` with any password replaced by ``***``, for messages and logs."""
        return mask_url_password(self.url)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "url", self.masked_url
        yield from super().__repr_args__()


class StoreSettings(_Section):
    """Where models live and how they are trusted."""

    backend: Literal["redis", "directory"] = Field(
        "redis",
        description="redis (the deployment) or directory (one machine, air-gapped transfer)",
    )
    directory: Path = Field(
        Path("./model-store"), description="root of the directory store (store.backend = directory)"
    )
    hmac_key: SecretStr | None = Field(None, description="sign on publish, require on load")
    retention: int = Field(
        10, ge=2, description="versions kept per KB (active and previous always)"
    )
    chunk_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=256 * 1024 * 1024,
        description="size of the chunks a model's arrays are written to Redis in",
    )
    poll_interval_s: float = Field(5.0, gt=0, description="active-pointer safety-net poll")

    @field_validator("hmac_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "store.hmac_key", "unset it to run unsigned")

    @field_validator("directory", mode="before")
    @classmethod
    def _directory_not_empty(cls, v: Any) -> Any:
        return _not_empty_path(v, "store.directory", "unset it for ./model-store")


class ScoringSettings(_Section):
    """Encoder, micro-batching and input policy on the scoring path."""

    encoder: str = Field(
        DEFAULT_ENCODER,
        description="all-MiniLM-L6-v2 (English), use-multilingual-v3 or "
        "multilingual-e5-small-q4 (multilingual, the `multilingual` extra), or a local "
        "sentence-transformers directory",
    )
    device: str = Field("cpu", description="torch device of the torch encoder backend")
    kbs: tuple[str, ...] = Field(
        ("default",),
        description="the KB ids this worker serves (a JSON list); each needs an active model",
    )
    default_kb: str = Field("default", description="KB of queries that name none")
    encoder_backend: Literal["auto", "torch", "onnx", "http"] = Field(
        "auto",
        description="onnx: the same encoder exported once and run by ONNX Runtime "
        "(embeddings checked against torch at every load); auto: onnx where it loads and "
        "checks out for a float32 CPU encoder, torch otherwise (logged); http: the "
        "embedding server of the embedding_server section",
    )
    onnx_cache_dir: Path = Field(
        Path("~/.cache/ood-sidecar/onnx"), description="where ONNX exports are kept"
    )
    onnx_prebuilt_dir: Path | None = Field(
        None,
        description="a directory (read-only is fine) with an export made beforehand by "
        "`sidecar prepare-encoder`, e.g. baked into the image; tried before onnx_cache_dir; "
        "empty: none",
    )
    encoder_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="bfloat16: the encoder's linear layers in bfloat16 (needs AMX or "
        "AVX512-BF16; embeddings within a cosine of 0.99998 of float32)",
    )
    encoder_threads: int = Field(
        0, ge=0, description="torch intra-op threads; 0 = the CPUs available minus one, >= 1"
    )
    batch_max: int = Field(64, ge=1, le=4096, description="most queries in one micro-batch")
    batch_timeout_ms: int = Field(
        5, ge=0, description="how long a lone query waits for companions when the encoder is idle"
    )
    max_text_chars: int = Field(
        4000, ge=1, description="longest query text accepted (see overlong)"
    )
    overlong: Literal["reject", "truncate"] = Field(
        "reject", description="an over-long text: reject (dead letter too_long) or truncate"
    )
    fail_mode: Literal["closed", "open"] = Field(
        "closed",
        description="verdict when no model is loaded, or the embedding server gives no "
        "vectors in time: closed = OOD, open = ID",
    )
    embedding_fallback: Literal["dead_letter", "encode"] = Field(
        "dead_letter",
        description="a query whose own embedding cannot be used (malformed, not finite, "
        "another width, or no or another encoder than the model's): dead_letter (with that "
        "reason code) or encode (its text is embedded here; the verdict says "
        "embedding_fallback)",
    )
    detect_language: bool = Field(
        True,
        description="tell each query's language (py3langid, offline), write it into the "
        "verdict and pick the model's threshold for that language where it has one",
    )
    languages: tuple[str, ...] = Field(
        (),
        description="the languages (ISO 639-1, a JSON list) the language detector chooses "
        "among; empty: the encoder's own languages (every language for an English-only "
        "encoder)",
    )

    @field_validator("onnx_prebuilt_dir", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        # The chart always sets the variable; an empty value switches the lookup off.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("onnx_cache_dir", mode="before")
    @classmethod
    def _cache_dir_not_empty(cls, v: Any) -> Any:
        return _not_empty_path(v, "scoring.onnx_cache_dir", "unset it for the default")

    @field_validator("kbs")
    @classmethod
    def _kbs_valid(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("scoring.kbs is empty: serve at least one KB, e.g. '[\"default\"]'")
        for kb in v:
            _check_kb(kb)
        return v

    @field_validator("default_kb")
    @classmethod
    def _default_kb_valid(cls, v: str) -> str:
        return _check_kb(v)


class WebSettings(_Section):
    host: str = Field("0.0.0.0", description="address the worker's HTTP server binds")
    port: int = Field(
        6066, ge=1, le=65535, description="port of /healthz, /readyz, /metrics and /models"
    )


class ExplainSettings(_Section):
    """The black-box LLM behind rule mining (any OpenAI-compatible endpoint)."""

    enabled: bool = Field(False, description="run the explanation agent on the audit topic")
    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="OpenAI-compatible endpoint of the black-box LLM"
    )
    model: str = Field("local", description="model name sent to the endpoint")
    api_key: SecretStr | None = Field(
        None, description="API key of the endpoint; give it as the secret file explain__api_key"
    )
    temperature: float = Field(0.0, ge=0, description="sampling temperature (pinned decoding)")
    top_p: float = Field(1.0, description="nucleus sampling share (pinned decoding)")
    max_tokens: int = Field(64, ge=1, description="longest answer asked for")
    seed: int = Field(0, description="seed of the first vote; vote k uses seed + k")
    votes: int = Field(
        1, ge=1, description="answers asked per subset; the verdict is their seeded majority"
    )
    concurrency: int = Field(4, ge=1, description="requests in flight to the endpoint at once")
    timeout_s: float = Field(60.0, gt=0, description="timeout of one request")
    max_retries: int = Field(
        4, ge=0, description="retries of a 429, 5xx, timeout or unreadable answer"
    )
    cache_dir: Path | None = Field(
        None, description="where answers are cached on disk (none: in memory only)"
    )
    backoff_s: float = Field(default=0.5, gt=0, description="first retry wait, doubled per retry")
    max_sources: int = Field(default=12, ge=1, le=20, description="most sources per request")

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "explain.api_key", "unset it for an endpoint without one")

    @field_validator("base_url")
    @classmethod
    def _url_with_a_host(cls, v: str) -> str:
        # Refused here, not at the first request: httpx's InvalidURL was a traceback, and a
        # URL without a host was retried as if the endpoint were down.
        # The string as given, parsed as the client will parse it.
        import httpx

        shown = mask_url_password(v)  # a key may ride in the query (?api_key=...)
        if not v.startswith(("http://", "https://")) or any(c.isspace() for c in v):
            raise ValueError(f"explain.base_url must be http(s)://HOST[:PORT]/..., got {shown!r}")
        try:
            host = httpx.URL(v).host
        except httpx.InvalidURL as exc:
            raise ValueError(f"explain.base_url {shown!r} is not a URL: {exc}") from None
        if not host:
            raise ValueError(f"explain.base_url {shown!r} names no host")
        return v


class LogSettings(_Section):
    """Logging of every ``sidecar`` command; ``--log-level`` / ``--log-json`` override."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "WARNING", description="DEBUG, INFO, WARNING or ERROR (any case); --log-level overrides"
    )
    json_lines: bool = Field(
        False, description="log JSON lines, one object per record; --log-json overrides"
    )

    @field_validator("level", mode="before")
    @classmethod
    def _level_upper(cls, v: Any) -> Any:
        # as case-insensitive as --log-level
        return v.strip().upper() if isinstance(v, str) else v
