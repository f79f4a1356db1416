"""Publish an artifact: put it into the configured store and, when asked, make it active."""

from __future__ import annotations

from model_store import Artifact, StoreEvent
from sidecar.persistence._stores import open_store
from sidecar.settings import Settings


def publish_model(
    settings: Settings, artifact: Artifact, *, promote: bool
) -> tuple[str, StoreEvent | None]:
    """Put ``artifact`` into the store of ``settings`` and promote it when ``promote``.

    Returns the stored version and what the promotion did: None when it was not asked
    for, or when the version was already active (``store.promote``'s own None).
    """
    store = open_store(settings)
    try:
        version = store.put(artifact)
        event = store.promote(artifact.kb, version) if promote else None
    finally:
        store.close()
    return version, event
