"""Key layout and reply parsing shared by the sync and async Redis stores (the Lua scripts
are in :mod:`model_store._scripts`).

Keys (``P`` is the configured prefix, ``KB`` the KB id, ``V`` a version id)::

    P:kbs                      set      KBs that have at least one version
    P:kb:KB:versions           zset     V -> stored_at; a version is listed only when whole
    P:kb:KB:v:V:manifest       string   canonical manifest JSON (signed when a key is set)
    P:kb:KB:v:V:meta           hash     chunks, size, sha256 (of the npz bytes), stored_at
    P:kb:KB:v:V:chunk:I        string   I-th slice of the npz bytes (``chunk_bytes`` each)
    P:kb:KB:active             string   the version in service
    P:kb:KB:seal               string   the pointer's seal (JSON; with a signing key)
    P:kb:KB:history            list     versions that were active, newest first
    P:kb:KB:events             stream   {kb, version, previous, action, ts} per pointer change
"""

from __future__ import annotations

import contextlib
import re
import ssl
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.exceptions

from model_store._artifact import MANIFEST_MAX_BYTES
from model_store._errors import (
    ArtifactCorrupt,
    ModelStoreError,
    StoreAccessDenied,
    StoreMisconfigured,
    StoreUnavailable,
)
from model_store._store import StoreEvent

# Approximate number of events kept per KB stream (XADD MAXLEN ~).
EVENTS_MAX = 10_000


