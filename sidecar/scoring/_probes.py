"""Encoder probes: a fingerprint of the weights that embedded a model's training data.

The encoder's name and width say which model a detector expects, not which weights: a
fine-tuned or re-exported model under the same name, or a stale directory, embeds queries
somewhere else, and every verdict drifts without any error. So a trained model keeps the
embeddings of a few fixed probe sentences, and a worker embeds the same sentences with the
encoder it runs and compares them before it installs the model. On all-MiniLM-L6-v2 the
same weights on ONNX Runtime or with bfloat16 layers agree with torch float32 to a cosine
of 0.99998 or more on every probe; noise of 10% of each weight tensor's spread drops it to
0.95, pooling by the first token to 0.42 (``benchmarks/results/encoder_probes.json``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Short and varied (a question, a statement, a command, a fragment, digits), written for
# this project. Changing them changes the fingerprint of every new model; models that
# recorded other sentences are then not compared (see probe_mismatch).
PROBE_TEXTS: tuple[str, ...] = (
    "How long should a fever last before I see a doctor?",
    "The library closes at nine on weekdays and at noon on Saturdays.",
    "Reset my password and send the link to my work address.",
    "quarterly revenue forecast for the northern region",
    "Is it safe to mix ibuprofen with a glass of wine?",
    "Order 4471 arrived with two of the 12 cups broken.",
)

# Lowest cosine, on any probe, between the embeddings recorded at training and those of
# the encoder that would serve the model: 350 times the largest shortfall (1 - cosine)
# measured for the same weights on another backend or precision, so that no machine
# refuses a model that is really its own.
MIN_PROBE_COSINE = 0.995


def probe_cosines(recorded: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Cosine between each recorded probe embedding and the running encoder's."""
    a = np.asarray(recorded, dtype=np.float64)
    b = np.asarray(running, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.asarray(np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-12))


def probe_mismatch(
    recorded: np.ndarray | None,
    recorded_texts: Sequence[str],
    running: np.ndarray | None,
    *,
    min_cosine: float = MIN_PROBE_COSINE,
) -> str | None:
    """Why the running encoder is not the one that embedded the model's data, or None.

    None as well where nothing can be compared: the model recorded no probes (trained
    from embeddings alone, or by an earlier release), the caller has no running encoder
    at hand, or the model recorded other probe sentences than :data:`PROBE_TEXTS`.
    """
    if recorded is None or running is None or tuple(recorded_texts) != PROBE_TEXTS:
        return None
    if np.shape(recorded) != np.shape(running):
        return (
            f"its probe embeddings have shape {np.shape(recorded)}, the running encoder's "
            f"{np.shape(running)}"
        )
    cos = probe_cosines(recorded, running)
    worst = float(np.min(cos)) if np.all(np.isfinite(cos)) else float("nan")
    if worst >= min_cosine:
        return None
    return (
        f"the running encoder embeds the probe sentences differently from the one that "
        f"embedded its training data (lowest cosine {worst:.3f}, at least {min_cosine} "
        "expected): same name, other weights?"
    )
