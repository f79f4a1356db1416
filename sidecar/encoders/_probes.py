"""Embed the probe sentences a model records as the fingerprint of its encoder's weights.

The sentences and the comparison live with the model (:mod:`sidecar.scoring`); running
an encoder over them happens here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sidecar.scoring import PROBE_TEXTS


def embed_probes(encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """The probe sentences' embeddings by ``encode`` (texts -> (n, dim)), float32."""
    return np.asarray(encode(list(PROBE_TEXTS)), dtype=np.float32)
