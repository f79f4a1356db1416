"""The artifact: a JSON manifest plus named numpy arrays, never a pickle.

An artifact is what a retraining job produces and what a sidecar loads. The manifest is
plain JSON (schema version, KB, encoder, the model's own parameters, metrics, library
versions) and records the dtype, shape and sha256 of every array. The arrays travel as
an uncompressed ``.npz`` read with ``allow_pickle=False``. The version id is derived from
the content, so publishing the same model twice yields the same version.

When a signing key is configured, the manifest carries an HMAC-SHA256 over its canonical
JSON; because the manifest holds each array's sha256, the signature covers the arrays too.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_store._errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    IncompatibleArtifact,
    SignatureInvalid,
)

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
ARRAYS_FILE = "arrays.npz"

# Keys that describe a publication, not the model; they do not enter the version id.
_VOLATILE_KEYS = frozenset({"signature", "created_at", "version"})
# numpy dtype kinds that load without pickle: bool, signed, unsigned, float, unicode.
_SAFE_KINDS = frozenset("biufU")


def canonical_json(obj: Any) -> bytes:
    """Serialise ``obj`` deterministically (sorted keys, no spaces, UTF-8)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def array_digest(arr: np.ndarray) -> str:
    """sha256 over dtype, shape and the C-ordered bytes of ``arr``."""
    arr = np.ascontiguousarray(arr)
    h = hashlib.sha256()
    h.update(f"{arr.dtype.str}|{list(arr.shape)}|".encode())
    h.update(arr.tobytes())
    return h.hexdigest()


def _content_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in _VOLATILE_KEYS}


def _signature(manifest: Mapping[str, Any], key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return hmac.new(key, canonical_json(body), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Artifact:
    """A manifest and its arrays. Build one with :func:`build_artifact`.

    Parameters
    ----------
    manifest : dict
        JSON-serialisable; ``manifest["arrays"]`` maps each array name to its
        ``{"dtype", "shape", "sha256"}``.
    arrays : mapping of str to ndarray
    """

    manifest: dict[str, Any]
    arrays: Mapping[str, np.ndarray] = field(repr=False)

    @property
    def version(self) -> str:
        """Content-derived version id (16 hex digits of a sha256)."""
        return hashlib.sha256(canonical_json(_content_manifest(self.manifest))).hexdigest()[:16]

    @property
    def kb(self) -> str:
        return str(self.manifest["kb"])

    @property
    def encoder(self) -> dict[str, Any]:
        return dict(self.manifest["encoder"])

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.manifest["model"])

    def signed(self, key: bytes | None) -> Artifact:
        """Return a copy whose manifest carries an HMAC made with ``key`` (no-op for None)."""
        if not key:
            return self
        manifest = dict(self.manifest)
        manifest.pop("signature", None)
        manifest["signature"] = _signature(manifest, key)
        return Artifact(manifest, self.arrays)

    def size_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())


def build_artifact(
    *,
    kb: str,
    encoder: Mapping[str, Any],
    model: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Artifact:
    """Assemble an artifact, recording a digest for every array.

    ``encoder`` must hold ``name`` and ``dim``; ``model`` is the producer's own JSON
    description (detector kind and parameters, threshold, selected PCs, ...).
    """
    if "name" not in encoder or "dim" not in encoder:
        raise ValueError("encoder must have 'name' and 'dim'")
    clean: dict[str, np.ndarray] = {}
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.kind not in _SAFE_KINDS:
            raise ValueError(f"array {name!r} has dtype {a.dtype}, which would need pickle")
        clean[name] = a
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kb": kb,
        "encoder": {"name": str(encoder["name"]), "dim": int(encoder["dim"])},
        "model": dict(model),
        "metrics": dict(metrics or {}),
        "arrays": {
            n: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": array_digest(a)}
            for n, a in sorted(clean.items())
        },
        "library_versions": _library_versions(),
    }
    if extra:
        manifest.update(extra)
    # Round-trip once so that a non-JSON value fails here, not in the store.
    manifest = json.loads(canonical_json(manifest))
    return Artifact(manifest, clean)


def _library_versions() -> dict[str, str]:
    import platform

    import numpy

    return {"numpy": numpy.__version__, "python": platform.python_version()}


