"""Streaming OOD moderation sidecar for retrieval-augmented generation services."""

__version__ = "0.1.0"
