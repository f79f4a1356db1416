"""What every settings section shares: the frozen base, the checks several fields use,
and the flag that defers cross-field checks until secret files are merged in."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SecretStr,
)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"

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


def mask_url_password(url: str) -> str:
    """``url`` without its credentials or password parameters, for messages and logs."""
    from model_store import safe_url

    return safe_url(url)


def _check_kb(kb: str) -> str:
    """``model_store.check_kb`` as the ``ValueError`` pydantic reports as a field error
    (a KB id is no secret: the message names it)."""
    from model_store import InvalidName, check_kb

    try:
        return check_kb(kb)
    except InvalidName as exc:
        message = str(exc)
    raise ValueError(message)