def encode(artifact: Artifact) -> tuple[bytes, bytes]:
    """Serialise to ``(manifest_json, npz_bytes)``."""
    buf = io.BytesIO()
    np.savez(buf, **dict(artifact.arrays))  # type: ignore[arg-type]
    return canonical_json(artifact.manifest), buf.getvalue()


def decode(
    manifest_bytes: bytes,
    arrays_bytes: bytes,
    *,
    hmac_key: bytes | None = None,
    expected_encoder: Mapping[str, Any] | None = None,
) -> Artifact:
    """Validate and rebuild an artifact; raise an :class:`ArtifactRejected` subclass otherwise.

    Checks, in order: the manifest parses; the schema version is supported; the HMAC (when a
    key is given); the encoder (when ``expected_encoder`` is given); then every array's
    dtype, shape and sha256. Arrays are read with ``allow_pickle=False``.
    """
    manifest = verify_manifest(manifest_bytes, hmac_key=hmac_key, expected_encoder=expected_encoder)
    declared: dict[str, Any] = manifest["arrays"]
    try:
        with np.load(io.BytesIO(arrays_bytes), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise ArtifactCorrupt(f"arrays cannot be read: {exc}") from exc
    if set(arrays) != set(declared):
        raise ArtifactCorrupt(
            f"arrays {sorted(arrays)} do not match the manifest's {sorted(declared)}"
        )
    for name, arr in arrays.items():
        meta = declared[name]
        if arr.dtype.str != meta["dtype"] or list(arr.shape) != list(meta["shape"]):
            raise ArtifactCorrupt(f"array {name!r}: dtype or shape differs from the manifest")
        if array_digest(arr) != meta["sha256"]:
            raise ArtifactCorrupt(f"array {name!r}: sha256 mismatch")
    return Artifact(manifest, arrays)


def verify_manifest(
    manifest_bytes: bytes,
    *,
    hmac_key: bytes | None = None,
    expected_encoder: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Parse and check a manifest without touching arrays (schema, signature, encoder)."""
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactCorrupt(f"manifest is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("arrays"), dict):
        raise ArtifactCorrupt("manifest is not an artifact manifest")
    schema = manifest.get("schema_version")
    if schema != SCHEMA_VERSION:
        raise IncompatibleArtifact(
            f"schema version {schema!r} is not supported (this build reads {SCHEMA_VERSION})"
        )
    if hmac_key:
        sig = manifest.get("signature")
        if not isinstance(sig, str):
            raise SignatureInvalid("manifest is unsigned but a signing key is configured")
        if not hmac.compare_digest(sig, _signature(manifest, hmac_key)):
            raise SignatureInvalid("manifest signature does not match the configured key")
    if expected_encoder is not None:
        enc = manifest.get("encoder") or {}
        want = (str(expected_encoder["name"]), int(expected_encoder["dim"]))
        got = (str(enc.get("name")), int(enc.get("dim", -1)))
        if got != want:
            raise IncompatibleArtifact(
                f"artifact was built with encoder {got[0]} ({got[1]} dims); "
                f"this sidecar runs {want[0]} ({want[1]} dims)"
            )
    return manifest


def save_dir(artifact: Artifact, path: str | Path) -> Path:
    """Write ``manifest.json`` and ``arrays.npz`` into directory ``path`` (created)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    manifest_bytes, arrays_bytes = encode(artifact)
    (p / ARRAYS_FILE).write_bytes(arrays_bytes)
    (p / MANIFEST_FILE).write_bytes(manifest_bytes)
    return p


def load_dir(
    path: str | Path,
    *,
    hmac_key: bytes | None = None,
    expected_encoder: Mapping[str, Any] | None = None,
) -> Artifact:
    """Read and validate an artifact directory written by :func:`save_dir`."""
    p = Path(path)
    try:
        manifest_bytes = (p / MANIFEST_FILE).read_bytes()
        arrays_bytes = (p / ARRAYS_FILE).read_bytes()
    except FileNotFoundError as exc:
        raise ArtifactNotFound(
            f"{p} is not an artifact directory (missing {exc.filename})"
        ) from exc
    return decode(
        manifest_bytes, arrays_bytes, hmac_key=hmac_key, expected_encoder=expected_encoder
    )
