"""Language centring: each embedding minus the mean embedding of its text's language, at
unit length again.

A multilingual sentence embedding carries a component that says which language the text
is in, roughly the mean embedding of that language (Libovický et al. 2020, "On the
language neutrality of pre-trained multilingual representations"). Subtracting it leaves
more of what the text is about. A centred model (``sidecar train --center-languages``)
carries the means it was trained with: one over every training text (the global mean)
and one per language with at least :data:`MIN_LANGUAGE_TEXTS` training texts. Every
embedding the model compares a query with (KB documents, neighbour banks, denied-topic
anchors) was centred at fit time, and every query is centred the same way before
anything else the model does: with its language's mean, or the global one for a language
without a mean of its own, an undetermined one (``"und"``) or none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sidecar.errors import DataError

# A language gets a mean of its own from this many training texts. The mean of n unit
# embeddings misses the language's own by a vector of expected squared length trace(cov)/n:
# 0.13 long at 50 texts (0.17 at 30) with USE on xSID, where the languages' means lie 0.13
# to 0.20 apart (Arabic 0.26 to 0.31 from the rest). With fewer texts the estimate is more
# noise than language, and the global mean serves as well.
MIN_LANGUAGE_TEXTS = 50
_UNDETERMINED = "und"


@dataclass(frozen=True, eq=False)
class LanguageCentering:
    """The means a centred model subtracts.

    Parameters
    ----------
    global_mean : ndarray of shape (dim,)
        Mean of every training embedding: for a query of a language without a mean.
    languages : tuple of str
        The languages with a mean of their own (ISO 639-1 codes), sorted.
    means : ndarray of shape (len(languages), dim)
    counts : dict of str to int
        Training texts per language told (with or without a mean of its own), and
        ``"*"``: every training text.
    """

    global_mean: np.ndarray
    languages: tuple[str, ...] = ()
    means: np.ndarray | None = None
    counts: Mapping[str, int] | None = None
    # One row per language, the global mean last (a query's row is its index here).
    _table: np.ndarray = field(init=False, repr=False)
    _row: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        g = np.asarray(self.global_mean, dtype=np.float64)
        if g.ndim != 1 or not g.size or not np.all(np.isfinite(g)):
            raise DataError(f"the global mean has shape {g.shape} or is not finite")
        M = np.zeros((0, g.size)) if self.means is None else np.asarray(self.means, np.float64)
        if M.shape != (len(self.languages), g.size) or not np.all(np.isfinite(M)):
            raise DataError(
                f"language means have shape {M.shape}, not ({len(self.languages)}, {g.size})"
            )
        if len(set(self.languages)) != len(self.languages) or not all(
            isinstance(x, str) and x and x != _UNDETERMINED for x in self.languages
        ):
            raise DataError(f"language codes {self.languages} are not distinct codes")
        object.__setattr__(self, "global_mean", g)
        object.__setattr__(self, "means", M)
        object.__setattr__(self, "counts", dict(self.counts or {}))
        object.__setattr__(self, "_table", np.vstack([M, g[None, :]]))
        object.__setattr__(self, "_row", {x: i for i, x in enumerate(self.languages)})

    @property
    def dim(self) -> int:
        return int(self.global_mean.size)

    @classmethod
    def fit(
        cls,
        E: Any,
        languages: Sequence[str | None] | None,
        *,
        min_texts: int = MIN_LANGUAGE_TEXTS,
    ) -> LanguageCentering:
        """The means of training embeddings ``E`` (n, dim), each text's language in
        ``languages`` (None or ``"und"``: counted in the global mean only; None for the
        whole argument: no language told)."""
        X = np.asarray(E, dtype=np.float64)
        if X.ndim != 2 or not len(X):
            raise DataError(f"centring needs training embeddings, got shape {X.shape}")
        langs = [None] * len(X) if languages is None else list(languages)
        if len(langs) != len(X):
            raise DataError(f"{len(langs)} languages for {len(X)} training texts")
        rows: dict[str, list[int]] = {}
        for i, lang in enumerate(langs):
            if lang and lang != _UNDETERMINED:
                rows.setdefault(str(lang), []).append(i)
        kept = sorted(x for x, r in rows.items() if len(r) >= min_texts)
        means = np.array([X[rows[x]].mean(axis=0) for x in kept]).reshape(len(kept), X.shape[1])
        counts = {x: len(r) for x, r in sorted(rows.items())}
        counts["*"] = len(X)
        return cls(X.mean(axis=0), tuple(kept), means, counts)

    def mean_for(self, language: str | None) -> np.ndarray:
        """The mean a text in ``language`` loses: its own, or the global one."""
        return self._table[self._row.get(language or "", -1)]

    def transform(self, E: Any, languages: Sequence[str | None] | None = None) -> np.ndarray:
        """``E`` (n, dim) centred: each row minus its language's mean (``languages``, one
        code or None per row; None for all: the global mean), at unit length.

        Returns
        -------
        ndarray of shape (n, dim), float32, C-contiguous. A row equal to its mean stays
        at zero (as long as it was); each row depends on itself and its language only.
        """
        X = np.asarray(E, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise DataError(f"embeddings of shape {X.shape} for means of {self.dim} dims")
        if languages is None:
            idx = np.full(len(X), len(self.languages), dtype=np.intp)
        else:
            langs = list(languages)
            if len(langs) != len(X):
                raise DataError(f"{len(langs)} languages for {len(X)} embeddings")
            idx = np.array([self._row.get(x or "", -1) for x in langs], dtype=np.intp).reshape(-1)
            idx[idx < 0] = len(self.languages)
        X = X - self._table[idx]
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return np.ascontiguousarray(X / norms, dtype=np.float32)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A JSON-able section and the arrays (``global_mean``, ``means``)."""
        section = {
            "languages": list(self.languages),
            "counts": dict(self.counts or {}),
        }
        arrays = {
            "global_mean": np.asarray(self.global_mean, dtype=np.float64),
            "means": np.asarray(self.means, dtype=np.float64),
        }
        return section, arrays

    @classmethod
    def from_state(
        cls, section: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
    ) -> LanguageCentering:
        """Built back from :meth:`state` (ValueError on a malformed section)."""
        langs = section.get("languages")
        if not (isinstance(langs, list) and all(isinstance(x, str) for x in langs)):
            raise ValueError("centering.languages is not a list of strings")
        counts = section.get("counts", {})
        if not isinstance(counts, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in counts.values()
        ):
            raise ValueError("centering.counts is not an object of language -> count")
        try:
            return cls(arrays["global_mean"], tuple(langs), arrays["means"], dict(counts))
        except DataError as exc:
            raise ValueError(str(exc)) from None
