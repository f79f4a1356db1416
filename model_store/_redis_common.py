"""Key layout, Lua scripts and reply parsing shared by the sync and async Redis stores.

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

# How much of an active pointer a listing reads (a version id has 16 characters).
POINTER_READ_BYTES = 64

# Approximate number of events kept per KB stream (XADD MAXLEN ~).
EVENTS_MAX = 10_000

# Helpers of the pointer scripts. seal_hash: a seal's hash for the writers' compare-and-
# set, '' when there is none or the key holds another type (a writer without the key may
# store anything there; SET then replaces it); the hash, not the value, travels back, so a
# seal of any size stays in Redis. writable: whether a key is of the type a move appends
# to (or absent), checked before the first write so that a move is whole or nothing.
_SEAL_HASH_LUA = """
local function seal_hash(key)
    if redis.call('TYPE', key).ok ~= 'string' then return '' end
    return redis.sha1hex(redis.call('GET', key))
end
local function writable(key, want)
    local t = redis.call('TYPE', key).ok
    return t == want or t == 'none'
end
"""

# Read a pointer for a writer's sealed move: the version, at most ARGV[1] + 1 bytes of the
# seal (a longer one is no seal) and, with ARGV[2] = '1', the seal's hash for the
# compare-and-set. A key of another type reads as absent. Writers run scripts anyway;
# readers (workers, which may hold a read-only ACL user) use MGET instead.
# KEYS[1] active pointer, KEYS[2] seal of the pointer
# Returns {version or nil, seal prefix or nil, seal hash or ''}
READ_POINTER_LUA = (
    _SEAL_HASH_LUA
    + """
local version = false
if redis.call('TYPE', KEYS[1]).ok == 'string' then version = redis.call('GET', KEYS[1]) end
local seal = false
if redis.call('TYPE', KEYS[2]).ok == 'string' then
    seal = redis.call('GETRANGE', KEYS[2], 0, tonumber(ARGV[1]))
end
local hash = ''
if ARGV[2] == '1' then hash = seal_hash(KEYS[2]) end
return {version, seal, hash}
"""
)

# Promote: move the active pointer to ARGV[1], push it on the history, log an event.
# With a signing key (ARGV[6] = '1') the writer also sets the pointer's seal, which it
# signed for ARGV[1] before calling (model_store._seal), but only if the seal is still the
# one it read (its hash ARGV[7]); else another writer moved the pointer in between and the
# caller signs again. With a key, promoting the active version writes a newer seal for it
# ('sealed'): how a key holder vouches again for the version in service.
# KEYS[1] versions zset of the KB   (membership = "fully written")
# KEYS[2] active pointer            (string)
# KEYS[3] history list              (newest first)
# KEYS[4] event stream of the KB
# KEYS[5] seal of the pointer       (string, JSON)
# ARGV[1] version to activate
# ARGV[2] unix time of the change, seconds as text
# ARGV[3] KB id (copied into the event)
# ARGV[4] history entries kept
# ARGV[5] approximate stream length kept
# ARGV[6] '1' to seal, '0' to leave the seal alone (no key)
# ARGV[7] the hash of the seal the caller read ('' for none)
# ARGV[8] the new seal
# Returns {'missing'} | {'corrupt'} (the history or the stream key holds another type:
# nothing is written) | {'raced'} | {'noop', cur} | {'ok' or 'sealed', version,
# previous_or_empty, event_id}
PROMOTE_LUA = (
    _SEAL_HASH_LUA
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {'missing'} end
if not writable(KEYS[3], 'list') or not writable(KEYS[4], 'stream') then return {'corrupt'} end
local sealing = ARGV[6] == '1'
if sealing and seal_hash(KEYS[5]) ~= ARGV[7] then return {'raced'} end
local cur = false
if redis.call('TYPE', KEYS[2]).ok == 'string' then cur = redis.call('GET', KEYS[2]) end
if cur == ARGV[1] then
    if not sealing then return {'noop', cur} end
    redis.call('SET', KEYS[5], ARGV[8])
    local sid = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*',
        'kb', ARGV[3], 'version', ARGV[1], 'previous', cur, 'action', 'seal', 'ts', ARGV[2])
    return {'sealed', ARGV[1], cur, sid}
end
if not cur then cur = '' end
redis.call('SET', KEYS[2], ARGV[1])
if sealing then redis.call('SET', KEYS[5], ARGV[8]) end
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*',
    'kb', ARGV[3], 'version', ARGV[1], 'previous', cur, 'action', 'promote', 'ts', ARGV[2])
return {'ok', ARGV[1], cur, id}
"""
)

