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

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sidecar.errors import ConfigError
from sidecar.settings._embedding_server import EmbeddingServerSettings
from sidecar.settings._fields import _ENV_ONLY, DEFAULT_ENCODER, mask_url_password
from sidecar.settings._kafka import KafkaSettings
from sidecar.settings._postgres import PostgresSettings
from sidecar.settings._secret_files import read_secret_files, refuse_unknown_sections, secrets_dir
from sidecar.settings._sections import (
    ExplainSettings,
    LogSettings,
    RedisSettings,
    ScoringSettings,
    StoreSettings,
    WebSettings,
)

DEFAULT_SECRETS_DIR = Path("/run/secrets/sidecar")

__all__ = [
    "DEFAULT_ENCODER",
    "DEFAULT_SECRETS_DIR",
    "EmbeddingServerSettings",
    "ExplainSettings",
    "KafkaSettings",
    "LogSettings",
    "PostgresSettings",
    "RedisSettings",
    "ScoringSettings",
    "Settings",
    "StoreSettings",
    "WebSettings",
    "load_settings",
    "mask_url_password",
]


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
    embedding_server: EmbeddingServerSettings = EmbeddingServerSettings()
    web: WebSettings = WebSettings()
    explain: ExplainSettings = ExplainSettings()
    log: LogSettings = LogSettings()
    postgres: PostgresSettings = PostgresSettings()


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
