"""Versioned, integrity-checked storage of OOD detector artifacts.

A leaf package: it knows manifests and arrays, never detector classes, and imports
nothing from ``sidecar``.
"""

from model_store._artifact import (
    SCHEMA_VERSION,
    Artifact,
    build_artifact,
    decode,
    encode,
    load_dir,
    save_dir,
    verify_manifest,
)
from model_store._errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    ArtifactRejected,
    IncompatibleArtifact,
    ModelStoreError,
    SignatureInvalid,
    StoreUnavailable,
)

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactCorrupt",
    "ArtifactNotFound",
    "ArtifactRejected",
    "IncompatibleArtifact",
    "ModelStoreError",
    "SignatureInvalid",
    "StoreUnavailable",
    "build_artifact",
    "decode",
    "encode",
    "load_dir",
    "save_dir",
    "verify_manifest",
]
