"""The checks a model passes before it serves: a finite threshold and a warm-up score.

A worker runs them before it swaps a model in, and every command that stores, promotes or
serves a model runs the same ones, so a version no worker can load never becomes active.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from model_store import ArtifactRejected


def check_threshold(model: Any) -> None:
    """Raise ArtifactRejected unless the model's threshold is finite."""
    threshold = getattr(model, "threshold", 0.0)
    if not np.isfinite(threshold):
        # score > NaN is always False: every query would pass as in-domain.
        raise ArtifactRejected(f"threshold {threshold!r} is not finite")


def warm_up(model: Any, dim: int) -> None:
    """Raise ArtifactRejected unless ``model`` can serve: a finite threshold, and finite
    scores for two probe embeddings of ``dim`` dims (scoring them must not fail).

    One probe touches every coordinate, so a NaN anywhere in the arrays the model
    multiplies shows; the other is a unit axis. A model that cannot score them would
    send every query to the dead-letter topic.
    """
    check_threshold(model)
    probe = np.zeros((2, dim), dtype=np.float32)
    probe[0] = 1.0 / np.sqrt(dim)
    probe[1, 0] = 1.0
    try:
        scores = np.asarray(model.score(probe))
    except Exception as exc:  # arrays whose checksums hold but whose shapes do not fit
        why = (str(exc) or type(exc).__name__).splitlines()[0][:300]
        raise ArtifactRejected(f"the model cannot score a probe query: {why}") from exc
    if scores.shape != (2,) or not np.all(np.isfinite(scores)):
        raise ArtifactRejected(
            f"warm-up scores have shape {scores.shape} or are not finite "
            "(a NaN or infinity in the model's arrays?)"
        )
