"""What the holder needs of a model, and the checks a model passes before it serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from model_store import Artifact, ArtifactRejected


class SwappableModel(Protocol):
    """What the holder needs of a model (``sidecar.scoring.OODModel`` satisfies it)."""

    def score(self, E: np.ndarray) -> np.ndarray:
        """OOD scores, shape (n_queries,), for embeddings of shape (n_queries, dim)."""
        ...

    def predict(self, E: np.ndarray) -> np.ndarray:
        """True where a query is OOD, shape (n_queries,)."""
        ...

    def check_encoder(self, name: str, dim: int, probes: np.ndarray | None = None) -> None:
        """Raise ``EncoderMismatch`` unless the model was built for this encoder (and, given
        the running encoder's probe embeddings, for its weights)."""
        ...


ModelLoader = Callable[[Artifact], SwappableModel]


def check_threshold(model: SwappableModel) -> None:
    """Raise ArtifactRejected unless the model's threshold is finite."""
    threshold = getattr(model, "threshold", 0.0)
    if not np.isfinite(threshold):
        # score > NaN is always False: every query would pass as in-domain.
        raise ArtifactRejected(f"threshold {threshold!r} is not finite")


def warm_up(model: SwappableModel, dim: int) -> None:
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


def default_loader(artifact: Artifact) -> SwappableModel:
    """``sidecar.scoring.OODModel.from_artifact``, the watcher's loader unless given one."""
    from sidecar.scoring import OODModel  # the scoring package, imported when first needed

    model: SwappableModel = OODModel.from_artifact(artifact)
    return model
