"""Nearest Chebyshev (L-inf) distances by a compiled, pruned scan over blocks of points.

The epsilon-cube and epsilon-rect score a query by its L-inf distance to the nearest
training point. L-inf has no matrix-product form (the epsilon-ball's trick), and with
13 PCs a KD-tree visits many of its leaves anyway, most of all for the rectangle, whose
axes are rescaled to equal spread (12.8 us per query for 1,400 points on one core here,
against 1.8 for a plain compiled scan of every point).

So the points are split once, at fit, into blocks of at most ``leaf`` points by
recursive median cuts along the widest axis, and each block keeps its bounding box.
For each query the kernel computes the L-inf distance to every block's box (a lower
bound for every point in it), scans the nearest block first, then every other block
whose bound is still below the best distance so far. Within a block the coordinates are
stored axis-major, and the kernel scans a block one of two ways. Both give the same
distances; which is faster depends on the CPU and on what LLVM's vectoriser makes of
each loop there:

- ``rows`` runs over every point of the block once per axis, its running maxima in two
  block-wide buffers (read from one, written to the other); the compiler vectorises
  that loop over points into packed max and plain stores, under AVX2 and AVX-512
  alike. Updated in place, the same loop compiled to masked stores (``vmaskmovps``
  under AVX2), which AMD cores run as microcode (LLVM review D66801 measured it on
  AMD's Jaguar): on an AVX2-only EPYC that loop took 1.4-1.7x the time of ``lanes``;
- ``lanes`` takes eight points at a time through every axis, their maxima in eight
  scalar registers. The compiler leaves it scalar, but it needs no masked store.

Since the two-buffer change, rows takes 0.4x the time of lanes on an AVX-512 EPYC
(Zen 5), whether compiled for AVX-512 or for AVX2. The AVX2-only EPYC has not been
measured since, so ``scan="auto"`` (the default) still times both once per process and
per m on a small synthetic scan and keeps the faster.

Compiled by numba once per process, or loaded from numba's on-disk cache when the
package directory, ``NUMBA_CACHE_DIR`` or the user cache is writable; ``warm()``
compiles and chooses at model load rather than on the first query. Arithmetic is
float32, so distances agree with a float64 search to about 1e-7 relative.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Blocks of 256: fewer boxes to bound per query; measured best of 32-512 at 1k-100k points.
LEAF = 256
# Points the lanes scan takes together: eight float32 fill one AVX2 register (16 or 32
# were no faster there).
_LANES = 8
SCANS = ("rows", "lanes")
# The per-process choice of scan for each m, made by choose_scan().
_CHOSEN: dict[int, str] = {}


@functools.cache
def kernel() -> Any:
    """The compiled scan, built on first use: numba is imported only by processes that
    serve a cube or rectangle (it adds about 50 MB).

    Cached on disk where numba finds a writable place. numba refuses ``cache=True`` when
    neither the package directory nor its user cache is writable (a read-only container
    without a writable HOME); the kernel then compiles once per process instead.
    """
    import numba

    try:
        return numba.njit(cache=True, nogil=True, fastmath=True)(_nearest_kernel)
    except RuntimeError as exc:
        log.info("numba cannot cache the L-inf kernel (%s); compiling it per process", exc)
        return numba.njit(cache=False, nogil=True, fastmath=True)(_nearest_kernel)


def choose_scan(m: int) -> str:
    """The faster scan on this CPU for ``m`` axes, measured once per process and m.

    Each scan runs over the same synthetic points (2,048 in 8 blocks, 64 queries, most
    blocks scanned) five times, alternating; the lower minimum wins. Both give the same
    distances, so the choice moves only the time.
    """
    if m in _CHOSEN:
        return _CHOSEN[m]
    rng = np.random.default_rng(0)
    probe = BruteLinf(rng.normal(size=(2048, m)), scan="rows")
    Q = rng.normal(size=(64, m)) * 3.0
    best = dict.fromkeys(SCANS, np.inf)
    for _ in range(5):
        for name in SCANS:
            t0 = time.perf_counter()
            probe.nearest(Q, np.inf, scan=name)
            best[name] = min(best[name], time.perf_counter() - t0)
    chosen = min(SCANS, key=best.__getitem__)
    log.debug("L-inf scan for m=%d: %s (best of 5: %s)", m, chosen, best)
    _CHOSEN[m] = chosen
    return chosen


def _nearest_kernel(
    Q: np.ndarray,
    Pt: np.ndarray,
    starts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    bound: float,
    lanes: bool,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled; exercised through BruteLinf
    n_queries, m = Q.shape
    n_blocks = starts.shape[0] - 1
    lower = np.empty(n_blocks, dtype=np.float32)
    width = _LANES
    for b in range(n_blocks):
        width = max(width, starts[b + 1] - starts[b])
    acc = np.empty((2, width), dtype=np.float32)
    for i in range(n_queries):
        first = 0
        for b in range(n_blocks):
            g = np.float32(0.0)
            for j in range(m):
                below = lo[b, j] - Q[i, j]
                above = Q[i, j] - hi[b, j]
                if below > g:
                    g = below
                if above > g:
                    g = above
            lower[b] = g
            if g < lower[first]:
                first = b
        best = np.float32(bound)
        for t in range(-1, n_blocks):
            # The nearest box first, so that the best distance prunes the rest early.
            b = first if t < 0 else t
            if (t >= 0 and b == first) or lower[b] >= best:
                continue
            k0, end = starts[b], starts[b + 1]
            if not lanes:
                # rows: every point of the block once per axis. Index contiguous row
                # slices from 0: an offset index would need numba's negative-index
                # check, which stops the loop from vectorising (5x slower). The running
                # maxima go back and forth between two buffers: updated in place, LLVM
                # turns the loop into a masked store of the grown maxima, which is
                # microcoded and slow on AMD's AVX2 CPUs; two buffers give a plain
                # vector max and store on every CPU.
                w = end - k0
                row = Pt[0, k0:end]
                q0 = Q[i, 0]
                src, dst = acc[0], acc[1]
                for k in range(w):
                    src[k] = abs(q0 - row[k])
                for j in range(1, m):
                    row = Pt[j, k0:end]
                    qj = Q[i, j]
                    for k in range(w):
                        d = abs(qj - row[k])
                        a = src[k]
                        dst[k] = d if d > a else a
                    src, dst = dst, src
                for k in range(w):
                    if src[k] < best:
                        best = src[k]
                continue
            # lanes: _LANES points at a time through every axis, so that their running
            # maxima can stay in one vector register instead of going to memory and
            # back once per axis.
            lane = acc[0]
            while k0 + _LANES <= end:
                q0 = Q[i, 0]
                for k in range(_LANES):
                    lane[k] = abs(q0 - Pt[0, k0 + k])
                for j in range(1, m):
                    qj = Q[i, j]
                    for k in range(_LANES):
                        d = abs(qj - Pt[j, k0 + k])
                        lane[k] = d if d > lane[k] else lane[k]
                for k in range(_LANES):
                    if lane[k] < best:
                        best = lane[k]
                k0 += _LANES
            for k in range(k0, end):  # the block's last few points, as the lanes above
                d = abs(Q[i, 0] - Pt[0, k])
                for j in range(1, m):
                    x = abs(Q[i, j] - Pt[j, k])
                    d = x if x > d else d
                if d < best:
                    best = d
        out[i] = best


def _blocks(P: np.ndarray, leaf: int) -> list[np.ndarray]:
    """Row indices of ``P`` grouped into blocks of at most ``leaf`` nearby points."""
    done: list[np.ndarray] = []
    stack = [np.arange(P.shape[0])]
    while stack:
        idx = stack.pop()
        if idx.size <= leaf:
            done.append(idx)
            continue
        sub = P[idx]
        axis = int(np.argmax(sub.max(axis=0) - sub.min(axis=0)))
        half = idx.size // 2
        part = np.argpartition(sub[:, axis], half)
        stack.append(idx[part[half:]])
        stack.append(idx[part[:half]])
    return done


class BruteLinf:
    """Nearest L-inf distances to fixed points, each capped at a bound.

    Parameters
    ----------
    P : ndarray of shape (n_points, m), n_points >= 1
    leaf : int
        Most points per block.
    scan : {"auto", "rows", "lanes"}
        The scan; auto takes the faster on this CPU (:func:`choose_scan`), measured
        at the first query or at :meth:`warm`.
    """

    def __init__(self, P: np.ndarray, leaf: int = LEAF, scan: str = "auto") -> None:
        if scan not in ("auto", *SCANS):
            raise ValueError(f"unknown L-inf scan {scan!r}; one of auto, rows, lanes")
        self.scan = scan
        P32 = np.asarray(P, dtype=np.float32)
        if P32.ndim != 2 or P32.shape[0] == 0:
            raise ValueError("BruteLinf needs a non-empty (n_points, m) array")
        blocks = _blocks(P32, leaf)
        order = np.concatenate(blocks)
        self._Pt = np.ascontiguousarray(P32[order].T)
        self._starts = np.r_[0, np.cumsum([b.size for b in blocks])].astype(np.int64)
        self._lo = np.ascontiguousarray(np.stack([P32[b].min(axis=0) for b in blocks]))
        self._hi = np.ascontiguousarray(np.stack([P32[b].max(axis=0) for b in blocks]))

    def nearest(self, Q: np.ndarray, bound: float, scan: str | None = None) -> np.ndarray:
        """ndarray of shape (n_queries,), float64: min(distance to nearest point, bound).

        ``scan`` overrides the instance's scan for this call.
        """
        name = scan or self.scan
        if name not in ("auto", *SCANS):
            raise ValueError(f"unknown L-inf scan {name!r}; one of auto, rows, lanes")
        if name == "auto":
            name = choose_scan(self._Pt.shape[0])
        Q32 = np.ascontiguousarray(Q, dtype=np.float32)
        if Q32.ndim != 2 or Q32.shape[1] != self._Pt.shape[0]:
            raise ValueError(f"queries must have {self._Pt.shape[0]} columns")
        out = np.empty(Q32.shape[0], dtype=np.float64)
        finite = float(np.finfo(np.float32).max) if not np.isfinite(bound) else float(bound)
        lanes = name == "lanes"
        kernel()(Q32, self._Pt, self._starts, self._lo, self._hi, finite, lanes, out)
        if not np.isfinite(bound):
            out[out >= finite] = np.inf
        return out

    def warm(self) -> None:
        """Compile the kernel and choose the scan now (the first call in a process takes
        about half a second)."""
        self.nearest(np.asarray(self._Pt[:, :1].T), 1.0)