# Rollback: pop the history down to the first entry that differs from the active one and
# point at it. Equal neighbours are skipped because a history written by an older gc may
# hold some (``_store.previous_in`` is the same rule in Python). With a key the caller
# read the history and the seal, signed a seal for the version it expects to return to,
# and the script applies it only if both are unchanged ('raced' otherwise).
# KEYS[1..5] as for PROMOTE_LUA
# ARGV[1] unix time of the change, seconds as text
# ARGV[2] KB id (copied into the event)
# ARGV[3] approximate stream length kept
# ARGV[4] '1' to seal, '0' to leave the seal alone (no key)
# ARGV[5] the hash of the seal the caller read ('' for none)
# ARGV[6] the version the caller expects to return to
# ARGV[7] the new seal
# Returns {'nohistory'} | {'missing', prev} | {'corrupt'} | {'raced'} |
# {'ok', version, previous, event_id}
ROLLBACK_LUA = (
    _SEAL_HASH_LUA
    + """
local cur = redis.call('LINDEX', KEYS[3], 0)
local n = 1
local prev = redis.call('LINDEX', KEYS[3], n)
while prev and prev == cur do
    n = n + 1
    prev = redis.call('LINDEX', KEYS[3], n)
end
if not prev then return {'nohistory'} end
if not redis.call('ZSCORE', KEYS[1], prev) then return {'missing', prev} end
if not writable(KEYS[4], 'stream') then return {'corrupt'} end
if ARGV[4] == '1' then
    if seal_hash(KEYS[5]) ~= ARGV[5] or prev ~= ARGV[6] then return {'raced'} end
    redis.call('SET', KEYS[5], ARGV[7])
end
redis.call('LTRIM', KEYS[3], n, -1)
redis.call('SET', KEYS[2], prev)
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
    'kb', ARGV[2], 'version', prev, 'previous', cur, 'action', 'rollback', 'ts', ARGV[1])
return {'ok', prev, cur, id}
"""
)

# Unlist one version unless it is the active or the previous one (the first history entry
# that differs from the active one), and drop it from the history. Removing an entry can
# leave its neighbours equal (C B A B without A is C B B), and a later rollback from B to B
# would change nothing, so the history is rewritten with each run of equal entries as one.
# The version's data keys go in the same script: deleted apart from the unlisting, a put()
# of the same content between the two (it saw the version unlisted, wrote its keys and
# listed it again) would be left listed without its data.
# KEYS[1] versions zset, KEYS[2] active pointer, KEYS[3] history list (newest first),
# KEYS[4] manifest, KEYS[5] meta hash of the version
# ARGV[1] version to unlist, ARGV[2] its chunk key without the index ('...:chunk:'),
# ARGV[3] the most chunks a version has (the meta hash is unsigned: a count rewritten to
# 1e12 or inf would hold Redis in an unkillable loop)
# Returns 1 when unlisted and deleted, 0 when protected.
UNLIST_LUA = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
local h = redis.call('LRANGE', KEYS[3], 0, -1)
for i = 2, #h do
    if h[i] ~= h[1] then
        if h[i] == ARGV[1] then return 0 end
        break
    end
end
redis.call('ZREM', KEYS[1], ARGV[1])
local kept = {}
for _, v in ipairs(h) do
    if v ~= ARGV[1] and v ~= kept[#kept] then kept[#kept + 1] = v end
end
if #kept ~= #h then
    redis.call('DEL', KEYS[3])
    if #kept > 0 then redis.call('RPUSH', KEYS[3], unpack(kept)) end
end
local chunks = tonumber(redis.call('HGET', KEYS[5], 'chunks')) or 0
local most = tonumber(ARGV[3])
if chunks ~= chunks or chunks > most then chunks = most end
for i = 0, chunks - 1 do redis.call('DEL', ARGV[2] .. i) end
redis.call('DEL', KEYS[4], KEYS[5])
return 1
"""


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

    def seal_keys(self, kb: str) -> list[str]:
        """KEYS[1..2] of the pointer read script."""
        return [self.active(kb), self.seal(kb)]

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
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis at {url} is unreachable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise ModelStoreError(f"Redis at {url} failed: {exc}") from exc


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