@dataclass(frozen=True)
class Keys:
    """Redis key names for one prefix."""

    prefix: str

    @property
    def kbs(self) -> str:
        return f"{self.prefix}:kbs"

    def kb(self, kb: str) -> str:
        return f"{self.prefix}:kb:{kb}"

    def versions(self, kb: str) -> str:
        return f"{self.kb(kb)}:versions"

    def active(self, kb: str) -> str:
        return f"{self.kb(kb)}:active"

    def history(self, kb: str) -> str:
        return f"{self.kb(kb)}:history"

    def seal(self, kb: str) -> str:
        return f"{self.kb(kb)}:seal"

    def events(self, kb: str) -> str:
        return f"{self.kb(kb)}:events"

    def manifest(self, kb: str, version: str) -> str:
        return f"{self.kb(kb)}:v:{version}:manifest"

    def meta(self, kb: str, version: str) -> str:
        return f"{self.kb(kb)}:v:{version}:meta"

    def chunk(self, kb: str, version: str, i: int) -> str:
        return f"{self.chunks(kb, version)}{i}"

    def chunks(self, kb: str, version: str) -> str:
        """The chunk keys' common start (the index follows)."""
        return f"{self.kb(kb)}:v:{version}:chunk:"

    def pointer_keys(self, kb: str) -> list[str]:
        """KEYS[1..5] of the promote and rollback scripts."""
        return [
            self.versions(kb),
            self.active(kb),
            self.history(kb),
            self.events(kb),
            self.seal(kb),
        ]

    def kb_from_events_key(self, key: str) -> str:
        return key[len(self.prefix) + len(":kb:") : -len(":events")]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def loose_text(value: Any) -> str | None:
    """A value as text, bytes that are not UTF-8 replaced (it then names no version and
    matches no seal); None for none."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def opt_text(value: Any) -> str | None:
    if value is None:
        return None
    s = text(value)
    return s or None


def parse_event(event_id: Any, fields: Mapping[Any, Any], kb: str) -> StoreEvent:
    """The event of one stream entry of ``kb``'s stream.

    The KB is the stream's, not the entry's own field: an entry written by hand without
    one (or with a time that is not a number) still moves a reader's cursor past it, where
    a failure to parse it would have stopped that reader at it for good.
    """
    f = {loose_text(k) or "": loose_text(v) or "" for k, v in fields.items()}
    try:
        ts = float(f.get("ts") or 0)
    except ValueError:
        ts = 0.0
    return StoreEvent(
        id=text(event_id),
        kb=kb,
        version=f.get("version", ""),
        previous=f.get("previous") or None,
        action=f.get("action", ""),
        ts=ts,
    )


def script_event(reply: list[Any], kb: str, action: str, ts: float) -> StoreEvent:
    """Build the event from an ``{'ok', version, previous, id}`` script reply."""
    return StoreEvent(
        id=text(reply[3]),
        kb=kb,
        version=text(reply[1]),
        previous=loose_text(reply[2]) or None,
        action=action,
        ts=ts,
    )


def split_chunks(data: bytes, chunk_bytes: int) -> list[bytes]:
    """Slice ``data`` into pieces of at most ``chunk_bytes`` (at least one piece)."""
    return [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


@contextlib.contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn redis-py errors into the store's own (works around ``await`` too)."""
    try:
        yield
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
        said = str(exc)
        if "HELLO must be called" in said or "NOAUTH" in said:
            said = "it needs a password (redis.password, or the secret file redis__password)"
        raise StoreAccessDenied(f"Redis at {url} refused the credentials: {said}") from exc
    except redis.exceptions.NoPermissionError as exc:
        # an ACL user without a command or key pattern it needs: the same next time
        raise StoreAccessDenied(
            f"Redis at {url} refused a command to this user: {exc} (see the ACL rules in "
            "the deployment guide)"
        ) from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        tls = _tls_failure(exc)
        if tls is not None:
            raise StoreAccessDenied(f"Redis at {url}: {tls}") from exc
        raise StoreUnavailable(f"Redis at {url} is unreachable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise ModelStoreError(f"Redis at {url} failed: {exc}") from exc


def _tls_failure(exc: BaseException) -> str | None:
    """What went wrong in a TLS handshake behind a redis-py connection error, or None.

    A certificate that does not verify, or a server that refuses ours, fails the same way
    on every try: said as such rather than as an outage that retrying may cure.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = cause.verify_message or cause.reason or "it did not verify"
            return (
                f"the server's TLS certificate did not verify ({why}): redis.ssl_ca_file must "
                "name the CA that signed it, and the URL's host must be a name in it"
            )
        if isinstance(cause, ssl.SSLError):
            why = cause.reason or str(cause)
            return (
                f"the TLS handshake failed ({why}): a server that requires client "
                "certificates needs redis.ssl_cert_file and redis.ssl_key_file; a rediss:// "
                "URL needs a port where the server speaks TLS"
            )
        cause = cause.__cause__ or cause.__context__
    return None


def _no_passphrase() -> str:
    # OpenSSL would ask for an encrypted key's passphrase on the terminal
    raise ValueError("the key is encrypted; give an unencrypted PEM key")


def tls_options(
    url: str,
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> dict[str, Any]:
    """redis-py's TLS arguments for a ``rediss://`` URL, each file loaded once here.

    redis-py reads the files at the first connection, deep inside a retry loop; loading
    them here makes a missing or unreadable file, or an encrypted key (which OpenSSL would
    ask a passphrase for on the terminal), one :class:`StoreMisconfigured` at start.
    """
    files = {"ssl_ca_certs": ca_file, "ssl_certfile": cert_file, "ssl_keyfile": key_file}
    given = {name: path for name, path in files.items() if path}
    if not given:
        return {}
    if not url.lower().startswith("rediss://"):
        raise StoreMisconfigured(
            f"Redis TLS files given for {safe_url(url)}: TLS needs a rediss:// URL"
        )
    if key_file and not cert_file:
        raise StoreMisconfigured("a Redis TLS key file needs its certificate file")
    what = f"the Redis TLS CA file {ca_file}"
    try:
        context = ssl.create_default_context(cafile=ca_file or None)
        if cert_file:
            what = f"the Redis TLS client certificate {cert_file}" + (
                f" and key {key_file}" if key_file else " (holding its key)"
            )
            context.load_cert_chain(cert_file, key_file or None, password=_no_passphrase)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        if isinstance(exc, ssl.SSLError):
            why = f"{exc.reason or exc} (not PEM, or a key that does not match the certificate)"
        else:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StoreMisconfigured(f"cannot load {what}: {type(exc).__name__}: {why}") from None
    return given


def safe_url(url: str) -> str:
    """``url`` without user info or password parameters, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # Everything up to the last '@' may be credentials. redis-py (urlparse) takes the host
    # after the last '@' of a netloc that ends at the first '/', '?' or '#', so a password
    # holding one of those spills past it: cut at the last '@' of the whole remainder.
    hidden = "***@" if "@" in rest else ""
    rest = rest.rpartition("@")[2]
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
    except ValueError:
        return f"{scheme}{sep}{hidden}<unparsable>"
    # redis-py turns every query parameter into a client argument, password included.
    query = "&".join(
        f"{piece.partition('=')[0]}=***" if _is_secret(piece.partition("=")[0]) else piece
        for piece in parts.query.split("&")
        if piece
    )
    # The fragment is dropped: redis-py ignores it, and a password may have spilled into it.
    return f"{scheme}{sep}{hidden}{parts.netloc}{parts.path}{'?' if query else ''}{query}"


# Query parameter names that may carry a credential (password=, api_key=, token=, sig=...).
_SECRET_PARAM_WORDS = ("pass", "pwd", "secret", "token", "key", "auth", "credential", "sig")


def _is_secret(raw_key: str) -> bool:
    name = urllib.parse.unquote_plus(raw_key).lower()
    return any(word in name for word in _SECRET_PARAM_WORDS)


_Client = TypeVar("_Client")


def _url_problem(url: str) -> str | None:
    """What is wrong with a Redis URL that redis-py would take anyway, or None.

    redis-py reads no host as localhost, and ``/abc`` as database 0 and ``/1/2`` as
    database 12: a typo would send the models to another server or database.
    """
    try:
        # Parsed as redis-py parses it (urlparse): its host ends at the first '/', '?'
        # or '#', so an unencoded one in a password moves the host into the path.
        where = urllib.parse.urlparse(url)
    except ValueError:
        return None  # redis-py refuses it, with the message below
    if where.scheme not in ("redis", "rediss", "unix"):
        return None  # redis-py refuses these itself
    query = urllib.parse.parse_qs(where.query)
    if where.scheme == "unix":
        return None if where.path else "names no socket path"
    if not where.hostname and "host" not in query:
        hint = " (a '/', '?' or '#' in a password must be %-encoded)" if "@" in url else ""
        return f"names no host{hint}"
    if not re.fullmatch(r"/?(\d+/?)?", where.path):
        return "has a database that is not a number (redis://host:port/0)"
    return None


def client_from_url(from_url: Callable[..., _Client], url: str, **kwargs: Any) -> _Client:
    """``from_url(url, **kwargs)``, with a URL redis-py rejects, or would read as another
    host or database than written, as :class:`StoreMisconfigured`."""
    problem = _url_problem(url)
    if problem:
        raise StoreMisconfigured(f"invalid Redis URL {safe_url(url)}: it {problem}") from None
    try:
        return from_url(url, **kwargs)
    except ValueError:
        # Not chained: redis-py's message can quote part of the URL (a stray '#' in a
        # password lands in the "port" it complains about), and tracebacks reach logs.
        raise StoreMisconfigured(
            f"invalid Redis URL {safe_url(url)}: expected redis://[[user]:password@]host"
            "[:port][/db], rediss://... or unix:///path/to/socket"
        ) from None


def queue_manifest_and_meta(pipe: Any, keys: Keys, kb: str, version: str) -> None:
    """Queue the reads of a version's manifest (at most MANIFEST_MAX_BYTES of it) and meta."""
    pipe.strlen(keys.manifest(kb, version))
    pipe.getrange(keys.manifest(kb, version), 0, MANIFEST_MAX_BYTES)
    pipe.hgetall(keys.meta(kb, version))


def manifest_and_meta(
    replies: Sequence[Any], kb: str, version: str
) -> tuple[bytes, dict[str, str]]:
    """The manifest bytes and meta from :func:`queue_manifest_and_meta`'s replies; a manifest
    past the bound is refused before it is fetched whole (a value may hold 512 MB)."""
    size, manifest_bytes, raw_meta = replies
    if not size or not raw_meta:
        raise ArtifactCorrupt(f"version {version} of KB {kb!r} has no manifest")
    if int(size) > MANIFEST_MAX_BYTES:
        raise ArtifactCorrupt(
            f"version {version} of KB {kb!r}: its manifest has {size} bytes, "
            f"at most {MANIFEST_MAX_BYTES} can be valid"
        )
    return bytes(manifest_bytes), {text(a): text(b) for a, b in raw_meta.items()}
