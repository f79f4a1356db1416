"""Held-out query sets as embeddings of a given model's encoder, for checking and
recalibrating a release."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class QueryEmbeddings:
    """Query sets as embeddings for ``model``: a ``.npy`` array given as is (its width
    checked), or a JSONL file of ``{"text"}`` encoded by the worker's encoder (settings,
    or ``encoder``), loaded once and checked against the model's first.

    The model records only its encoder's name, which for a local directory is the
    folder's name, not a path to load it from: hence the worker's settings.
    """

    def __init__(
        self,
        model: Any,
        settings: Any,
        *,
        encoder: str | None = None,
        cache_dir: Path | None = None,
        progress: bool = True,
    ) -> None:
        self.model, self.settings = model, settings
        self.encoder, self.cache_dir, self.progress = encoder, cache_dir, progress
        self._cache: Any = None

    def __call__(self, queries: Path | None, embeddings: Path | None, what: str) -> Any:
        """The rows of ``embeddings`` or the encoded texts of ``queries`` (one of them
        given; None when neither is); ``what`` names the set in messages ("ID")."""
        from sidecar.errors import DataError
        from sidecar.training._train_inputs import load_npy

        if embeddings is not None:
            dim = int(self.model.encoder["dim"])
            E = load_npy(embeddings, f"{what} embeddings")
            if E.shape[1] != dim:
                raise DataError(
                    f"{what} embeddings have {E.shape[1]} dims, the model's encoder {dim}"
                )
            return E
        if queries is None:
            return None
        from sidecar.training._jsonl import read_queries

        texts = read_queries(queries)
        return self._embedder().embed(texts, desc=f"encoding {what} queries")

    def _embedder(self) -> Any:
        if self._cache is None:
            from sidecar.encoders import available_cpus, load_encoder
            from sidecar.training._cache import EmbeddingCache

            enc = load_encoder(self.settings, name=self.encoder, threads=available_cpus())
            cache = EmbeddingCache(enc, self.cache_dir, progress=self.progress)
            # Before any query is embedded: the probes as `sidecar train` embedded them
            # (the model first, then the cache's folder, so that a wrong encoder is not
            # blamed on the cache).
            self.model.check_encoder(enc.name, enc.dim, probes=cache.probes(check_folder=False))
            cache.probes()
            self._cache = cache
        return self._cache
