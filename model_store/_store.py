"""What every model store offers: the sync and async protocols and the event record.

A store holds immutable artifact versions per knowledge base (KB), a per-KB ``active``
pointer, the stack of versions that were active (``history``, newest first, so
``history[0]`` is the active version and ``history[1]`` the previous one) and an ordered,
replayable event log of pointer changes.

``promote(kb, v)`` pushes ``v`` on the history stack; ``rollback(kb)`` pops it, so the
active version returns to the one before; a second rollback walks one further back.
``gc`` removes deleted versions from the history and collapses the equal neighbours that
this can leave (``B A B`` without ``A`` is ``B``), so every rollback changes the version.

With a signing key, promote and rollback also seal the pointer (:mod:`model_store._seal`),
and ``active_pointer`` returns the active version only when its seal holds; ``active``
reads the pointer as it is, for listings.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from model_store._artifact import Artifact, decode
from model_store._errors import ArtifactCorrupt, InvalidName
from model_store._npz import max_npz_bytes
from model_store._seal import ActivePointer

Action = Literal["promote", "rollback", "seal"]

# KB ids end up in Redis keys and directory names: keep them plain.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
# Version ids are 16 hex digits (``Artifact.version``).
_VERSION = re.compile(r"^[0-9a-f]{16}$")

# History entries kept per KB; far more than rollback ever needs.
HISTORY_MAX = 100


def check_kb(kb: str) -> str:
    """Return ``kb`` if it is a valid KB id, else raise :class:`InvalidName`."""
    if not isinstance(kb, str) or not _NAME.match(kb) or ".." in kb:
        raise InvalidName(f"invalid KB id {kb!r}: use letters, digits, '_', '-', '.'")
    return kb


def check_version(version: str) -> str:
    """Return ``version`` if it looks like a version id, else raise :class:`InvalidName`."""
    if not isinstance(version, str) or not _VERSION.match(version):
        raise InvalidName(f"invalid version id {version!r}: expected 16 hex digits")
    return version


def previous_in(history: Sequence[str]) -> str | None:
    """The version a rollback returns to: the first entry after the active one that differs.

    Equal neighbours do not arise any more (gc collapses them), but a history written by an
    older gc may still hold some, and rolling back onto the active version changes nothing.
    """
    return next((v for v in history[1:] if v != history[0]), None) if history else None


# The smallest chunk a Redis store writes (its chunk_bytes); the settings' floor is 64 KiB.
MIN_CHUNK_BYTES = 1024
# The most chunks of one version (256 GiB at the default 4 MiB): bounds every loop over them.
MAX_CHUNKS = 65536


def _meta_int(meta: Mapping[str, Any], key: str, where: str) -> int:
    # The metadata is unsigned and, in Redis, writable by anyone who can reach the server.
    try:
        return int(meta[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactCorrupt(f"{where}: metadata {key!r} is missing or not a number") from exc


def stored_chunks(
    kb: str, version: str, manifest: Mapping[str, Any], meta: Mapping[str, Any]
) -> int:
    """The chunk count in ``meta``, once it and the recorded size fit what the verified
    ``manifest`` declares, so that rewritten metadata cannot make a reader fetch without bound.
    """
    where = f"version {version} of KB {kb!r}"
    size, chunks = _meta_int(meta, "size", where), _meta_int(meta, "chunks", where)
    limit = max_npz_bytes(manifest["arrays"])
    if not 0 <= size <= limit:
        raise ArtifactCorrupt(
            f"{where}: arrays are recorded as {size} bytes; the manifest allows at most {limit}"
        )
    # A writer's chunks hold at least MIN_CHUNK_BYTES each (but the last): a count past
    # that would only make the reader queue one command per chunk before refusing it.
    if not 1 <= chunks <= min(MAX_CHUNKS, max(1, -(-size // MIN_CHUNK_BYTES))):
        raise ArtifactCorrupt(f"{where}: {chunks} chunks cannot hold {size} bytes")
    return chunks


def check_chunk_lengths(
    kb: str, version: str, lengths: Sequence[int], meta: Mapping[str, Any]
) -> None:
    """Refuse chunks whose stored lengths (STRLEN, before any GET) do not add up to the
    recorded size, which :func:`stored_chunks` has bounded by the manifest: a chunk
    rewritten to gigabytes would otherwise be fetched into every reader's memory."""
    where = f"version {version} of KB {kb!r}"
    size = _meta_int(meta, "size", where)
    if any(int(n) == 0 for n in lengths):
        raise ArtifactCorrupt(f"{where} is missing chunks")
    if sum(int(n) for n in lengths) != size:
        raise ArtifactCorrupt(
            f"{where}: its chunks hold {sum(int(n) for n in lengths)} bytes, {size} are recorded"
        )


def stored_info(
    kb: str, version: str, manifest_bytes: bytes, meta: Mapping[str, Any]
) -> VersionInfo:
    """A :class:`VersionInfo` from stored bytes (listing only: the manifest is not verified)."""
    where = f"version {version} of KB {kb!r}"
    try:
        manifest = json.loads(manifest_bytes)
        stored_at = float(meta.get("stored_at", 0))
    except (ValueError, TypeError, RecursionError) as exc:
        raise ArtifactCorrupt(f"{where}: bad manifest or metadata") from exc
    if not isinstance(manifest, dict):
        raise ArtifactCorrupt(f"{where}: bad manifest")
    return VersionInfo(kb, version, stored_at, _meta_int(meta, "size", where), manifest)


