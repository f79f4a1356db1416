"""Denied topics: a screen that refuses queries close to a topic the operator names.

A KB-aligned detector asks "is this query about the knowledge base?". A harmful request
that shares the KB's subject ("steal passwords" against a cryptography KB, "a story that
glorifies suicide" against a literature KB) can answer yes: on the subject, it is not far
from the KB, and no labelled OOD query taught the detector its intent. The screen adds
the second question, "is this query close to something we refuse?", from short topic
descriptions embedded by the model's own encoder (so it works in every language that
encoder knows).

The screen is a third opinion inside the model's score, not a rule beside it: the score
becomes the larger of the detector's score and the query's cosine to its nearest denied
topic, each put on one scale by the ID training queries (0 at their median; 1 at their
99th percentile for the detector, whose fit makes its own ID rows look better than new
ones, and at their 95th for the topic cosine, as the combined detector's floor does).
The conformal threshold is then calibrated on that score, so the false-reject promise is
kept as before: an in-domain query that happens to sit near a denied topic costs the
calibrated budget, never more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sidecar.errors import DataError
from sidecar.scoring._baselines import top_cosines

# The ID quantiles the two scales are pinned to (see the module docstring).
DETECTOR_QUANTILE = 0.99
TOPIC_QUANTILE = 0.95


def _unit(X: Any) -> np.ndarray:
    A = np.asarray(X, dtype=np.float32)
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(A / norms)


def _pin(v: np.ndarray, q: float) -> tuple[float, float]:
    """(median, spread) of ID values ``v``: the spread runs from the median to the ``q``
    quantile (the standard deviation where that is 0, else 1)."""
    center = float(np.median(v))
    spread = float(np.quantile(v, q)) - center
    if not spread > 0:
        spread = float(np.std(v)) or 1.0
    return center, spread


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
    """The fitted screen: unit topic embeddings and the two scales.

    Attributes
    ----------
    topics : tuple of str
    anchors : ndarray of shape (n_topics, dim), unit rows
    detector_center, detector_spread : float
        The detector's ID scale (0 at the ID median, 1 at its ``DETECTOR_QUANTILE``).
    topic_center, topic_spread : float
        The topic cosine's ID scale (0 at the ID median, 1 at its ``TOPIC_QUANTILE``).
    """

    topics: tuple[str, ...]
    anchors: np.ndarray
    detector_center: float
    detector_spread: float
    topic_center: float
    topic_spread: float

    def __post_init__(self) -> None:
        A = np.asarray(self.anchors)
        if A.ndim != 2 or A.shape[0] != len(self.topics) or not self.topics:
            raise DataError(
                f"denied topics: {len(self.topics)} texts but anchors of shape {A.shape}"
            )
        for name in ("detector_spread", "topic_spread"):
            v = float(getattr(self, name))
            if not (np.isfinite(v) and v > 0):
                raise DataError(f"denied-topic screen: {name} must be a positive number, got {v}")
        for name in ("detector_center", "topic_center"):
            if not np.isfinite(float(getattr(self, name))):
                raise DataError(f"denied-topic screen: {name} is not finite")
        object.__setattr__(self, "anchors", _unit(A))

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
        sim = top_cosines(_unit(id_embeddings), anchors, 1).astype(np.float64)
        d_c, d_s = _pin(s, DETECTOR_QUANTILE)
        t_c, t_s = _pin(sim, TOPIC_QUANTILE)
        return cls(tuple(topics.texts), anchors, d_c, d_s, t_c, t_s)

    def similarity(self, E: np.ndarray) -> np.ndarray:
        """Cosine of each embedding (n, dim) to its nearest denied topic; shape (n,)."""
        return top_cosines(_unit(E), self.anchors, 1).astype(np.float64)

    def nearest(self, E: np.ndarray) -> np.ndarray:
        """Index into ``topics`` of each embedding's nearest denied topic; shape (n,)."""
        return np.asarray(np.argmax(_unit(E) @ self.anchors.T, axis=1), dtype=np.int64)

    def topic_scores(self, E: np.ndarray) -> np.ndarray:
        """The topic cosine on the screen's scale; shape (n,)."""
        return (self.similarity(E) - self.topic_center) / self.topic_spread

    def combine(self, scores: np.ndarray, E: np.ndarray) -> np.ndarray:
        """The model's score: the larger of the detector's ``scores`` and the topic
        cosine, each on its ID scale; shape (n,)."""
        det = (np.asarray(scores, dtype=np.float64) - self.detector_center) / self.detector_spread
        return np.maximum(det, self.topic_scores(E))

    def state(self) -> tuple[dict[str, Any], np.ndarray]:
        """A JSON-able section and the anchor array."""
        section = {
            "topics": list(self.topics),
            "detector_center": self.detector_center,
            "detector_spread": self.detector_spread,
            "topic_center": self.topic_center,
            "topic_spread": self.topic_spread,
        }
        return section, np.asarray(self.anchors, dtype=np.float32)

    @classmethod
    def from_state(cls, section: Mapping[str, Any], anchors: Any) -> DenyScreen:
        """Built back from :meth:`state` (ValueError on a malformed section)."""
        topics = section.get("topics")
        if not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
            raise ValueError("deny.topics is not a list of strings")
        nums = {}
        for key in ("detector_center", "detector_spread", "topic_center", "topic_spread"):
            v = section.get(key)
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise ValueError(f"deny.{key} is not a number")
            nums[key] = float(v)
        return cls(tuple(topics), np.asarray(anchors, dtype=np.float32), **nums)


def read_topic_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """Topic texts from the lines of a topic file: one topic per line; blank lines and
    lines starting with ``#`` are skipped; repeated topics are kept once."""
    out = (line.strip() for line in lines)
    return tuple(dict.fromkeys(t for t in out if t and not t.startswith("#")))
