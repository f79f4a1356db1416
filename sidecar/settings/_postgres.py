"""The PostgreSQL section: where ``sidecar train`` and ``sidecar check`` read a KB and query
sets kept in a database (``--kb-sql``, ``--id-queries-sql``, ...)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from sidecar.settings._fields import _not_blank, _Section


class PostgresSettings(_Section):
    """The PostgreSQL database that holds the KB and the query sets (read only)."""

    dsn: SecretStr | None = Field(
        None,
        description="connection string of the database the --*-sql inputs are read from "
        "(postgresql://USER@HOST:5432/DB?sslmode=require, or key=value pairs); it may hold "
        "the password, so it is a secret: give it as the secret file postgres__dsn",
    )
    password: SecretStr | None = Field(
        None,
        description="password, for a DSN that holds none; give it as the secret file "
        "postgres__password",
    )
    connect_timeout_s: int = Field(
        10, ge=1, description="seconds to wait for a connection before giving up"
    )
    fetch_rows: int = Field(
        5000,
        ge=1,
        le=1_000_000,
        description="rows fetched per round trip from the server-side cursor (one batch in "
        "memory at a time)",
    )

    @field_validator("dsn")
    @classmethod
    def _dsn_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "postgres.dsn", "unset it if no input comes from PostgreSQL")

    @field_validator("password")
    @classmethod
    def _password_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "postgres.password", "unset it for no password")
