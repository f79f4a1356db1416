"""Versioned, integrity-checked storage of OOD detector artifacts.

A leaf package: it knows manifests and arrays, never detector classes, and imports
nothing from ``sidecar``.
"""

from model_store._artifact import (
    SCHEMA_VERSION,
    Artifact,
    build_artifact,
    content_digest,
    decode,
    encode,
    load_dir,
    save_dir,
    verify_manifest,
)
from model_store._directory import DirectoryStore
from model_store._directory_async import AsyncDirectoryStore
from model_store._errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    ArtifactRejected,
    IncompatibleArtifact,
    InvalidName,
    ModelStoreError,
    PointerUnsealed,
    SignatureInvalid,
    StoreAccessDenied,
    StoreMisconfigured,
    StoreUnavailable,
)
from model_store._redis import RedisStore
from model_store._redis_async import AsyncRedisStore
from model_store._redis_common import safe_url
from model_store._seal import ActivePointer
from model_store._store import AsyncModelStore, ModelStore, StoreEvent, VersionInfo, check_kb

__all__ = [
    "SCHEMA_VERSION",
    "ActivePointer",
    "Artifact",
    "ArtifactCorrupt",
    "ArtifactNotFound",
    "ArtifactRejected",
    "AsyncDirectoryStore",
    "AsyncModelStore",
    "AsyncRedisStore",
    "DirectoryStore",
    "IncompatibleArtifact",
    "InvalidName",
    "ModelStore",
    "ModelStoreError",
    "PointerUnsealed",
    "RedisStore",
    "SignatureInvalid",
    "StoreAccessDenied",
    "StoreEvent",
    "StoreMisconfigured",
    "StoreUnavailable",
    "VersionInfo",
    "build_artifact",
    "check_kb",
    "content_digest",
    "decode",
    "encode",
    "load_dir",
    "safe_url",
    "save_dir",
    "verify_manifest",
]
