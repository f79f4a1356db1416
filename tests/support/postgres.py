"""A scratch PostgreSQL database per test module, on the server this machine runs.

The server is the one ``.ci/run`` makes sure is up (127.0.0.1:5432, trust auth), or the
one ``SIDECAR_TEST_POSTGRES_DSN`` names (a DSN of a database whose user may create
databases). Each fixture creates a uniquely named database and drops it at the end;
where no server answers, the tests that need one are skipped, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

ADMIN_DSN = os.environ.get(
    "SIDECAR_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _unavailable() -> str | None:
    """Why no scratch database can be made, or None."""
    try:
        with psycopg.connect(ADMIN_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"no PostgreSQL server at {conninfo.conninfo_to_dict(ADMIN_DSN).get('host')} "
            f"({first}); .ci/run starts the local one, or set SIDECAR_TEST_POSTGRES_DSN"
        )
    return None


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The admin DSN of a server that answers (the tests that need one skip otherwise)."""
    why = _unavailable()
    if why is not None:
        pytest.skip(why)
    return ADMIN_DSN


def create_database(admin_dsn: str) -> str:
    """A new empty database on the server of ``admin_dsn``; its DSN."""
    name = f"sidecar_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return conninfo.make_conninfo(admin_dsn, dbname=name)


def drop_database(admin_dsn: str, dsn: str) -> None:
    name = conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


@pytest.fixture(scope="module")
def scratch_database(postgres_server: str) -> Iterator[str]:
    """The DSN of a database made for this test module, dropped after it."""
    dsn = create_database(postgres_server)
    try:
        yield dsn
    finally:
        drop_database(postgres_server, dsn)
