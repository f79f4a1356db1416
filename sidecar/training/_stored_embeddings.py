"""Proof that embeddings read with their texts were made by the encoder the model records.

A table or a Parquet file may carry each row's embedding beside its text (a RAG store
usually does). Training then skips encoding, but a model is only sound if the workers'
encoder embeds queries the way those vectors were made. The width says little (many
encoders give 384 dims), so the job re-embeds a fixed random sample of the rows' texts
with the model's encoder and compares: every sampled row must agree to the cosine a
worker asks of a model's probe embeddings (:data:`sidecar.scoring.MIN_PROBE_COSINE`).
Nothing is asked of the source beyond the texts it already has. The model then records
the probe embeddings of that same encoder, which the workers check as for any model.

A mismatch is refused: another encoder (or other weights under one name), vectors made
from other text than the ``text`` column (a title prepended, a different chunk), or
stale vectors of edited rows all break what the model would promise.
"""

from __future__ import annotations

import logging

import numpy as np

from sidecar.encoders import Encoder
from sidecar.errors import DataError
from sidecar.scoring import MIN_PROBE_COSINE, probe_cosines
from sidecar.training._source_rows import SourceRows

log = logging.getLogger(__name__)

CHECK_ROWS = 64  # texts re-embedded per input; about 0.3 s on 2 CPUs for MiniLM


def check_stored_embeddings(
    rows: SourceRows, encoder: Encoder, what: str, *, sample: int = CHECK_ROWS, seed: int = 0
) -> dict[str, float | int]:
    """Re-embed up to ``sample`` random rows of ``rows`` with ``encoder`` and compare with
    their stored embeddings; :class:`~sidecar.errors.DataError` unless every one agrees.

    Returns the figures of the check (rows compared, lowest and median cosine) for logs.
    """
    stored = rows.embeddings
    assert stored is not None
    if stored.shape[1] != encoder.dim:
        raise DataError(
            f"{what} embeddings ({rows.given}) have {stored.shape[1]} dims, but encoder "
            f"{encoder.name} gives {encoder.dim}: pass --encoder with the encoder that made "
            "them, or leave the embedding column out to embed the texts here"
        )
    n = len(rows.texts)
    k = min(sample, n)
    pick = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    fresh = np.asarray(encoder.encode([rows.texts[i] for i in pick]), dtype=np.float32)
    cos = probe_cosines(stored[pick], fresh)
    cos = np.where(np.isfinite(cos), cos, -1.0)
    bad = cos < MIN_PROBE_COSINE
    figures = {
        "rows": int(k),
        "min_cosine": float(cos.min()),
        "median_cosine": float(np.median(cos)),
    }
    if not bad.any():
        log.info(
            "%s embeddings of %s agree with encoder %s on %s sampled rows (lowest cosine %.5f)",
            what,
            rows.given,
            encoder.name,
            k,
            figures["min_cosine"],
        )
        return figures
    worst = int(np.argmin(cos))
    row = int(pick[worst])
    name = f"id {rows.ids[row]!r}" if rows.ids else f"row {row + 1}"
    raise DataError(
        f"{what} embeddings ({rows.given}) were not made by encoder {encoder.name} from the "
        f"'text' column: re-embedding {k} sampled rows gives {int(bad.sum())} below a cosine "
        f"of {MIN_PROBE_COSINE} (lowest {cos[worst]:.3f}, {name}; median "
        f"{figures['median_cosine']:.3f}). Pass --encoder with the encoder that made them, "
        "re-embed the stale rows, or leave the embedding column out to embed the texts here"
    )
