"""A KB or a query set read from PostgreSQL, in batches through a server-side cursor.

The source is a table (``docs``, ``rag.docs``, ``"Docs"``: quoted as an identifier, never
pasted into SQL) or a query the operator wrote (``SELECT id, body AS text FROM ...``). It
yields the columns ``text``, ``id`` (required for a KB), ``group`` (queries, optional)
and ``embedding`` (optional): a pgvector ``vector`` / ``halfvec`` where the extension is
installed, or a ``real[]`` / ``double precision[]`` array. Everything runs in one READ
ONLY, REPEATABLE READ transaction, so a query cannot write and the KB and its query sets
are read from one snapshot. Rows come ``postgres.fetch_rows`` at a time, in the binary
protocol; float arrays go straight from the wire into numpy.

The DSN is a secret: no message repeats it, and the password it may hold is scrubbed from
the driver's messages.
"""

from __future__ import annotations

import contextlib
import logging
import re
import struct
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import numpy as np

from sidecar.errors import ConfigError, DataError, SourceUnavailable
from sidecar.settings import PostgresSettings
from sidecar.training._source_rows import (
    EMBEDDING,
    GROUP,
    ID,
    TEXT,
    RowBatch,
    RowCollector,
    SourceRows,
    stack_vectors,
)

log = logging.getLogger(__name__)

# float4[] and float8[] (pg_type oids, fixed by PostgreSQL)
_FLOAT4_ARRAY, _FLOAT8_ARRAY = 1021, 1022
_ELEMENT = {700: np.dtype(">f4"), 701: np.dtype(">f8")}  # float4, float8
_PART = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_TABLE = re.compile(rf"\s*({_PART})(?:\s*\.\s*({_PART}))?\s*")
_QUERY_WORDS = ("select", "with", "values", "table")


def float_arrays(values: list[Any], given: str, first_row: int) -> np.ndarray:
    """``real[]`` or ``double precision[]`` values, as PostgreSQL sends them in binary, as
    one (n, dim) float32 array, parsed for the whole batch at once.

    The binary format: ndim, a has-NULL flag and the element type (int32 each), then the
    length and lower bound of each dimension, then each element as its byte length and its
    big-endian value. A NULL row, NULL elements, more than one dimension or rows of
    different lengths are a :class:`~sidecar.errors.DataError` naming the row.
    """

    def row(i: int) -> str:
        return f"{given}: row {first_row + i + 1}: 'embedding'"

    if not values:
        return np.empty((0, 0), dtype=np.float32)
    for i, v in enumerate(values):
        if v is None:
            raise DataError(
                f"{row(i)} is NULL: filter such rows out (WHERE embedding IS NOT NULL), or "
                "leave the column out to embed every text here"
            )
    sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    if (sizes != sizes[0]).any():
        odd = int(np.argmax(sizes != sizes[0]))
        raise DataError(
            f"{row(odd)} has {_length(values[odd])} values, row {first_row + 1} has "
            f"{_length(values[0])}"
        )
    raw = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), -1)
    if raw.shape[1] < 12:
        raise DataError(f"{row(0)} is not an array")
    head = raw[:, :12].copy().view(">i4")  # ndim, has-NULL flag, element type
    for bad, why in (
        (head[:, 0] > 1, "is a multi-dimensional array, not a vector"),
        (head[:, 0] == 0, "is an empty array"),
        (head[:, 1] != 0, "holds NULL elements"),
    ):
        if bad.any():
            raise DataError(f"{row(int(np.argmax(bad)))} {why}")
    oid = int(head[0, 2])
    if oid not in _ELEMENT or (head[:, 2] != oid).any():
        raise DataError(f"{row(0)} is an array of type oid {oid}, not of floats")
    item = np.dtype([("len", ">i4"), ("v", _ELEMENT[oid])])
    body = raw[:, 20:]
    if body.shape[1] % item.itemsize:
        raise DataError(f"{row(0)} is a truncated array")
    rec = np.ascontiguousarray(body).view(item)  # (n, dim) records
    return rec["v"].astype(np.float32)


def _length(value: bytes) -> int:
    """The element count of one binary float array (for messages)."""
    return struct.unpack_from("!i", value, 12)[0] if len(value) >= 16 else 0


def vector_values(value: Any) -> np.ndarray | None:
    """A pgvector ``Vector`` / ``HalfVector`` (or an array already) as 1-D float32."""
    if value is None:
        return None
    to_numpy = getattr(value, "to_numpy", None)
    return np.asarray(to_numpy() if to_numpy else value, dtype=np.float32).ravel()


def parse_table(source: str) -> tuple[str, ...] | None:
    """``source`` as a table name (schema-qualified or not) in its parts, folded as
    PostgreSQL folds them (unquoted: lower case), or None when it is not a table name."""
    m = _TABLE.fullmatch(source)
    if m is None:
        return None
    parts = [p for p in m.groups() if p is not None]
    return tuple(p[1:-1].replace('""', '"') if p.startswith('"') else p.lower() for p in parts)


