"""What ``sidecar bench e2e`` runs: its frozen config, and the realistic query texts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import DataError

# The verdict field that names how the worker got the query's embedding (counted per value
# in every phase), and its value for a vector the client sent.
VERDICT_PATH_FIELD = "embedding_source"
CLIENT_PATH = "client"


def bench_texts(source: str, shared_data: Path | None = None) -> list[str]:
    """Realistic query texts: the demo queries, or CLINC-150 texts from ../shared/data.

    CLINC-150: the test utterances (in-scope and out-of-scope) where the file has them,
    else the validation ones.

    Raises
    ------
    DataError
        The CLINC-150 file is missing, unreadable or holds no utterances.
    """
    if source == "clinc":
        path = (shared_data or Path("../shared/data")) / "clinc150" / "data_full.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read CLINC-150 texts from {path}: {exc}") from exc
        for splits in (("test", "oos_test"), ("val", "oos_val")):
            texts = [str(t) for split in splits for t, *_ in doc.get(split, [])]
            if texts:
                return texts
        raise DataError(f"{path} has no test or val utterances")
    from sidecar.local import demo_data

    return [t for t, _ in demo_data().labelled()]


@dataclass(frozen=True)
class E2EBenchConfig:
    """The worker's settings and the load of ``sidecar bench e2e``, and where its report goes.

    ``queries``: the saturation run's queries; ``half_rate_queries``: at most this many
    in the half-rate run. ``batch_max``, ``batch_timeout_ms`` and the ``encoder_*``
    fields are the worker's ``scoring`` settings (``batch_max`` is also the encoder-only
    batch size). ``source``: "demo" or "clinc" texts. ``repeat``: whole runs, folded by
    :func:`median_report`. ``workdir``: where the worker log and the store are kept
    (None: a fresh temporary folder). ``timeout_s``: per wait for the worker or a phase.
    ``encoder``: the worker's encoder (None: ``scoring.encoder`` of the settings).
    ``pin``: the broker and this process (load generator, collector) on the lowest CPU,
    the worker and the encoder-only child on the others. ``embedding_queries``: the
    saturation run's queries on the embeddings path (``sidecar bench e2e
    --with-embeddings``), which runs an order of magnitude faster than the text path.
    """

    json_out: Path
    queries: int = 2000
    half_rate_queries: int = 1000
    batch_max: int = 64
    batch_timeout_ms: int = 5
    encoder_threads: int = 0
    encoder_dtype: str = "float32"
    encoder_backend: str = "auto"
    source: str = "demo"
    repeat: int = 1
    workdir: Path | None = None
    timeout_s: float = 600.0
    # the worker's scoring.encoder (None: the settings' own)
    encoder: str | None = None
    pin: bool = False
    embedding_queries: int = 20000
