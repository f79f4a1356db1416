"""Denied topics: a screen that refuses queries close to a topic the operator names.

A KB-aligned detector asks "is this query about the knowledge base?". A harmful request
that shares the KB's subject ("steal passwords" against a cryptography KB, "a story that
glorifies suicide" against a literature KB) can answer yes: on the subject, it is not far
from the KB, and no labelled OOD query taught the detector its intent. The screen adds
the second question, "is this query close to something we refuse?", from short topic
descriptions embedded by the model's own encoder (so it works in every language that
encoder knows).

The screen is a third opinion inside the model's score, not a rule beside it. Each
topic's cosine is first put on its own scale by the ID training queries (0 at their
median, 1 at their 99th percentile), so a topic the KB's own users come close to (a
small-talk KB and "pretend you are an AI") counts only when a query comes closer than they
do; the largest of these is the query's topic term, put on one scale the same way. The
score is then the larger of the detector's score (on the same ID scale) and the topic
term, and the conformal threshold is calibrated on that score: the false-reject promise
holds as before, and an in-domain query near a denied topic costs the calibrated budget,
never more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._baselines import top_cosines
from sidecar.scoring._linear import _pin

# The ID quantiles the scales are pinned to: the detector's and each topic's, and the
# topic term's (which sets how much of the false-reject budget the screen may take). The
# term at its 99.8th percentile halved the ordinary OOD the screen costs on three dev KBs
# but gave back a third to a half of the harmful prompts it caught (docs/research/
# hostile-input.md), so it shares the budget evenly.
PIN_QUANTILE = 0.99
TERM_QUANTILE = 0.99


def _unit(X: Any) -> np.ndarray:
    A = np.asarray(X, dtype=np.float32)
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(A / norms)


@dataclass(frozen=True)
class DenyTopics:
    """Topic descriptions to refuse and their embeddings, before a model is fitted.

    Parameters
    ----------
    texts : tuple of str
        One short description per topic ("instructions for building a weapon").
    embeddings : ndarray of shape (len(texts), dim)
        The texts embedded by the encoder that embeds the model's training data.
    """

    texts: tuple[str, ...]
    embeddings: np.ndarray

    def __post_init__(self) -> None:
        E = np.asarray(self.embeddings)
        if not self.texts:
            raise DataError("a denied-topic list needs at least one topic")
        if E.ndim != 2 or E.shape[0] != len(self.texts):
            raise DataError(
                f"denied topics: {len(self.texts)} texts but embeddings of shape {E.shape}"
            )
        if not np.all(np.isfinite(E)):
            raise DataError("denied-topic embeddings hold NaN or infinite values")


@dataclass(frozen=True)
class DenyScreen:
    """The fitted screen: unit topic embeddings and the scales.

    Attributes
    ----------
    topics : tuple of str
    anchors : ndarray of shape (n_topics, dim), unit rows
    detector_center, detector_spread : float
        The detector's ID scale (0 at the ID median, 1 at its ``PIN_QUANTILE``).
    topic_centers, topic_spreads : ndarray of shape (n_topics,)
        Each topic's cosine's ID scale.
    term_center, term_spread : float
        The topic term's (the largest scaled topic cosine) ID scale.
    """

    topics: tuple[str, ...]
    anchors: np.ndarray
    detector_center: float
    detector_spread: float
    topic_centers: np.ndarray
    topic_spreads: np.ndarray
    term_center: float
    term_spread: float

    def __post_init__(self) -> None:
        A = np.asarray(self.anchors)
        n = len(self.topics)
        if A.ndim != 2 or A.shape[0] != n or not n:
            raise DataError(f"denied topics: {n} texts but anchors of shape {A.shape}")
        centers = np.asarray(self.topic_centers, dtype=np.float64)
        spreads = np.asarray(self.topic_spreads, dtype=np.float64)
        if centers.shape != (n,) or spreads.shape != (n,):
            raise DataError(f"denied topics: {n} texts but {centers.size} topic scales")
        for name in ("detector_spread", "term_spread"):
            v = float(getattr(self, name))
            if not (np.isfinite(v) and v > 0):
                raise DataError(f"denied-topic screen: {name} must be a positive number, got {v}")
        if not (np.all(np.isfinite(spreads)) and np.all(spreads > 0)):
            raise DataError("denied-topic screen: topic spreads must be positive numbers")
        for name in ("detector_center", "term_center"):
            if not np.isfinite(float(getattr(self, name))):
                raise DataError(f"denied-topic screen: {name} is not finite")
        if not np.all(np.isfinite(centers)):
            raise DataError("denied-topic screen: topic centers are not finite")
        object.__setattr__(self, "anchors", _unit(A))
        object.__setattr__(self, "topic_centers", centers)
        object.__setattr__(self, "topic_spreads", spreads)

    @property
    def dim(self) -> int:
        return int(self.anchors.shape[1])

    @classmethod
    def fit(cls, topics: DenyTopics, id_scores: Any, id_embeddings: Any) -> DenyScreen:
        """The screen for ``topics``, scaled by the detector's scores of the ID training
        queries and by their cosines to the topics.

        Parameters
        ----------
        topics : DenyTopics
        id_scores : ndarray of shape (n_id,)
            The detector's scores of the ID training queries.
        id_embeddings : ndarray of shape (n_id, dim)
            The same queries' embeddings.
        """
        s = np.asarray(id_scores, dtype=np.float64).ravel()
        if s.size == 0 or not np.all(np.isfinite(s)):
            raise DataError("the denied-topic screen needs finite scores of ID queries")
        anchors = _unit(topics.embeddings)
        S = _unit(id_embeddings).astype(np.float64) @ anchors.T.astype(np.float64)
        pins = [_pin(S[:, j], PIN_QUANTILE) for j in range(S.shape[1])]
        centers = np.array([c for c, _ in pins])
        spreads = np.array([w for _, w in pins])
        term = ((S - centers) / spreads).max(axis=1)
        d_c, d_s = _pin(s, PIN_QUANTILE)
        t_c, t_s = _pin(term, TERM_QUANTILE)
        return cls(tuple(topics.texts), anchors, d_c, d_s, centers, spreads, t_c, t_s)

    def _scaled(self, E: np.ndarray) -> np.ndarray:
        """Each topic's cosine on its ID scale; shape (n, n_topics)."""
        S = _unit(E).astype(np.float64) @ self.anchors.T.astype(np.float64)
        return (S - self.topic_centers) / self.topic_spreads

    def similarity(self, E: np.ndarray) -> np.ndarray:
        """Cosine of each embedding (n, dim) to its nearest denied topic; shape (n,)."""
        return top_cosines(_unit(E), self.anchors, 1).astype(np.float64)

    def nearest(self, E: np.ndarray) -> np.ndarray:
        """Index into ``topics`` of the topic that sets each embedding's topic term (the
        largest scaled cosine); shape (n,)."""
        return np.asarray(np.argmax(self._scaled(E), axis=1), dtype=np.int64)

    def topic_scores(self, E: np.ndarray) -> np.ndarray:
        """The topic term on its ID scale; shape (n,)."""
        return (self._scaled(E).max(axis=1) - self.term_center) / self.term_spread

    def combine(self, scores: np.ndarray, E: np.ndarray) -> np.ndarray:
        """The model's score: the larger of the detector's ``scores`` and the topic
        term, each on its ID scale; shape (n,)."""
        det = (np.asarray(scores, dtype=np.float64) - self.detector_center) / self.detector_spread
        return np.maximum(det, self.topic_scores(E))

    def state(self) -> tuple[dict[str, Any], np.ndarray]:
        """A JSON-able section and the anchor array."""
        section = {
            "topics": list(self.topics),
            "detector_center": self.detector_center,
            "detector_spread": self.detector_spread,
            "topic_centers": [float(v) for v in self.topic_centers],
            "topic_spreads": [float(v) for v in self.topic_spreads],
            "term_center": self.term_center,
            "term_spread": self.term_spread,
        }
        return section, np.asarray(self.anchors, dtype=np.float32)

    @classmethod
    def from_state(cls, section: Mapping[str, Any], anchors: Any) -> DenyScreen:
        """Built back from :meth:`state` (ValueError on a malformed section)."""

        def number(v: Any) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool)

        topics = section.get("topics")
        if not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
            raise ValueError("deny.topics is not a list of strings")
        nums: dict[str, float] = {}
        for key in ("detector_center", "detector_spread", "term_center", "term_spread"):
            v: Any = section.get(key)
            if not number(v):
                raise ValueError(f"deny.{key} is not a number")
            nums[key] = float(v)
        lists = {}
        for key in ("topic_centers", "topic_spreads"):
            v = section.get(key)
            if not (isinstance(v, list) and all(number(x) for x in v)):
                raise ValueError(f"deny.{key} is not a list of numbers")
            lists[key] = np.asarray(v, dtype=np.float64)
        return cls(
            tuple(topics),
            np.asarray(anchors, dtype=np.float32),
            nums["detector_center"],
            nums["detector_spread"],
            lists["topic_centers"],
            lists["topic_spreads"],
            nums["term_center"],
            nums["term_spread"],
        )


def read_topic_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """Topic texts from the lines of a topic file: one topic per line; blank lines and
    lines starting with ``#`` are skipped; repeated topics are kept once."""
    out = (line.strip() for line in lines)
    return tuple(dict.fromkeys(t for t in out if t and not t.startswith("#")))
