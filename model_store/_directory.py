"""A directory-backed store: single machine, air-gapped transfer, no server.

Layout under ``root``::

    KB/versions/V/manifest.json    the (signed) manifest
    KB/versions/V/arrays.npz       the arrays
    KB/versions/V/meta.json        stored_at, size, sha256 of arrays.npz
    KB/state.json                  {"active", "history" (newest first), "seq", "seal"
                                   (with a signing key, see model_store._seal)}
    KB/events.jsonl                append-only event log, one JSON object per line
    KB/.lock                       flock'ed by every writer of the KB

A version is written into a temporary directory and renamed into place, so it is listed
only when whole. ``state.json`` is replaced atomically (write temp + ``os.replace``);
writers of one KB serialise on an exclusive ``fcntl.flock``, across threads and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from model_store._artifact import (
    ARRAYS_FILE,
    MANIFEST_FILE,
    MANIFEST_MAX_BYTES,
    Artifact,
    encode,
    read_bounded,
    verify_manifest,
)
from model_store._errors import ArtifactCorrupt, ArtifactNotFound, InvalidName, StoreUnavailable
from model_store._event_log import EVENTS_FILE, append_event, event_log_mark, read_events
from model_store._files import (
    META_FILE,
    TMP_PREFIX,
    holds_version,
    sweep_leftovers,
    sync_dir,
    write_atomic,
    write_synced,
)
from model_store._npz import max_npz_bytes
from model_store._seal import ActivePointer, next_seal, verified_pointer
from model_store._store import (
    HISTORY_MAX,
    StoreEvent,
    VersionInfo,
    check_kb,
    check_version,
    previous_in,
    stored_info,
    verified_artifact,
)

log = logging.getLogger(__name__)


class DirectoryStore:
    """Filesystem store with the same interface and contract as :class:`RedisStore`.

    Parameters
    ----------
    root : path
        Created if missing.
    hmac_key : bytes, optional
        Sign manifests on :meth:`put`; require a valid signature on :meth:`get`.
    retention : int
        Versions kept per KB by :meth:`gc` (the active and previous ones always).
    """

    def __init__(
        self, root: str | Path, *, hmac_key: bytes | None = None, retention: int = 10
    ) -> None:
        self.root = Path(root)
        self.hmac_key = hmac_key or None
        self.retention = retention
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create store directory {self.root}: {exc}") from exc

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self.root)!r})"

    # -- paths and state ------------------------------------------------------------------

    def _kb_dir(self, kb: str) -> Path:
        return self.root / check_kb(kb)

    def _version_dir(self, kb: str, version: str) -> Path:
        return self._kb_dir(kb) / "versions" / check_version(version)

    @contextlib.contextmanager
    def _locked(self, kb: str) -> Iterator[Path]:
        d = self._kb_dir(kb)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield d
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _state(self, kb: str) -> dict[str, Any]:
        try:
            state = json.loads((self._kb_dir(kb) / "state.json").read_bytes())
        except FileNotFoundError:
            return {"active": None, "history": [], "seq": 0}
        except (ValueError, RecursionError) as exc:
            raise ArtifactCorrupt(f"{self._kb_dir(kb)}/state.json is unreadable") from exc
        if (
            not isinstance(state, dict)
            or not isinstance(state.get("history", []), list)
            or not isinstance(state.get("active"), str | None)
            or type(state.get("seq", 0)) is not int
        ):
            raise ArtifactCorrupt(f"{self._kb_dir(kb)}/state.json is not a store state")
        return state

    def _append_event(
        self,
        d: Path,
        state: dict[str, Any],
        kb: str,
        version: str,
        previous: str | None,
        action: str,
    ) -> StoreEvent:
        state["seq"] = int(state.get("seq", 0)) + 1
        event = StoreEvent(str(state["seq"]), kb, version, previous, action, time.time())
        write_atomic(d / "state.json", json.dumps(state).encode())
        append_event(d / EVENTS_FILE, event)
        return event

    # -- versions -------------------------------------------------------------------------

    def put(self, artifact: Artifact) -> str:
        kb, version = check_kb(artifact.kb), artifact.version
        target = self._version_dir(kb, version)
        if target.is_dir():
            return version
        manifest_bytes, arrays_bytes = encode(artifact.signed(self.hmac_key))
        meta = {
            "stored_at": time.time(),
            "size": len(arrays_bytes),
            "sha256": hashlib.sha256(arrays_bytes).hexdigest(),
        }
        with self._locked(kb) as d:
            if target.is_dir():
                return version
            tmp = d / "versions" / f"{TMP_PREFIX}{version}.{uuid.uuid4().hex}"
            tmp.mkdir(parents=True)
            try:
                # On disk before it is listed: after a power loss, put() would find a
                # listed but truncated version and never write it again.
                write_synced(tmp / ARRAYS_FILE, arrays_bytes)
                write_synced(tmp / MANIFEST_FILE, manifest_bytes)
                write_synced(tmp / META_FILE, json.dumps(meta).encode())
                sync_dir(tmp)
                os.rename(tmp, target)  # listed from here on
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # a full disk keeps nothing half-written
                raise
            sync_dir(target.parent)
        log.info("stored version %s of KB %s in %s", version, kb, self.root)
        return version

    def _read(self, kb: str, version: str) -> tuple[bytes, dict[str, Any], Path]:
        vdir = self._version_dir(kb, version)
        if not vdir.is_dir():
            raise ArtifactNotFound(f"KB {kb!r} has no version {version!r}")
        try:
            manifest_bytes = read_bounded(vdir / MANIFEST_FILE, MANIFEST_MAX_BYTES)
            meta = json.loads(read_bounded(vdir / META_FILE, MANIFEST_MAX_BYTES))
        except (OSError, ValueError) as exc:
            raise ArtifactCorrupt(f"version {version} of KB {kb!r} is unreadable: {exc}") from exc
        if not isinstance(meta, dict):
            raise ArtifactCorrupt(f"version {version} of KB {kb!r}: {META_FILE} is not an object")
        return manifest_bytes, meta, vdir

    def get(
        self, kb: str, version: str, *, expected_encoder: Mapping[str, Any] | None = None
    ) -> Artifact:
        manifest_bytes, meta, vdir = self._read(kb, version)
        # Cheap checks (schema, signature, encoder) first; the arrays are read only within
        # what the manifest declares.
        manifest = verify_manifest(
            manifest_bytes, hmac_key=self.hmac_key, expected_encoder=expected_encoder
        )
        try:
            data = read_bounded(vdir / ARRAYS_FILE, max_npz_bytes(manifest["arrays"]))
        except OSError as exc:
            raise ArtifactCorrupt(f"version {version} of KB {kb!r}: {exc}") from exc
        return verified_artifact(
            kb,
            version,
            manifest_bytes,
            data,
            meta,
            hmac_key=self.hmac_key,
            expected_encoder=expected_encoder,
        )

    def info(self, kb: str, version: str) -> VersionInfo:
        manifest_bytes, meta, _ = self._read(kb, version)
        return stored_info(kb, version, manifest_bytes, meta)

    def manifest(self, kb: str, version: str) -> dict[str, Any]:
        return dict(self.info(kb, version).manifest)

    def versions(self, kb: str) -> list[str]:
        vroot = self._kb_dir(kb) / "versions"
        if not vroot.is_dir():
            return []
        found: list[tuple[float, str]] = []
        for p in vroot.iterdir():
            if p.name.startswith(TMP_PREFIX) or not p.is_dir():
                continue
            try:
                stored_at = float(json.loads((p / META_FILE).read_bytes())["stored_at"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being deleted by gc
            found.append((stored_at, p.name))
        return [v for _, v in sorted(found)]

    def kbs(self) -> list[str]:
        """KBs with a stored version or a pointer (a put that failed leaves neither)."""
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir()
            and (p / "versions").is_dir()
            and ((p / "state.json").is_file() or holds_version(p / "versions"))
        )

    # -- pointer --------------------------------------------------------------------------

    def active(self, kb: str) -> str | None:
        return self._state(kb).get("active")

    def history(self, kb: str) -> list[str]:
        return list(self._state(kb).get("history", []))

    def previous(self, kb: str) -> str | None:
        return previous_in(self.history(kb))

    def active_pointer(self, kb: str) -> ActivePointer | None:
        state = self._state(kb)
        return verified_pointer(self.hmac_key, kb, state.get("active"), state.get("seal"))

    def _seal(self, state: dict[str, Any], kb: str, version: str) -> None:
        """Seal the pointer at ``version`` in ``state`` (with a key; under the KB's lock)."""
        if self.hmac_key is not None:
            state["seal"] = next_seal(self.hmac_key, state.get("seal"), kb, version)

    def promote(self, kb: str, version: str) -> StoreEvent | None:
        check_version(version)
        if not self._kb_dir(kb).is_dir():  # nothing to promote: leave no empty KB behind
            raise ArtifactNotFound(f"KB {kb!r} has no version {version!r} to promote")
        with self._locked(kb) as d:
            if not self._version_dir(kb, version).is_dir():
                raise ArtifactNotFound(f"KB {kb!r} has no version {version!r} to promote")
            state = self._state(kb)
            current = state.get("active")
            if current == version:
                if self.hmac_key is None:
                    return None
                # a key holder vouches again for the version in service: a newer seal
                self._seal(state, kb, version)
                event = self._append_event(d, state, kb, version, current, "seal")
                log.info("sealed the active pointer of KB %s at %s", kb, version)
                return event
            self._seal(state, kb, version)
            state["active"] = version
            state["history"] = [version, *state.get("history", [])][:HISTORY_MAX]
            event = self._append_event(d, state, kb, version, current, "promote")
        log.info("promoted KB %s to %s (was %s)", kb, version, current)
        return event

    def rollback(self, kb: str) -> StoreEvent:
        if not self._kb_dir(kb).is_dir():
            raise ArtifactNotFound(f"KB {kb!r} has no previous version to roll back to")
        with self._locked(kb) as d:
            state = self._state(kb)
            history = list(state.get("history", []))
            target = previous_in(history)
            if target is None:
                raise ArtifactNotFound(f"KB {kb!r} has no previous version to roll back to")
            current = history[0]
            if not self._version_dir(kb, target).is_dir():
                raise ArtifactNotFound(f"KB {kb!r}: previous version {target} is gone")
            # Pop down to the target, skipping entries equal to the current version (as
            # ROLLBACK_LUA does).
            self._seal(state, kb, target)
            state["active"], state["history"] = target, history[history.index(target) :]
            event = self._append_event(d, state, kb, target, current, "rollback")
        log.info("rolled KB %s back to %s (was %s)", kb, target, current)
        return event

    def events_mark(self, kb: str) -> tuple[int, int] | None:
        """Size and modification time of ``kb``'s event log (None when it has none): the
        log only grows, so an unchanged mark means no new event."""
        return event_log_mark(self._kb_dir(kb) / EVENTS_FILE)

    def events(self, kb: str, after: str | None = None) -> list[StoreEvent]:
        return read_events(self._kb_dir(kb) / EVENTS_FILE, kb, after)

    # -- retention ------------------------------------------------------------------------

    def gc(self, kb: str) -> list[str]:
        deleted: list[str] = []
        if not self._kb_dir(kb).is_dir():
            return deleted
        with self._locked(kb) as d:
            state = self._state(kb)
            history = list(state.get("history", []))
            # The active and the previous version, as UNLIST_LUA protects them.
            protected = {state.get("active"), *history[:1], previous_in(history)}
            listed = self.versions(kb)
            for version in listed[: max(0, len(listed) - self.retention)]:
                if version in protected:
                    continue
                vdir = self._version_dir(kb, version)
                grave = vdir.with_name(f"{TMP_PREFIX}gc-{version}.{uuid.uuid4().hex}")
                os.rename(vdir, grave)
                shutil.rmtree(grave, ignore_errors=True)
                deleted.append(version)
            sweep_leftovers(d / "versions")
            if deleted:
                # Removing entries can leave equal neighbours (C B A B without A is C B B);
                # keep one of each run so that every rollback changes the version.
                kept: list[str] = []
                for v in history:
                    if v not in deleted and (not kept or kept[-1] != v):
                        kept.append(v)
                state["history"] = kept
                write_atomic(d / "state.json", json.dumps(state).encode())
        if deleted:
            log.info("gc removed %d versions of KB %s", len(deleted), kb)
        return deleted

    def sweep(self, kb: str | None = None) -> int:
        """Remove the leftovers of interrupted puts and gcs in ``kb``'s folder, or in every
        KB folder, also of KBs that :meth:`kbs` does not list (a first put that was killed
        leaves only its temp directory); returns how many went. gc(kb) does the same for
        its one KB without counting."""
        removed = 0
        folders = [self.root / check_kb(kb)] if kb is not None else sorted(self.root.iterdir())
        for p in folders:
            if not p.is_dir() or not (p / "versions").is_dir():
                continue
            try:
                check_kb(p.name)
            except InvalidName:
                continue  # not a folder this store made
            with self._locked(p.name) as d:
                removed += sweep_leftovers(d / "versions")
        return removed

    def close(self) -> None:
        """Nothing to release (present for the protocol)."""
