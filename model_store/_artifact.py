"""The artifact: a JSON manifest plus named numpy arrays, never a pickle.

An artifact is what a retraining job produces and what a sidecar loads. The manifest is
plain JSON (schema version, KB, encoder, the model's own parameters, metrics, library
versions) and records the dtype, shape and sha256 of every array. The arrays travel as
an uncompressed ``.npz`` read with ``allow_pickle=False``. The version id is derived from
the content, so publishing the same model twice yields the same version.

Every manifest also carries ``content_sha256``, the sha256 of its own content (everything
but the publication keys), which loading recomputes: a hand-edited threshold or intercept
is refused like a flipped array byte. That proves consistency, not authorship (whoever
edits can recompute it). When a signing key is configured, the manifest carries an
HMAC-SHA256 over its canonical JSON; because the manifest holds each array's sha256, the
signature covers the arrays too.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import stat
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
from model_store._npz import max_npz_bytes, read_arrays

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
ARRAYS_FILE = "arrays.npz"

# Keys that describe a publication, not the model; they do not enter the version id.
_VOLATILE_KEYS = frozenset({"signature", "created_at", "version", "content_sha256"})
# numpy dtype kinds that load without pickle: bool, signed, unsigned, float, unicode.
_SAFE_KINDS = frozenset("biufU")
# The dtype.str of such a dtype: byte order, kind, item size ('<f4', '|b1', '<U12').
_DTYPE_STR = re.compile(r"[<>|=][biufU][0-9]{1,6}")
# What hexdigest() of a sha256 (or an HMAC-SHA256) looks like.
_HEX64 = re.compile(r"[0-9a-f]{64}")
# numpy's limit on the number of dimensions.
_MAX_NDIM = 64


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
        return content_digest(self.manifest)[:16]

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
    manifest["content_sha256"] = content_digest(manifest)
    return Artifact(manifest, clean)


def content_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without the publication keys."""
    return hashlib.sha256(canonical_json(_content_manifest(manifest))).hexdigest()


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
    allow_unsigned: bool = False,
) -> Artifact:
    """Validate and rebuild an artifact; raise an :class:`ArtifactRejected` subclass otherwise.

    Checks, in order: the manifest parses; the schema version is supported; the HMAC (when
    a key is given); the manifest's structure; the encoder (when ``expected_encoder`` is
    given); then the archive's members against the manifest, before numpy reads them (see
    :mod:`model_store._npz`); then every array's dtype, shape and sha256. Arrays are read
    with ``allow_pickle=False``. ``allow_unsigned`` waives a missing signature only; one
    that is present must still match ``hmac_key``.
    """
    manifest = verify_manifest(
        manifest_bytes,
        hmac_key=hmac_key,
        expected_encoder=expected_encoder,
        allow_unsigned=allow_unsigned,
    )
    declared: dict[str, Any] = manifest["arrays"]
    arrays = read_arrays(arrays_bytes, declared)
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
    allow_unsigned: bool = False,
) -> dict[str, Any]:
    """Parse and check a manifest without touching arrays (schema, signature, structure,
    content digest, encoder); raise an :class:`ArtifactRejected` subclass otherwise.
    """
    try:
        manifest = json.loads(manifest_bytes)
        # JSON may spell a lone UTF-16 surrogate, which parses but cannot be re-encoded for
        # the HMAC or the version id: find out here rather than deep inside either.
        canonical_json(manifest)
    except (ValueError, RecursionError) as exc:  # UnicodeError is a ValueError
        raise ArtifactCorrupt(f"manifest is not JSON: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("arrays"), dict):
        raise ArtifactCorrupt("manifest is not an artifact manifest")
    schema = manifest.get("schema_version")
    # type() rather than ==: JSON true would otherwise pass as schema 1.
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise IncompatibleArtifact(
            f"schema version {schema!r} is not supported (this build reads {SCHEMA_VERSION})"
        )
    sig = manifest.get("signature")
    if "signature" in manifest and not (isinstance(sig, str) and _HEX64.fullmatch(sig)):
        # compare_digest raises TypeError on non-ASCII text: keep such input away from it.
        raise ArtifactCorrupt("manifest signature is not a hex HMAC-SHA256 digest")
    if hmac_key and not (sig is None and allow_unsigned):
        if sig is None:
            raise SignatureInvalid("manifest is unsigned but a signing key is configured")
        if not hmac.compare_digest(sig, _signature(manifest, hmac_key)):
            raise SignatureInvalid("manifest signature does not match the configured key")
    # After the HMAC, so that a forger without the key learns nothing from these messages.
    _check_structure(manifest)
    recorded = manifest.get("content_sha256")
    if not (isinstance(recorded, str) and _HEX64.fullmatch(recorded)):
        raise ArtifactCorrupt("manifest has no content_sha256 (a hex sha256 of its content)")
    if not hmac.compare_digest(recorded, content_digest(manifest)):
        raise ArtifactCorrupt("manifest content does not match its content_sha256 (edited?)")
    if expected_encoder is not None:
        enc = manifest["encoder"]
        want = (str(expected_encoder["name"]), int(expected_encoder["dim"]))
        got = (enc["name"], enc["dim"])
        if got != want:
            raise IncompatibleArtifact(
                f"artifact was built with encoder {got[0]} ({got[1]} dims); "
                f"this sidecar runs {want[0]} ({want[1]} dims)"
            )
    return manifest


def _is_count(value: Any) -> bool:
    # bool is an int subclass, but true is not a dimension.
    return type(value) is int and value >= 0


def _check_structure(manifest: Mapping[str, Any]) -> None:
    """Raise :class:`ArtifactCorrupt` unless ``manifest`` has the fields readers index."""
    if not isinstance(manifest.get("kb"), str):
        raise ArtifactCorrupt("manifest has no KB id (a string)")
    enc = manifest.get("encoder")
    if not (
        isinstance(enc, dict) and isinstance(enc.get("name"), str) and _is_count(enc.get("dim"))
    ):
        raise ArtifactCorrupt("manifest encoder must be {name: string, dim: integer >= 0}")
    if not isinstance(manifest.get("model"), dict):
        raise ArtifactCorrupt("manifest model must be an object")
    if not isinstance(manifest.get("metrics", {}), dict):
        raise ArtifactCorrupt("manifest metrics must be an object")
    for name, spec in manifest["arrays"].items():
        where = f"manifest entry of array {name!r}"
        if not name or not isinstance(spec, dict):
            raise ArtifactCorrupt(f"{where} must be a named {{dtype, shape, sha256}} object")
        if not _safe_dtype_str(spec.get("dtype")):
            raise ArtifactCorrupt(f"{where}: dtype {spec.get('dtype')!r} is not a plain dtype")
        shape = spec.get("shape")
        if not (isinstance(shape, list) and len(shape) <= _MAX_NDIM and all(map(_is_count, shape))):
            raise ArtifactCorrupt(f"{where}: shape {shape!r} is not a list of sizes")
        digest = spec.get("sha256")
        if not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
            raise ArtifactCorrupt(f"{where}: sha256 is not a hex digest")


def _safe_dtype_str(value: Any) -> bool:
    """True for the canonical ``dtype.str`` of a dtype that loads without pickle."""
    if not (isinstance(value, str) and _DTYPE_STR.fullmatch(value)):
        return False
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        return False
    # Only the spelling build_artifact records ('<f4', not '=f4' or '|f4') is accepted. A
    # zero-width '<U0' holds no bytes whatever its shape, so no size check could bound it.
    return dtype.str == value and dtype.kind in _SAFE_KINDS and dtype.itemsize > 0


def save_dir(artifact: Artifact, path: str | Path) -> Path:
    """Write ``manifest.json`` and ``arrays.npz`` into directory ``path`` (created)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    manifest_bytes, arrays_bytes = encode(artifact)
    (p / ARRAYS_FILE).write_bytes(arrays_bytes)
    (p / MANIFEST_FILE).write_bytes(manifest_bytes)
    return p


# Far above any manifest the product writes (tens of kB): only a bound on what is read.
MANIFEST_MAX_BYTES = 16 * 1024 * 1024


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused with :class:`ArtifactCorrupt` past
    ``limit``, before they are read.

    Neither a huge file nor a device or FIFO put in an artifact's place (a link to
    /dev/zero never ends) is read into memory; a link to a regular file is followed, as
    Kubernetes ConfigMap volumes present their files. Raises OSError as ``open`` does.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which names a directory "3"
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ArtifactCorrupt(f"{path} is {what}")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise ArtifactCorrupt(f"{path} has {st.st_size} bytes; at most {limit} can be valid")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise ArtifactCorrupt(f"{path} has more than {limit} bytes")
    return data


def read_dir_files(
    p: Path, hmac_key: bytes | None, *, allow_unsigned: bool = False
) -> tuple[bytes, bytes]:
    """The manifest and the arrays of an artifact directory, each read within the bound
    the other allows: the arrays within what the checked manifest declares."""
    manifest_bytes = read_bounded(p / MANIFEST_FILE, MANIFEST_MAX_BYTES)
    manifest = verify_manifest(manifest_bytes, hmac_key=hmac_key, allow_unsigned=allow_unsigned)
    declared = manifest["arrays"]
    return manifest_bytes, read_bounded(p / ARRAYS_FILE, max_npz_bytes(declared))


def load_dir(
    path: str | Path,
    *,
    hmac_key: bytes | None = None,
    expected_encoder: Mapping[str, Any] | None = None,
    allow_unsigned: bool = False,
) -> Artifact:
    """Read and validate an artifact directory written by :func:`save_dir` (see
    :func:`decode` for what is checked)."""
    p = Path(path)
    try:
        manifest_bytes, arrays_bytes = read_dir_files(p, hmac_key, allow_unsigned=allow_unsigned)
    except FileNotFoundError as exc:
        raise ArtifactNotFound(
            f"{p} is not an artifact directory (missing {exc.filename})"
        ) from exc
    return decode(
        manifest_bytes,
        arrays_bytes,
        hmac_key=hmac_key,
        expected_encoder=expected_encoder,
        allow_unsigned=allow_unsigned,
    )
