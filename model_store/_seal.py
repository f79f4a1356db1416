"""Sealed active pointers: which version is in service, signed like the versions are.

A manifest's HMAC says who built a version, not who made it active. With a signing key
configured, every pointer move (promote, rollback) also writes a *seal*: canonical JSON
``{"kb", "version", "seq", "sig"}`` with ``sig = HMAC-SHA256(key, domain | kb | version |
seq)``. A reader with the key accepts the pointer only when the seal names the KB and the
version the pointer names and its signature is right, so whoever can write the store but
lacks the key cannot put a stored version into service (a candidate that failed its
release gate, an old model), only break the pointer, which readers then refuse.

``seq`` grows with every sealed move (:func:`next_seq`): one more than the stored seal's
when that one is valid (whichever version it names), and at least the writer's clock in
microseconds, so that a move after a seal was destroyed outranks the seals made before it
as long as the writers' clocks agree (one that ran ahead leaves a seq that later writers
only pass with time; restarting the readers forgets it). A long-lived reader remembers the
highest ``seq`` it accepted per KB and refuses a lower one: a seal copied back from an
earlier state (a replay) does not move a running worker. A reader that starts afresh
cannot tell a replayed seal from the newest; it still gets only a version that a key
holder once made active.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from model_store._errors import ArtifactCorrupt, PointerUnsealed

# Separates pointer seals from any other HMAC made with the same key (manifests).
_DOMAIN = "ood-sidecar active-pointer seal v1"
# A seal is a few hundred bytes; anything longer is not one.
SEAL_MAX_BYTES = 4096
# A version id has 16 characters; a pointer far longer is refused before it is quoted, and
# a listing reads no more of one.
POINTER_MAX_CHARS = 64
# How often a writer signs again when another writer moved the pointer in between.
SEAL_TRIES = 8


@dataclass(frozen=True)
class ActivePointer:
    """A KB's active version as a reader may use it.

    ``seq`` is the sequence number of its seal, or None where the store has no signing
    key (the pointer is then taken as it is).
    """

    version: str
    seq: int | None = None


def _shown(value: object) -> str:
    """``value`` for a message: a writer without the key may have stored megabytes."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _sig(key: bytes, kb: str, version: str, seq: int) -> str:
    msg = "\n".join((_DOMAIN, kb, version, str(seq))).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def make_seal(key: bytes, kb: str, version: str, seq: int) -> str:
    """The seal of ``kb``'s pointer at ``version``, as stored (canonical JSON text)."""
    body = {"kb": kb, "version": version, "seq": seq, "sig": _sig(key, kb, version, seq)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _parse(raw: object) -> dict[str, object]:
    """The JSON object of a stored seal; :class:`PointerUnsealed` for anything else (a
    writer without the key may have stored any value, of any type)."""
    if not isinstance(raw, str | bytes):
        raise PointerUnsealed("the seal is not a seal (not text)")
    if len(raw) > SEAL_MAX_BYTES:
        raise PointerUnsealed("the seal is not a seal (too long)")
    try:
        seal = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise PointerUnsealed("the seal is not JSON") from exc
    if not isinstance(seal, dict):
        raise PointerUnsealed("the seal is not a JSON object")
    return seal


def _signed_seq(key: bytes, seal: dict[str, object]) -> int | None:
    """The ``seq`` of ``seal`` when its signature holds for the KB and version it names."""
    kb, version, seq, sig = (seal.get(k) for k in ("kb", "version", "seq", "sig"))
    # bool is an int; a seq that is not a plain non-negative int was not written here
    if not (isinstance(kb, str) and isinstance(version, str) and isinstance(sig, str)):
        return None
    if type(seq) is not int or seq < 0 or not sig.isascii():
        return None
    return seq if hmac.compare_digest(sig, _sig(key, kb, version, seq)) else None


def seal_seq(key: bytes, raw: object, kb: str, version: str) -> int:
    """The ``seq`` of seal ``raw`` when it seals ``kb``'s pointer at ``version`` under
    ``key``; else :class:`PointerUnsealed`, saying what is wrong."""
    shown = version if len(version) <= 40 else _shown(version)
    if raw is None or raw in ("", b""):
        raise PointerUnsealed(f"KB {kb!r}: the active pointer ({shown}) carries no seal")
    seal = _parse(raw)
    if seal.get("kb") != kb or seal.get("version") != version:
        raise PointerUnsealed(
            f"KB {kb!r}: the active pointer names {shown} but its seal "
            f"{_shown(seal.get('kb'))}/{_shown(seal.get('version'))}"
        )
    seq = _signed_seq(key, seal)
    if seq is None:
        raise PointerUnsealed(
            f"KB {kb!r}: the seal of {shown} does not match the signing key (the pointer "
            "was moved by a writer without the key, or the key differs)"
        )
    return seq


def next_seq(key: bytes, raw: object, kb: str) -> int:
    """``seq`` of the next seal of ``kb``: past the stored seal ``raw`` when its signature
    holds (whichever version it names: a move without the key leaves the last key
    holder's seal in place), and never below the clock in microseconds."""
    now_us = time.time_ns() // 1000
    try:
        seal = _parse(raw)
    except PointerUnsealed:
        return now_us
    seq = _signed_seq(key, seal) if seal.get("kb") == kb else None
    return now_us if seq is None else max(seq + 1, now_us)


def next_seal(key: bytes, stored: object, kb: str, version: str) -> str:
    """The seal that moves ``kb``'s pointer to ``version``, past the ``stored`` one."""
    return make_seal(key, kb, version, next_seq(key, stored, kb))


def verified_pointer(
    key: bytes | None, kb: str, version: str | None, raw: str | bytes | None
) -> ActivePointer | None:
    """The pointer ``version`` of ``kb`` checked against its seal ``raw`` when a ``key``
    is configured (:class:`PointerUnsealed` when it does not hold); None when no version
    is active."""
    if version is None:
        return None
    if len(version) > POINTER_MAX_CHARS:
        raise ArtifactCorrupt(f"KB {kb!r}: the active pointer is no version id ({_shown(version)})")
    if key is None:
        return ActivePointer(version)
    return ActivePointer(version, seal_seq(key, raw, kb, version))


class SeqGuard:
    """The highest seal ``seq`` accepted per KB, for a long-lived reader: a lower one is a
    pointer state copied back from before (:class:`PointerUnsealed`)."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def check(self, kb: str, pointer: ActivePointer | None) -> ActivePointer | None:
        if pointer is None or pointer.seq is None:
            return pointer
        seen = self._seen.get(kb, -1)
        if pointer.seq < seen:
            raise PointerUnsealed(
                f"KB {kb!r}: the seal of {pointer.version} is older than one this reader "
                f"already accepted (seq {pointer.seq} < {seen}): a replayed pointer"
            )
        self._seen[kb] = pointer.seq
        return pointer
