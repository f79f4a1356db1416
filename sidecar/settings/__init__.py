"""Typed, frozen settings for every sidecar process.

Built once at the entry point (:func:`load_settings`) and passed down; nothing else in
the package reads the environment. Sources, highest priority first:

1. keyword arguments (the CLI's options),
2. environment variables ``SIDECAR_<SECTION>__<FIELD>`` (e.g. ``SIDECAR_KAFKA__BROKERS``),
3. secret files in ``SIDECAR_SECRETS_DIR`` (default ``/run/secrets/sidecar``), one file per
   field named ``<section>__<field>`` (e.g. ``redis__password``, ``store__hmac_key``),
4. the defaults below, which suit one machine with the embedded broker.

Secrets are ``SecretStr``: they never appear in ``repr``, logs or ``/readyz``; a password
inside ``redis.url`` is masked in ``repr`` as well. A secret file must hold UTF-8 text
(a binary key is rejected, never echoed). Settings that do not validate raise
:class:`~sidecar.errors.ConfigError` naming each field and problem but never the value,
since the value may be a secret.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sidecar.settings._secret_files import read_secret_files, refuse_unknown_sections, secrets_dir
from sidecar.errors import ConfigError

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DEFAULT_SECRETS_DIR = Path("/run/secrets/sidecar")


# Set while load_settings reads the environment alone, before secret files are merged in:
# checks that span several fields (a SASL password may come from a file) wait until then.
_ENV_ONLY: ContextVar[bool] = ContextVar("_ENV_ONLY", default=False)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _not_empty_path(v: Any, name: str, instead: str) -> Any:
    """An empty variable would otherwise become ``Path("")``, i.e. the working directory."""
    if isinstance(v, str) and not v.strip():
        raise ValueError(f"{name} is empty ({instead})")
    return v


def _not_blank(v: SecretStr | None, name: str, instead: str) -> SecretStr | None:
    """A secret that is set must hold something: a blank secret file or an empty variable
    would otherwise read as no secret at all (signing off, no password) without a word."""
    if v is not None and not v.get_secret_value().strip():
        raise ValueError(f"{name} is set but empty ({instead})")
    return v


class KafkaSettings(_Section):
    """Broker connection and topic names."""

    brokers: str = Field("kafka://127.0.0.1:9092", description="faust broker URL(s), ';'-separated")
    app_id: str = Field("ood-sidecar", description="faust app id = consumer group")
    queries_topic: str = "rag.queries"
    verdicts_topic: str = "rag.verdicts"
    route_topics: bool = Field(False, description="also write each verdict to the ID or OOD topic")
    id_topic: str = "rag.queries.id"
    ood_topic: str = "rag.queries.ood"
    dlq_topic: str = "rag.queries.dlq"
    audit_topic: str = "rag.explain.requests"
    explanations_topic: str = "rag.explain.results"
    partitions: int = Field(4, ge=1, description="partitions of the topics the sidecar creates")
    replication_factor: int = Field(1, ge=1)
    session_timeout_s: float = Field(10.0, gt=0)
    fetch_max_wait_ms: int = Field(
        100,
        ge=1,
        le=60_000,
        description="consumer long-poll wait; a broker that answers only when it expires "
        "(the embedded one) adds up to this much latency",
    )
    produce_timeout_s: float = Field(
        30.0,
        gt=0,
        description="how long the producer keeps retrying a verdict or dead letter; past "
        "it the worker halts and exits non-zero, and the batch is delivered again after "
        "the restart",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_file: str | None = Field(
        None, description="PEM bundle of the CA(s) that signed the brokers' certificates"
    )
    ssl_cert_file: str | None = Field(None, description="client certificate (PEM) for mutual TLS")
    ssl_key_file: str | None = Field(
        None, description="its private key (PEM, unencrypted; omit when the cert file holds it)"
    )

    @field_validator("sasl_password")
    @classmethod
    def _password_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "kafka.sasl_password", "unset it without SASL")

    @field_validator("brokers")
    @classmethod
    def _brokers_without_credentials(cls, v: str) -> str:
        # aiokafka reads no credentials from a URL: it would dial "user:pw@host" and put
        # the password in every connection error. The value is never echoed.
        parts = [p.strip() for p in v.replace(",", ";").split(";") if p.strip()]
        if not parts:
            raise ValueError("kafka.brokers is empty: give kafka://HOST:PORT[;kafka://...]")
        if any("@" in p for p in parts):
            raise ValueError(
                "kafka.brokers must not carry credentials (user:password@): give them as "
                "kafka.sasl_username and the secret kafka__sasl_password"
            )
        return v

    @model_validator(mode="after")
    def _sasl_has_credentials(self) -> KafkaSettings:
        # aiokafka would fail deep inside the worker's start with a traceback instead.
        if _ENV_ONLY.get() or not self.security_protocol.startswith("SASL"):
            return self
        missing = [
            f"kafka.{name}"
            for name in ("sasl_username", "sasl_password")
            if getattr(self, name) is None
        ]
        if missing:
            raise ValueError(
                f"kafka.security_protocol {self.security_protocol} needs "
                + " and ".join(missing)
                + " (the password may be the secret file kafka__sasl_password)"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_need_tls(self) -> KafkaSettings:
        # Ignored without TLS: an operator who set a CA or a client certificate but not the
        # protocol would talk to the brokers in plain text and believe otherwise.
        given = [f"kafka.{n}" for n in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file")
                 if getattr(self, n)]  # fmt: skip
        if given and not _ENV_ONLY.get() and not self.security_protocol.endswith("SSL"):
            raise ValueError(
                f"{' and '.join(given)} set, but kafka.security_protocol is "
                f"{self.security_protocol}: use SSL or SASL_SSL, or unset them"
            )
        return self


class RedisSettings(_Section):
    """The Redis that holds the model store."""

    # A plain str because redis-py and existing callers take one; it may carry a password
    # (redis://:pw@host), so the default repr leaves it out and __repr_args__ adds it masked.
    url: str = Field("redis://127.0.0.1:6379/0", repr=False)
    password: SecretStr | None = None
    key_prefix: str = "oodsc"
    socket_timeout_s: float = Field(5.0, gt=0)

    @field_validator("password")
    @classmethod
    def _password_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "redis.password", "unset it for no password")

    @property
    def masked_url(self) -> str:
        """``url`` with any password replaced by ``***``, for messages and logs."""
        return mask_url_password(self.url)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "url", self.masked_url
        yield from super().__repr_args__()


def mask_url_password(url: str) -> str:
    """``url`` without its credentials or password parameters, for messages and logs."""
    from model_store import safe_url

    return safe_url(url)


class StoreSettings(_Section):
    """Where models live and how they are trusted."""

    backend: Literal["redis", "directory"] = "redis"
    directory: Path = Path("./model-store")
    hmac_key: SecretStr | None = Field(None, description="sign on publish, require on load")
    retention: int = Field(
        10, ge=2, description="versions kept per KB (active and previous always)"
    )
    chunk_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
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

    encoder: str = Field(DEFAULT_ENCODER, description="sentence-transformers name or local path")
    device: str = "cpu"
    kbs: tuple[str, ...] = ("default",)
    default_kb: str = "default"
    encoder_backend: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="onnx: the same encoder exported once and run by ONNX Runtime "
        "(embeddings checked against torch at every load); auto: onnx where it loads and "
        "checks out for a float32 CPU encoder, torch otherwise (logged)",
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
    batch_max: int = Field(64, ge=1, le=4096)
    batch_timeout_ms: int = Field(
        5, ge=0, description="how long a lone query waits for companions when the encoder is idle"
    )
    max_text_chars: int = Field(4000, ge=1)
    overlong: Literal["reject", "truncate"] = "reject"
    fail_mode: Literal["closed", "open"] = Field(
        "closed", description="verdict when no model is loaded: closed = OOD, open = ID"
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


def _check_kb(kb: str) -> str:
    """``model_store.check_kb`` as the ``ValueError`` pydantic reports as a field error
    (a KB id is no secret: the message names it)."""
    from model_store import InvalidName, check_kb

    try:
        return check_kb(kb)
    except InvalidName as exc:
        message = str(exc)
    raise ValueError(message)


class WebSettings(_Section):
    host: str = "0.0.0.0"
    port: int = Field(6066, ge=1, le=65535)


class ExplainSettings(_Section):
    """The black-box LLM behind rule mining (any OpenAI-compatible endpoint)."""

    enabled: bool = Field(False, description="run the explanation agent on the audit topic")
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "local"
    api_key: SecretStr | None = None
    temperature: float = Field(0.0, ge=0)
    top_p: float = 1.0
    max_tokens: int = Field(64, ge=1)
    seed: int = 0
    votes: int = Field(1, ge=1)
    concurrency: int = Field(4, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(4, ge=0)
    cache_dir: Path | None = None
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

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    json_lines: bool = False

    @field_validator("level", mode="before")
    @classmethod
    def _level_upper(cls, v: Any) -> Any:
        # as case-insensitive as --log-level
        return v.strip().upper() if isinstance(v, str) else v


class Settings(BaseSettings):
    """All settings of one process."""

    model_config = SettingsConfigDict(
        env_prefix="SIDECAR_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
    )

    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    store: StoreSettings = StoreSettings()
    scoring: ScoringSettings = ScoringSettings()
    web: WebSettings = WebSettings()
    explain: ExplainSettings = ExplainSettings()
    log: LogSettings = LogSettings()


def load_settings(**overrides: Any) -> Settings:
    """Build the process settings: overrides > environment > secret files > defaults.

    ``overrides`` are nested dicts per section, e.g. ``load_settings(kafka={"brokers": ...})``.
    Raises :class:`~sidecar.errors.ConfigError` when a value does not validate, or a secret
    file is not text; the message never contains a value.
    """
    secrets = read_secret_files(secrets_dir(DEFAULT_SECRETS_DIR))
    refuse_unknown_sections(secrets, set(Settings.model_fields))
    problem: str | None = None
    try:
        token = _ENV_ONLY.set(True)
        try:
            env_only = Settings()
        finally:
            _ENV_ONLY.reset(token)
        merged: dict[str, Any] = {}
        for section in Settings.model_fields:
            values: dict[str, Any] = dict(secrets.get(section, {}))
            # Environment beats secret files: only fields that were set explicitly.
            current = getattr(env_only, section)
            values.update(current.model_dump(exclude_unset=True))
            values.update(overrides.get(section) or {})
            merged[section] = values
        return Settings(**merged)
    except ValidationError as exc:
        problem = "; ".join(_describe_error(e) for e in exc.errors(include_input=False))
    except SettingsError as exc:
        # pydantic-settings' own message names the section and source, not the value; it
        # fails this way on a list field whose variable is not JSON
        problem = f'{exc} (list fields such as scoring.kbs take JSON, e.g. \'["hr","it"]\')'
    # Raised here, not inside the except blocks, so that no traceback carries the original
    # error: pydantic's includes the offending value, which may be a password.
    raise ConfigError(f"invalid settings: {problem}")


def _describe_error(err: Any) -> str:
    """``section.field: problem`` for one pydantic error, without its input value."""
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden" and len(err["loc"]) == 2:
        section, name = (str(p) for p in err["loc"])
        return (
            f"{loc}: unknown setting (from SIDECAR_{section.upper()}__{name.upper()} "
            f"or the secret file {section}__{name}?)"
        )
    if err["type"] == "value_error":
        # Our validators word the whole message themselves, field name included.
        msg = str(err["ctx"]["error"])
        return msg if msg.startswith(loc) else f"{loc}: {msg}"
    return f"{loc}: {err['msg']}"
