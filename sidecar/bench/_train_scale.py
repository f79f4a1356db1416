"""Wall time and peak memory of ``sidecar train`` on synthetic KBs of growing size, each
in its own process (``sidecar bench train-scale``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.bench._report_file import write_report


@dataclass(frozen=True)
class TrainScaleBenchConfig:
    """What ``sidecar bench train-scale`` trains, and where its report goes.

    ``sizes``: KB sizes, one training process each. ``dim``: embedding dimension.
    ``queries``: ID and OOD training queries each. ``features``: the combined detector's
    blocks at m = 13 (None: ``sidecar train``'s default search). ``work_dir``: where the
    scratch embeddings and models are kept (None: a temporary folder, deleted after).
    """

    json_out: Path
    sizes: tuple[int, ...] = (10_000, 100_000)
    dim: int = 384
    queries: int = 3000
    pca_method: str = "auto"
    features: tuple[str, ...] | None = ("pcs", "residual")
    work_dir: Path | None = None


def run_train_scale_bench(
    config: TrainScaleBenchConfig, *, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train on each synthetic KB in a child process, then time scoring its artifact.

    Writes the report to ``config.json_out`` and returns it; ``echo`` gets one line per
    KB size as it is done.
    """
    from sidecar.training import TrainConfig, check_config

    check_config(TrainConfig(features=config.features))  # a bad block before any KB is made
    if config.work_dir is not None:
        config.work_dir.mkdir(parents=True, exist_ok=True)
        return _train_scale(config, config.work_dir, echo)
    with tempfile.TemporaryDirectory(prefix="train-scale-") as tmp:
        return _train_scale(config, Path(tmp), echo)


class _SyntheticKB:
    """Unit embeddings whose KB topic lives near a 48-dim subspace; one seeded stream."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(0)
        self.basis = self.rng.normal(size=(48, dim))

    @staticmethod
    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def id_like(self, n: int) -> np.ndarray:
        """``n`` embeddings near the KB topic, shape (n, dim)."""
        rng = self.rng  # topic coordinates drawn before the noise, as the figures were
        return self.unit(
            rng.normal(size=(n, 48)) @ self.basis + 0.6 * rng.normal(size=(n, self.dim))
        )

    def ood(self, n: int) -> np.ndarray:
        """``n`` embeddings in no particular direction, shape (n, dim)."""
        return self.unit(self.rng.normal(size=(n, self.dim)))


def _train_scale(config: TrainScaleBenchConfig, root: Path, echo: Callable[[str], None]) -> Any:
    blocks = config.features
    data = _SyntheticKB(config.dim)
    runs = []
    for n in config.sizes:
        d = root / f"n{n}"
        d.mkdir(exist_ok=True)
        np.save(d / "kb.npy", data.id_like(n))
        np.save(d / "id.npy", data.id_like(config.queries))
        np.save(d / "ood.npy", data.ood(config.queries))
        wall = _train_in_child(n, d, blocks, config.pca_method)
        stats = json.loads((d / "stats.json").read_text())
        run = {
            "n_kb": n,
            "process_wall_s": round(wall, 2),
            **stats,
            "us_per_query_batch256": _us_per_query_batch256(d / "model", data.id_like(256)),
        }
        runs.append(run)
        echo(
            f"n_kb={n}: train {stats['train_total_s']:.1f}s (process {wall:.1f}s), "
            f"peak RSS {stats['peak_rss_mb']:.0f} MiB, PCA {stats['pca_method']}, "
            f"{run['us_per_query_batch256']:.2f} us/query"
        )
    out = {
        "dim": config.dim,
        "queries_each": config.queries,
        "pca_method": config.pca_method,
        "runs": runs,
        "features": ",".join(blocks) if blocks else "default",
        "note": "synthetic unit embeddings; detector combined "
        + (
            f"[{', '.join(blocks)}] at 13 p-value PCs (residual norms at k=16,32,64), C "
            "searched over the default grid's values"
            if blocks
            else "with `sidecar train`'s default search (every default candidate)"
        ),
    }
    write_report(config.json_out, out)
    return out


def _train_in_child(n: int, d: Path, blocks: tuple[str, ...] | None, pca_method: str) -> float:
    """``sidecar train`` on the embeddings in ``d`` in a child process; its wall seconds.

    The child writes ``d/model`` and ``d/stats.json`` (its own peak RSS among them).
    """
    from sidecar.errors import SidecarError

    cmd = [
        sys.executable,
        "-m",
        "sidecar",
        "train",
        "--kb-embeddings",
        str(d / "kb.npy"),
        "--id-embeddings",
        str(d / "id.npy"),
        "--ood-embeddings",
        str(d / "ood.npy"),
        *(("--features", ",".join(blocks), "--m", "13") if blocks else ()),
        "--pca-method",
        pca_method,
        "--no-report",
        "--no-progress",
        "--kb-name",
        f"scale-{n}",
        "--out",
        str(d / "model"),
        "--stats-json",
        str(d / "stats.json"),
    ]
    t0 = time.perf_counter()
    child = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if child.returncode != 0:
        lines = [ln for ln in child.stderr.splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {child.returncode}"
        raise SidecarError(f"training the {n}-document KB failed: {why}")
    return wall


def _us_per_query_batch256(model_dir: Path, q: np.ndarray) -> float:
    """Median microseconds per query of scoring ``q`` (256 embeddings) with the saved
    model, projection and detector, on one BLAS thread."""
    from threadpoolctl import threadpool_limits

    from model_store import load_dir
    from sidecar.persistence import model_from_artifact

    model = model_from_artifact(load_dir(model_dir))
    times = []
    with threadpool_limits(limits=1):
        for _ in range(50):
            t1 = time.perf_counter()
            model.score(q)
            times.append(time.perf_counter() - t1)
    return float(np.median(times) / 256 * 1e6)