def verified_artifact(
    kb: str,
    version: str,
    manifest_bytes: bytes,
    arrays_bytes: bytes,
    meta: Mapping[str, Any],
    *,
    hmac_key: bytes | None,
    expected_encoder: Mapping[str, Any] | None,
) -> Artifact:
    """Check the stored bytes against their recorded size and sha256, decode, and check that
    the content still hashes to ``version`` and names ``kb`` (a rewritten manifest does not).

    The size and sha256 come from unsigned metadata, so they catch accidents, not attacks;
    :func:`~model_store._artifact.decode` checks the arrays against the manifest before
    numpy reads them.
    """
    where = f"version {version} of KB {kb!r}"
    size = _meta_int(meta, "size", where)
    if len(arrays_bytes) != size:
        raise ArtifactCorrupt(f"{where}: arrays have {len(arrays_bytes)} bytes, not {size}")
    if hashlib.sha256(arrays_bytes).hexdigest() != meta.get("sha256"):
        raise ArtifactCorrupt(f"{where}: arrays checksum mismatch")
    artifact = decode(
        manifest_bytes, arrays_bytes, hmac_key=hmac_key, expected_encoder=expected_encoder
    )
    if artifact.version != version or artifact.kb != kb:
        raise ArtifactCorrupt(f"{where}: content hashes to {artifact.kb}/{artifact.version}")
    return artifact


@dataclass(frozen=True)
class StoreEvent:
    """One change of a KB's active pointer.

    Attributes
    ----------
    id : str
        Position in the KB's event log (a Redis stream id, or a sequence number for the
        directory store); opaque, pass it back as ``events(kb, after=id)``.
    kb, version : str
        The KB and the version that became active.
    previous : str or None
        The version that was active before.
    action : {"promote", "rollback", "seal"}
        ``seal``: the active version stayed and a key holder sealed it anew.
    ts : float
        Unix time (seconds) of the change.
    """

    id: str
    kb: str
    version: str
    previous: str | None
    action: str
    ts: float

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kb": self.kb,
            "version": self.version,
            "previous": self.previous,
            "action": self.action,
            "ts": self.ts,
        }


@dataclass(frozen=True)
class VersionInfo:
    """A stored version as listed: its manifest plus when and how big it was stored."""

    kb: str
    version: str
    stored_at: float
    size_bytes: int
    manifest: Mapping[str, Any]


@runtime_checkable
class ModelStore(Protocol):
    """Synchronous store, used by the CLI and the training job."""

    #: The signing key: manifests are signed on put and pointer moves sealed (None: off).
    hmac_key: bytes | None

    def put(self, artifact: Artifact) -> str:
        """Store ``artifact`` (signed when a key is configured); return its version.

        Idempotent: the version id is derived from the content.
        """
        ...

    def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        """Read, verify (checksums, signature, schema, encoder) and return a version."""
        ...

    def manifest(self, kb: str, version: str) -> dict[str, Any]: ...

    def info(self, kb: str, version: str) -> VersionInfo: ...

    def versions(self, kb: str) -> list[str]:
        """Stored versions of ``kb``, oldest first."""
        ...

    def kbs(self) -> list[str]: ...

    def active(self, kb: str) -> str | None:
        """The version the pointer names, sealed or not."""
        ...

    def active_pointer(self, kb: str) -> ActivePointer | None:
        """The active version with its seal checked when a key is configured (else
        :class:`~model_store.PointerUnsealed`); None when no version is active."""
        ...

    def previous(self, kb: str) -> str | None: ...

    def history(self, kb: str) -> list[str]:
        """Versions that were active, newest first (``[0]`` is the active one)."""
        ...

    def promote(self, kb: str, version: str) -> StoreEvent | None:
        """Make ``version`` active; ``None`` when it already was (nothing changes).

        With a key, promoting the active version whose seal does not hold seals it
        anew (an event with action ``seal``)."""
        ...

    def rollback(self, kb: str) -> StoreEvent:
        """Return to the version that was active before the current one."""
        ...

    def events(self, kb: str, after: str | None = None) -> list[StoreEvent]:
        """Pointer changes of ``kb`` in order, those after event id ``after`` only."""
        ...

    def gc(self, kb: str) -> list[str]:
        """Delete versions beyond the retention setting; never the active or previous."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncModelStore(Protocol):
    """The read side the stream processor needs, for asyncio."""

    async def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact: ...

    async def active(self, kb: str) -> str | None: ...

    async def active_pointer(self, kb: str) -> ActivePointer | None:
        """As :meth:`ModelStore.active_pointer`; a long-lived store also refuses a seal
        older than one it returned before (a replayed pointer)."""
        ...

    async def previous(self, kb: str) -> str | None: ...

    async def last_event_id(self, kb: str) -> str:
        """The id of the newest event of ``kb`` (``"0"`` when there is none)."""
        ...

    async def wait_events(self, after: Mapping[str, str], timeout_s: float) -> Sequence[StoreEvent]:
        """Events after ``after[kb]`` for each KB, waiting up to ``timeout_s`` for one."""
        ...

    async def close(self) -> None: ...
