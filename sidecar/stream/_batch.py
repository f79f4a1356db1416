"""Score one micro-batch: decode, embed, detect, and decide for every record.

A query that brings its own embedding (:mod:`sidecar.stream._embedding`) skips the
encoder; a batch may mix both kinds, and only the texts without a usable vector are
encoded, in one call, with every record's decision kept in input order.

The contract that keeps the stream at-least-once: :meth:`BatchScorer.score` never raises
for a bad record. Every input record comes out as exactly one :class:`Verdict` or one
:class:`DeadLetter`; a failure of the encoder or of a detector on the whole batch is
retried record by record so that one poison query cannot take its neighbours down.

The model snapshot is read ONCE per batch, so a batch is scored by exactly one model per
KB even when a hot swap lands in the middle of it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from sidecar.errors import EncoderUnavailable
from sidecar.stream._embedding import EmbeddingProblem, client_embedding
from sidecar.stream._encoder_thread import (
    EncoderThread,
    LanguageTeller,
    TextEncoder,
)
from sidecar.stream._query_language import CLIENT as CLIENT_LANGUAGE
from sidecar.stream._query_language import DETECTED, LANGUAGE_SOURCE, tell_languages
from sidecar.stream._records import (
    NO_MODEL,
    PARSE_FAILED,
    SCORING_FAILED,
    DeadLetter,
    InputPolicy,
    Query,
    Raw,
    Rejected,
    Verdict,
    clip,
    finite_or_none,
    parse_query,
)

log = logging.getLogger(__name__)

STAGES = ("decode", "encode", "detect", "produce")
# Verdict reason when fail_mode decided because the embedding server gave no vectors in time.
ENCODER_UNAVAILABLE = "encoder_unavailable"
# The verdict field that says whose embedding was scored, and its two values: the query
# record's own, or its text embedded by the worker's encoder.
EMBEDDING_SOURCE = "embedding_source"
CLIENT, SIDECAR = "client", "sidecar"
EMBEDDING_SOURCES = (CLIENT, SIDECAR)
# The verdict field naming the reason a client embedding was replaced by the worker's.
EMBEDDING_FALLBACK = "embedding_fallback"


class ScoringModel(Protocol):
    """What the batch needs of ``sidecar.scoring.OODModel``."""

    @property
    def threshold(self) -> float: ...

    @property
    def detector_name(self) -> str: ...

    @property
    def encoder(self) -> Mapping[str, Any]:
        """The encoder the model was built with, ``{"name": str, "dim": int}``."""
        ...

    def score(self, E: np.ndarray, languages: Sequence[str | None] | None = None) -> np.ndarray:
        """OOD scores, ndarray of shape (n,), for embeddings of shape (n, dim); higher = OOD.
        ``languages`` (one per row) is given only to a model centred by language."""
        ...


class Loaded(Protocol):
    """What the batch needs of ``sidecar.hotswap.LoadedModel``."""

    @property
    def version(self) -> str: ...

    @property
    def model(self) -> ScoringModel: ...


class Holder(Protocol):
    """What the batch needs of ``sidecar.hotswap.ModelHolder``."""

    def snapshot(self) -> Mapping[str, Loaded]: ...


@dataclass
class BatchOutcome:
    """Verdicts and dead letters of one batch, in input order, plus stage timings (s)."""

    verdicts: list[Verdict] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @property
    def size(self) -> int:
        return len(self.verdicts) + len(self.dead)


class BatchScorer:
    """Turns a batch of raw records into verdicts and dead letters.

    Parameters
    ----------
    encoder : TextEncoder
        Embeds texts; called on one dedicated thread (:class:`EncoderThread`) so the event
        loop keeps heart-beating.
    holder : Holder
        Source of the active model per KB; read once per batch.
    policy : InputPolicy
        What counts as a valid query.
    fail_mode : {"closed", "open"}
        Verdict for a KB without a loaded model: closed = OOD, open = ID (reason
        ``no_model``); also for a batch the encoder raised ``EncoderUnavailable`` on (reason
        ``encoder_unavailable``: an embedding server that gave no vectors in time).
    encode_batch_size : int
        Batch size handed to the encoder.
    languages : LanguageTeller, optional
        Tells the language of each query whose client gave none (the record's
        ``language``): the verdict carries the language and who told it, and a model with
        a threshold for that language applies it. None: only the clients' languages.
    embedding_fallback : {"dead_letter", "encode"}
        What becomes of a query whose own embedding cannot be used (see
        :mod:`sidecar.stream._embedding`): a dead letter with the problem's reason code,
        or its text embedded by ``encoder`` (the verdict then says ``embedding_fallback``).
    """

    def __init__(
        self,
        encoder: TextEncoder,
        holder: Holder,
        policy: InputPolicy,
        *,
        fail_mode: Literal["closed", "open"] = "closed",
        encode_batch_size: int = 64,
        languages: LanguageTeller | None = None,
        embedding_fallback: Literal["dead_letter", "encode"] = "dead_letter",
    ) -> None:
        self.encoder = encoder
        self.embedding_fallback = embedding_fallback
        self.languages = languages
        self.encoder_thread = EncoderThread(encoder)
        self.holder = holder
        self.policy = policy
        self.fail_mode = fail_mode
        self.encode_batch_size = encode_batch_size

    async def score(self, raws: Sequence[Raw]) -> BatchOutcome:
        """Decide every record of ``raws``; never raises for a bad record."""
        out = BatchOutcome()
        t0 = time.perf_counter()
        snapshot = self.holder.snapshot()  # once per batch: one model per KB for all of it
        parsed = [_parse(r, self.policy) for r in raws]
        results: list[Verdict | DeadLetter | None] = [None] * len(parsed)
        scored: list[int] = []
        for i, p in enumerate(parsed):
            if isinstance(p, Rejected):
                loaded = snapshot.get(p.kb) if p.kb else None
                results[i] = DeadLetter(p.raw, p.reason, p.detail, _version(loaded))
            elif p.kb not in snapshot:
                results[i] = self._fail_mode_verdict(p)
            else:
                scored.append(i)
        queries = [_as_query(parsed[i]) for i in scored]
        # Client embeddings, checked against the model of this snapshot that scores each.
        rows: list[np.ndarray | None] = [None] * len(queries)
        fallbacks: dict[int, str] = {}
        live: list[int] = []
        for j, q in enumerate(queries):
            if q.embedding is not None:
                loaded = snapshot[q.kb]
                got = _client_embedding(q, loaded)
                if isinstance(got, EmbeddingProblem):
                    if self.embedding_fallback != "encode":
                        results[scored[j]] = DeadLetter(
                            q.raw, got.reason, got.detail, loaded.version
                        )
                        continue
                    fallbacks[j] = got.reason
                else:
                    rows[j] = got
            live.append(j)
        t1 = time.perf_counter()
        out.timings["decode"] = t1 - t0

        if live:
            # Only the queries without a usable vector of their own meet the encoder.
            to_encode = [j for j in live if rows[j] is None]
            failed: dict[int, str] = {}
            try:
                failed = await self._encode_into(rows, queries, to_encode)
            except EncoderUnavailable as exc:
                log.warning("%s queries answered by fail_mode: %s", len(to_encode), exc)
                for j in to_encode:
                    results[scored[j]] = self._fail_mode_verdict(queries[j], ENCODER_UNAVAILABLE)
                live = [j for j in live if rows[j] is not None]
            langs, told = await self._languages([queries[j] for j in live])
            t2 = time.perf_counter()
            out.timings["encode"] = t2 - t1
            for j, err in failed.items():
                q = queries[j]
                results[scored[j]] = DeadLetter(
                    q.raw, SCORING_FAILED, f"encoder: {err}", _version(snapshot.get(q.kb))
                )
            ok = [j for j in live if j not in failed]
            lang_of = {live[k]: lang for k, lang in langs.items()}
            by_client = frozenset(live[k] for k in told)
            decided = self._detect(
                queries, rows, ok, snapshot, lang_of, to_encode, fallbacks, by_client
            )
            for j, verdict in decided.items():
                results[scored[j]] = verdict
            out.timings["detect"] = time.perf_counter() - t2

        for res in results:
            if isinstance(res, Verdict):
                out.verdicts.append(res)
            elif isinstance(res, DeadLetter):
                out.dead.append(res)
            else:  # pragma: no cover - every branch above fills its slot
                raise AssertionError("a record left the batch without a decision")
        return out

    def _fail_mode_verdict(self, q: Query, reason: str = NO_MODEL) -> Verdict:
        verdict: Literal["ID", "OOD"] = "OOD" if self.fail_mode == "closed" else "ID"
        return Verdict(q, verdict, None, None, None, None, reason=reason)

    async def _encode_into(
        self, rows: list[np.ndarray | None], queries: list[Query], which: list[int]
    ) -> dict[int, str]:
        """Embed the texts of ``queries[j]`` for ``j`` in ``which`` into ``rows[j]``.

        Returns ``{j: error}`` for the texts the encoder failed on (retried one by one);
        raises ``EncoderUnavailable`` when an embedding server gave no vectors in time.
        """
        if not which:
            return {}
        E, failed = await self._encode([queries[j] for j in which])
        out: dict[int, str] = {}
        for k, j in enumerate(which):
            if k in failed:
                out[j] = failed[k]
            elif E is not None:
                rows[j] = E[k]
        return out

    async def _encode(self, queries: list[Query]) -> tuple[np.ndarray | None, dict[int, str]]:
        """Embed all texts; on failure retry one by one. Returns (E, {index: error})."""
        texts = [q.text for q in queries]
        try:
            E = await self.encoder_thread.encode(texts, batch_size=self.encode_batch_size)
            return _check_rows(E, len(texts)), {}
        except EncoderUnavailable:
            raise  # the whole batch waited for the server; one by one would wait again
        except Exception as exc:  # an encoder failure must not drop the batch
            log.warning(
                "batch encode of %s texts failed (%s); retrying one by one", len(texts), exc
            )
        rows: list[np.ndarray | None] = []
        failed: dict[int, str] = {}
        for j, text in enumerate(texts):
            try:
                e = await self.encoder_thread.encode([text], batch_size=1)
                rows.append(_check_rows(e, 1)[0])
            except EncoderUnavailable:
                raise
            except Exception as exc:
                failed[j] = f"{type(exc).__name__}: {exc}"
                rows.append(None)
        good = [r for r in rows if r is not None]
        if not good:
            return None, failed
        dim = good[0].shape[0]
        E = np.zeros((len(texts), dim), dtype=np.float32)
        for j, r in enumerate(rows):
            if r is not None:
                E[j] = r
        return E, failed

    async def _languages(self, queries: list[Query]) -> tuple[dict[int, str], frozenset[int]]:
        """Each query's language, by position (the client's, else the detector's; none
        without either, or when the detector fails: the query then meets the global
        threshold), and the positions whose client gave it."""
        teller = self.languages
        detect = None if teller is None else functools.partial(self.encoder_thread.detect, teller)
        return await tell_languages(
            [q.language for q in queries], [q.text for q in queries], detect
        )

    def _detect(
        self,
        queries: list[Query],
        rows: list[np.ndarray | None],
        ok: list[int],
        snapshot: Mapping[str, Loaded],
        langs: Mapping[int, str] | None = None,
        encoded: Sequence[int] = (),
        fallbacks: Mapping[int, str] | None = None,
        told: frozenset[int] = frozenset(),
    ) -> dict[int, Verdict | DeadLetter]:
        """Score the embedded queries ``ok`` per KB with that KB's model of this snapshot.

        ``rows[j]`` is query ``j``'s embedding; ``langs[j]`` its language (missing: none);
        ``encoded`` the queries the worker's encoder embedded (the others brought their
        own); ``fallbacks`` the reason codes of client embeddings replaced by the
        worker's; ``told`` the queries whose client gave the language.
        """
        decided: dict[int, Verdict | DeadLetter] = {}
        by_kb: dict[str, list[int]] = {}
        for j in ok:
            if rows[j] is not None:
                by_kb.setdefault(queries[j].kb, []).append(j)
        ours = frozenset(encoded)
        for kb, idx in by_kb.items():
            loaded = snapshot[kb]
            kb_langs = None if langs is None else [langs.get(j) for j in idx]
            scores = _safe_scores(loaded.model, [rows[j] for j in idx], kb_langs)
            for j, s in zip(idx, scores, strict=True):
                q = queries[j]
                if isinstance(s, str) or np.isnan(s):
                    detail = s if isinstance(s, str) else "detector returned NaN"
                    decided[j] = DeadLetter(q.raw, SCORING_FAILED, detail, loaded.version)
                    continue
                extra: dict[str, Any] = {}
                lang = langs.get(j) if langs is not None else None
                if lang is not None:
                    extra["language"] = lang
                    extra[LANGUAGE_SOURCE] = CLIENT_LANGUAGE if j in told else DETECTED
                extra[EMBEDDING_SOURCE] = SIDECAR if j in ours else CLIENT
                if fallbacks and j in fallbacks:
                    extra[EMBEDDING_FALLBACK] = fallbacks[j]
                threshold = _threshold(loaded.model, lang)
                decided[j] = Verdict(
                    q,
                    "OOD" if s > threshold else "ID",
                    finite_or_none(s),
                    threshold,
                    loaded.model.detector_name,
                    loaded.version,
                    extra=extra,
                )
        return decided


def _threshold(model: ScoringModel, language: str | None) -> float:
    """The model's threshold for a query in ``language`` (its own where the model has
    one, see ``OODModel.threshold_for``; the global one otherwise)."""
    for_language = getattr(model, "threshold_for", None)
    if language is None or for_language is None:
        return float(model.threshold)
    return float(for_language(language))


def _parse(raw: Raw, policy: InputPolicy) -> Query | Rejected:
    """:func:`parse_query`, with anything it raises turned into a rejection of this record."""
    try:
        return parse_query(raw, policy)
    except Exception as exc:
        # parse_query is meant never to raise; if a bug lets it, this one record goes to
        # the dead-letter topic with the error rather than failing the batch around it.
        detail = clip(f"parser raised {type(exc).__name__}: {exc}", 300)
        log.warning("parsing %s[%s]@%s failed: %s", raw.topic, raw.partition, raw.offset, detail)
        log.debug("parser traceback", exc_info=True)
        return Rejected(raw=raw, reason=PARSE_FAILED, detail=detail)


def _client_embedding(q: Query, loaded: Loaded) -> np.ndarray | EmbeddingProblem | None:
    """:func:`client_embedding` for the model ``loaded``, anything it raises turned into
    a problem of this query (``parse_failed``: a bug, as for the parser) rather than a
    failure of the batch."""
    try:
        return client_embedding(q, loaded.model.encoder)
    except Exception as exc:
        detail = clip(f"embedding check raised {type(exc).__name__}: {exc}", 300)
        log.warning("checking the embedding of %s failed: %s", q.id[:80], detail)
        return EmbeddingProblem(PARSE_FAILED, detail)


def _safe_scores(
    model: ScoringModel, rows: Sequence[Any], languages: Sequence[str | None] | None = None
) -> list[float | str]:
    """Scores for embeddings ``rows`` (each of shape (dim,)); a failing batch is retried
    row by row (errors as str). A model centred by language (``OODModel.centering``) is
    given each row's language (``languages``; None: it centres with its global mean)."""
    centred = languages is not None and getattr(model, "centering", None) is not None

    def score(E: np.ndarray, at: slice) -> np.ndarray:
        if centred:
            assert languages is not None
            return np.asarray(model.score(E, list(languages)[at]), dtype=np.float64)
        return np.asarray(model.score(E), dtype=np.float64)

    try:
        s = score(np.stack(rows), slice(None)).reshape(-1)
        if s.shape[0] != len(rows):
            raise ValueError(f"detector returned {s.shape[0]} scores for {len(rows)} rows")
        return [float(x) for x in s]
    except Exception as exc:
        log.warning("detector failed on a batch of %s (%s); retrying one by one", len(rows), exc)
    out: list[float | str] = []
    for i, row in enumerate(rows):
        try:
            one = score(np.asarray(row)[None, :], slice(i, i + 1)).reshape(-1)
            out.append(float(one[0]))
        except Exception as exc:
            out.append(f"detector: {type(exc).__name__}: {exc}")
    return out


def _check_rows(E: Any, n: int) -> np.ndarray:
    arr = np.asarray(E, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != n:
        raise ValueError(f"encoder returned shape {arr.shape} for {n} texts")
    return arr


def _as_query(p: Query | Rejected) -> Query:
    assert isinstance(p, Query)
    return p


def _version(loaded: Loaded | None) -> str | None:
    return loaded.version if loaded is not None else None