def _query_text(source: str, option: str) -> str:
    query = source.strip().rstrip(";").strip()
    first = query.split(None, 1)[0].lower() if query else ""
    if first.lstrip("(") not in _QUERY_WORDS:
        raise ConfigError(
            f"{option} takes a table (schema.table) or a read-only query (SELECT ...), "
            f"got {_short(source)!r}"
        )
    return query


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _masked(text: str, secrets: list[str]) -> str:
    """``text`` with every secret replaced, and anything after a ``password=`` or inside
    a URI's user info masked as well (for a DSN that could not be parsed)."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", text, flags=re.I)
    return re.sub(r"(postgres(?:ql)?://)[^\s\"]*@", r"\1***@", text)


class PostgresSource:
    """One connection and one read-only transaction, for every input read from it.

    Use as a context manager; :meth:`read` reads one source whole. ``settings`` holds the
    DSN (``postgres.dsn``), the password and the batch size.
    """

    def __init__(self, settings: PostgresSettings, *, option: str = "--kb-sql") -> None:
        self.settings = settings
        self._option = option  # the first option that asked for a database, for messages
        self._conn: Any = None
        self._dsn = settings.dsn.get_secret_value() if settings.dsn else ""
        self._secrets = [self._dsn] + (
            [settings.password.get_secret_value()] if settings.password else []
        )
        self._vector_types = False

    def __enter__(self) -> PostgresSource:
        self._connect()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a broken connection has nothing to undo
                self._conn.rollback()
            self._conn.close()
            self._conn = None

    @property
    def where(self) -> str:
        """host:port/dbname of the database, for messages (no user, no password)."""
        if self._conn is None:
            return "PostgreSQL"
        info = self._conn.info
        return f"PostgreSQL {info.host}:{info.port}/{info.dbname}"

    def _connect(self) -> None:
        import psycopg
        from psycopg import conninfo

        if not self._dsn:
            raise ConfigError(
                f"{self._option} reads from PostgreSQL, but postgres.dsn is not set: give it "
                "as the secret file postgres__dsn (in SIDECAR_SECRETS_DIR) or as "
                "SIDECAR_POSTGRES__DSN"
            )
        problem = None
        try:
            params = conninfo.conninfo_to_dict(self._dsn)
        except psycopg.ProgrammingError as exc:
            problem = self._scrub(str(exc).strip().replace(self._dsn, "<dsn>"))
        if problem is not None:
            raise ConfigError(f"postgres.dsn is not a valid connection string: {problem}")
        self._secrets.append(str(params.get("password") or ""))
        kwargs: dict[str, Any] = {
            "connect_timeout": self.settings.connect_timeout_s,
            "application_name": "ood-sidecar",
        }
        if self.settings.password is not None:
            kwargs["password"] = self.settings.password.get_secret_value()
        host = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        try:
            conn = psycopg.connect(self._dsn, **kwargs)
        except psycopg.Error as exc:
            problem = self._scrub(_first_line(exc))
        if problem is not None:
            raise SourceUnavailable(f"cannot connect to PostgreSQL at {host}: {problem}")
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._conn = conn
        try:
            self._register_types()
        except psycopg.Error as exc:
            problem = f"{self.where}: {self._scrub(_first_line(exc))}"
        if problem is not None:
            self.close()  # __exit__ is not called when __enter__ fails
            raise SourceUnavailable(problem)

    def _register_types(self) -> None:
        from psycopg.adapt import Loader
        from psycopg.pq import Format
        from psycopg.types import TypeInfo

        class FloatArrayLoader(Loader):
            """The array's bytes as they are: a batch is parsed at once (float_arrays)."""

            format = Format.BINARY

            def load(self, data: Any) -> bytes:
                return bytes(data)

        for oid in (_FLOAT4_ARRAY, _FLOAT8_ARRAY):
            self._conn.adapters.register_loader(oid, FloatArrayLoader)
        if TypeInfo.fetch(self._conn, "vector") is not None:
            from pgvector.psycopg import register_vector

            register_vector(self._conn)
            self._vector_types = True

    def _scrub(self, message: str) -> str:
        return _masked(message, self._secrets)

    def read(self, source: str, *, option: str, kb: bool, progress: bool = True) -> SourceRows:
        """Every row of ``source`` (a table or a query), checked: what ``option`` names."""
        given = f"{option} {_short(source)}"
        collector = RowCollector(given, kb=kb)
        for batch in self.batches(source, option=option, kb=kb, progress=progress):
            collector.add(batch)
        return collector.finish()

    def batches(
        self, source: str, *, option: str, kb: bool, progress: bool = True
    ) -> Iterator[RowBatch]:
        """The rows of ``source`` as :class:`RowBatch` objects of at most
        ``postgres.fetch_rows`` rows, from a server-side cursor."""
        import psycopg

        given = f"{option} {_short(source)}"
        problem = None
        try:
            yield from self._batches(source, given, option, kb=kb, progress=progress)
        except psycopg.Error as exc:
            problem = self._scrub(_first_line(exc))
            if isinstance(exc, psycopg.OperationalError):
                raise SourceUnavailable(f"{given}: {self.where}: {problem}") from None
        if problem is not None:
            raise DataError(f"{given}: {problem}")

    def _batches(
        self, source: str, given: str, option: str, *, kb: bool, progress: bool
    ) -> Iterator[RowBatch]:
        from psycopg import sql
        from tqdm.auto import tqdm

        table = parse_table(source)
        if table is not None:
            columns = self._table_columns(table, given)
            query: Any = sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(*table)
            )
            total = self._estimate_rows(table)
        else:
            query, total = sql.SQL(_query_text(source, option)), None
        name = "sidecar_" + option.strip("-").replace("-", "_")
        with self._conn.cursor(name=name, binary=True) as cur:
            cur.itersize = self.settings.fetch_rows
            cur.execute(query)
            col = self._columns(cur, given, kb=kb)
            arrays = EMBEDDING in col and cur.description[col[EMBEDDING]].type_code in (
                _FLOAT4_ARRAY,
                _FLOAT8_ARRAY,
            )
            done = 0
            bar = tqdm(total=total, desc=f"reading {given}", unit="row", disable=not progress)
            with bar:
                while rows := cur.fetchmany(self.settings.fetch_rows):
                    yield self._batch(rows, col, given, done, arrays=arrays)
                    done += len(rows)
                    bar.update(len(rows))
                bar.total = done
        log.info("%s: %s rows read from %s", given, done, self.where)

    def _table_columns(self, table: tuple[str, ...], given: str) -> list[str]:
        """The columns of ``table`` the reader takes, in a fixed order."""
        from psycopg import sql

        with self._conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(sql.Identifier(*table)))
            names = [d.name for d in cur.description]
        return [c for c in (ID, TEXT, GROUP, EMBEDDING) if c in names] or names

    def _estimate_rows(self, table: tuple[str, ...]) -> int | None:
        """The planner's row count of ``table`` (for the progress bar; None when unknown)."""
        from psycopg import sql

        name = sql.Identifier(*table).as_string(self._conn)
        with self._conn.cursor() as cur:
            cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", (name,))
            row = cur.fetchone()
        return int(row[0]) if row and row[0] and row[0] > 0 else None

    def _columns(self, cur: Any, given: str, *, kb: bool) -> dict[str, int]:
        """Position of each column the reader takes; DataError for a missing or odd one."""
        names = [d.name for d in cur.description]
        col = {n: names.index(n) for n in (ID, TEXT, GROUP, EMBEDDING) if n in names}
        need = (ID, TEXT) if kb else (TEXT,)
        missing = [n for n in need if n not in col]
        if missing:
            raise DataError(
                f"{given}: no column {' or '.join(map(repr, missing))} (it yields "
                f"{', '.join(names) or 'no columns'}); name them with AS, e.g. "
                "SELECT doc_id AS id, body AS text FROM ..."
            )
        if EMBEDDING in col:
            oid = cur.description[col[EMBEDDING]].type_code
            if oid not in (_FLOAT4_ARRAY, _FLOAT8_ARRAY) and not self._is_vector(oid):
                kind = cur.description[col[EMBEDDING]].type_display
                raise DataError(
                    f"{given}: column 'embedding' is {kind}: expected a pgvector vector or "
                    "a real[] / double precision[] array (cast it: embedding::real[])"
                )
        return col

    def _is_vector(self, oid: int) -> bool:
        if not self._vector_types:
            return False
        from psycopg.types import TypeInfo

        names = {
            info.oid
            for t in ("vector", "halfvec")
            if (info := TypeInfo.fetch(self._conn, t)) is not None
        }
        return oid in names

    def _batch(
        self, rows: list[Any], col: dict[str, int], given: str, done: int, *, arrays: bool
    ) -> RowBatch:
        def column(name: str) -> list[Any] | None:
            return [r[col[name]] for r in rows] if name in col else None

        emb = column(EMBEDDING)
        if emb is None:
            vectors = None
        elif arrays:
            vectors = float_arrays(emb, given, done)
        else:
            vectors = stack_vectors([vector_values(v) for v in emb], given, done)
        return RowBatch(
            texts=column(TEXT) or [], ids=column(ID), groups=column(GROUP), embeddings=vectors
        )


def _first_line(exc: Exception) -> str:
    """The server's own message where there is one (not the DECLARE it was wrapped in)."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = (primary or str(exc) or type(exc).__name__).strip().splitlines()[0]
    return " ".join(text.split())
