"""Language centring at training time (``sidecar train --center-languages``).

The means come from every training text: the KB documents and the ID and OOD training
queries, each text's language told as the worker tells a query's (``TrainInputs``'s
``*_languages``; a text given as an embedding only counts in the global mean). Every
training embedding is centred with its language's mean before anything is split,
searched or fitted, so the model's KB embeddings, neighbour banks and calibration scores
live in the centred space its queries will be scored in; the denied topics (written in
English) lose the English mean where there is one, else the global one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sidecar.scoring import LanguageCentering

# The language the denied topics are written in (sidecar/data/deny_topics.txt).
DENY_TOPICS_LANGUAGE = "en"


def _told(langs: Sequence[str | None] | None, n: int) -> list[str | None]:
    return [None] * n if langs is None else list(langs)


def centred_inputs(inputs: Any) -> tuple[Any, LanguageCentering]:
    """``inputs`` (:class:`~sidecar.training.TrainInputs`) with every embedding centred by
    its text's language, and the means."""
    parts = [(inputs.kb, inputs.kb_languages), (inputs.id_queries, inputs.id_languages)]
    if inputs.ood_queries is not None:
        parts.append((inputs.ood_queries, inputs.ood_languages))
    E = np.vstack([np.asarray(e, dtype=np.float32) for e, _ in parts])
    langs = [x for e, told in parts for x in _told(told, len(e))]
    centering = LanguageCentering.fit(E, langs)

    def centred(e: np.ndarray | None, told: Sequence[str | None] | None) -> Any:
        return None if e is None else centering.transform(e, told)

    deny = inputs.deny_embeddings
    if deny is not None:
        deny = centering.transform(deny, [DENY_TOPICS_LANGUAGE] * len(deny))
    out = replace(
        inputs,
        kb=centred(inputs.kb, inputs.kb_languages),
        id_queries=centred(inputs.id_queries, inputs.id_languages),
        ood_queries=centred(inputs.ood_queries, inputs.ood_languages),
        deny_embeddings=deny,
    )
    return out, centering


def centering_stats(centering: LanguageCentering) -> dict[str, Any]:
    """What the training summary says of the means: the texts per language told, the
    languages with a mean of their own, and the minimum that takes."""
    from sidecar.scoring import MIN_LANGUAGE_TEXTS

    counts = dict(centering.counts or {})
    return {
        "n_texts": counts.pop("*", None),
        "texts_per_language": counts,
        "languages_with_mean": list(centering.languages),
        "min_texts": MIN_LANGUAGE_TEXTS,
    }
