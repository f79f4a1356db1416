"""Language centring in the evaluation harness (``sidecar eval --center-languages``).

Non-transductive, as ``sidecar train --center-languages`` builds it: per cross-fitted fold
(or per run, where a benchmark has training queries), the means are those of that fold's
training texts alone (the KB documents and the training queries it fits and calibrates
on), never of the queries it judges. Each text's language is the benchmark's own
(:attr:`KBTask.kb_language` for the KB and the training queries, :attr:`KBTask.language`
for the judged ones; None on the English benchmarks, where every text loses the one
global mean). A judged language without training texts (the queries of a cross-lingual
run) loses the global mean, which is then the KB language's: the model could not have
seen a mean of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sidecar.evaluation._datasets import KBTask
from sidecar.scoring import DenyTopics, LanguageCentering

# The language the denied topics are written in (as sidecar.training._centering says).
DENY_TOPICS_LANGUAGE = "en"


@dataclass(frozen=True)
class CentredFold:
    """A fold's training arrays centred by its training texts' means, and ``judged``,
    which centres the fold's judged queries the same way."""

    kb: np.ndarray
    id_train: np.ndarray
    ood_train: np.ndarray | None
    deny: DenyTopics | None
    judged: Callable[[np.ndarray], np.ndarray]
    centering: LanguageCentering


def train_language(task: KBTask) -> str | None:
    """The language of ``task``'s KB and training texts (None: not known)."""
    return task.kb_language or task.language


def centre_fold(
    task: KBTask,
    kb: np.ndarray,
    id_train: np.ndarray,
    ood_train: np.ndarray | None,
    deny: DenyTopics | None,
) -> CentredFold:
    """The fold's training embeddings (KB, ID and OOD training queries, denied topics)
    centred by the means of the KB and the training queries, and the centring of its
    judged queries."""
    lang = train_language(task)
    parts = [kb, id_train] + ([] if ood_train is None else [ood_train])
    E = np.vstack([np.asarray(p, dtype=np.float32) for p in parts if len(p)])
    centering = LanguageCentering.fit(E, [lang] * len(E))

    def centred(X: np.ndarray, language: str | None) -> np.ndarray:
        return centering.transform(X, [language] * len(X)) if len(X) else X

    if deny is not None:
        deny = DenyTopics(deny.texts, centred(deny.embeddings, DENY_TOPICS_LANGUAGE))
    return CentredFold(
        centred(kb, lang),
        centred(id_train, lang),
        None if ood_train is None else centred(ood_train, lang),
        deny,
        lambda X: centred(X, task.language),
        centering,
    )
