"""What the holder needs of a model, and the loader it uses unless given one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from model_store import Artifact


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


def default_loader(artifact: Artifact) -> SwappableModel:
    """:func:`sidecar.persistence.model_from_artifact`, the watcher's loader unless given one."""
    from sidecar.persistence import model_from_artifact  # numpy and scikit-learn, when needed

    model: SwappableModel = model_from_artifact(artifact)
    return model
