"""Held-out query sets as embeddings of a given model's encoder, for checking and
recalibrating a release."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class QueryEmbeddings:
    """Query sets as embeddings for ``model``: a ``.npy`` array given as is (its width
    checked), or texts (a JSONL file of ``{"text"}``, Parquet, or a PostgreSQL table or
    query) encoded by the worker's encoder (settings, or ``encoder``), loaded once and
    checked against the model's first; texts read with their embeddings keep them once a
    sample re-embedded by that encoder agrees.

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
        self._texts: dict[str, list[str]] = {}  # per set read as texts, for languages()

    def __call__(
        self,
        queries: Path | None,
        embeddings: Path | None,
        what: str,
        *,
        sql: str | None = None,
    ) -> Any:
        """The rows of ``embeddings``, or the queries of ``queries`` (JSONL or Parquet) or
        of ``sql`` (a PostgreSQL table or query, read with ``postgres.dsn``) as embeddings:
        encoded, or as stored once a sample of them proves their encoder. One of them
        given, or None when none is; ``what`` names the set in messages ("ID")."""
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
        rows = self._rows(queries, what, sql)
        if rows is None:
            return None
        self._texts[what] = list(rows.texts)
        cache = self._embedder()
        if rows.embeddings is None:
            return cache.embed(rows.texts, desc=f"encoding {what} queries")
        from sidecar.training._stored_embeddings import check_stored_embeddings

        check_stored_embeddings(rows, cache.encoder, what)
        return rows.embeddings

    def languages(self, what: str) -> list[str] | None:
        """The language of each query of set ``what`` as last read, told as the worker
        tells a query's (among the model's encoder's languages, or ``scoring.languages``);
        None when the set came as embeddings (or was not read)."""
        texts = self._texts.get(what)
        if texts is None:
            return None
        from sidecar.encoders import LanguageDetector, detector_languages

        langs = detector_languages(str(self.model.encoder["name"]), self.settings.scoring.languages)
        return LanguageDetector(langs).detect(texts)

    def _rows(self, queries: Path | None, what: str, sql: str | None) -> Any:
        """The query set's rows (texts, and any stored embeddings), or None."""
        from sidecar.training._source_rows import SourceRows

        if sql is not None:
            from sidecar.training._sources_sql import PostgresSource

            option = f"--{what.lower()}-queries-sql"
            with PostgresSource(self.settings.postgres, option=option) as pg:
                return pg.read(sql, option=option, kb=False, progress=self.progress)
        if queries is None:
            return None
        from sidecar.training._sources_parquet import is_parquet, read_parquet

        if is_parquet(queries):
            return read_parquet(queries, kb=False, progress=self.progress)
        from sidecar.training._jsonl import read_queries

        return SourceRows(str(queries), read_queries(queries), [], None, None)

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
