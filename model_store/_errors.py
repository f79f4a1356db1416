"""Errors raised by the model store.

::

    ModelStoreError                 root; ``retryable`` says whether trying again can help
    ├── StoreUnavailable            the backend cannot be reached (retryable)
    │   └── StoreAccessDenied       it answered but refused the credentials
    ├── ArtifactNotFound            no such KB, version or pointer
    ├── InvalidName                 a KB or version id that cannot be a key or a file name
    ├── StoreMisconfigured          the store's settings cannot work (e.g. a bad Redis URL)
    └── ArtifactRejected            bytes were read but must not be used
        ├── ArtifactCorrupt         checksum mismatch, unreadable arrays or manifest
        ├── SignatureInvalid        HMAC missing or wrong while a key is configured
        ├── PointerUnsealed         the active pointer's seal is missing, wrong or replayed
        └── IncompatibleArtifact    unknown schema version, or built for another encoder

The store never unpickles anything; every rejection happens before an array is used.
"""

from __future__ import annotations


class ModelStoreError(Exception):
    """Root of every model-store error."""

    retryable: bool = False


class StoreUnavailable(ModelStoreError):
    """The backing store (Redis, a directory) cannot be reached right now."""

    retryable = True


class StoreAccessDenied(StoreUnavailable):
    """The store answered but refused the credentials (a wrong or missing password).

    Trying again with the same settings does not help; a running worker still treats it
    as an outage and keeps reconnecting, so it serves on when the fix is made on the Redis
    side (its own settings are read once, at start).
    """

    retryable = False


class ArtifactNotFound(ModelStoreError):
    """The KB, version or active pointer does not exist."""


class InvalidName(ModelStoreError, ValueError):
    """A KB or version id with characters a store cannot use (also a ``ValueError``)."""


class StoreMisconfigured(ModelStoreError, ValueError):
    """The store's configuration cannot work, e.g. a Redis URL with an unknown scheme.

    Retrying will not help; fix the settings. Also a ``ValueError``, which is what the
    underlying client raised before this error was translated.
    """

    retryable = False


class ArtifactRejected(ModelStoreError):
    """An artifact was read but failed validation; the caller must keep its current model."""


class ArtifactCorrupt(ArtifactRejected):
    """The bytes do not match their recorded sha256, or cannot be decoded."""


class SignatureInvalid(ArtifactRejected):
    """A signing key is configured and the manifest's HMAC is missing or wrong."""


class PointerUnsealed(ArtifactRejected):
    """A signing key is configured and the active pointer's seal is missing, does not
    match it, or is older than one this reader already accepted: the pointer was not
    moved by a key holder. Readers keep their current model; a key holder re-seals the
    pointer by promoting the version it should name (``sidecar models promote KB V``)."""


class IncompatibleArtifact(ArtifactRejected):
    """The manifest's schema version or encoder does not match what the reader supports."""
