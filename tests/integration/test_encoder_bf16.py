"""The real default encoder with bfloat16 linear layers against float32 (loads the model)."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.encoders import SentenceTransformerEncoder
from sidecar.encoders._bf16 import bf16_supported
from sidecar.local._demo import demo_data


@pytest.mark.skipif(
    not bf16_supported("cpu"), reason="this CPU has no bfloat16 matrix units (AMX/AVX512-BF16)"
)
def test_bfloat16_embeddings_match_float32_ones() -> None:
    texts = [t for t, _ in demo_data().labelled()]
    ref = SentenceTransformerEncoder(threads=1).encode(texts)
    got = SentenceTransformerEncoder(threads=1, dtype="bfloat16").encode(texts)
    assert got.dtype == np.float32 and got.shape == ref.shape
    cos = np.sum(ref * got, axis=1)
    assert cos.min() > 0.9999, cos.min()
    assert not np.array_equal(ref, got)
