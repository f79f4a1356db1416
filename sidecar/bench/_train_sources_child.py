"""One measurement of ``sidecar bench train-sources``, in a process of its own so that its
peak RSS is its own: ``python -m sidecar.bench._train_sources_child JSON``.

The JSON names the measurement (``kind``) and its source; the result is one JSON line on
stdout: rows, seconds, peak RSS and the RSS sampled every ``every`` rows. The DSN comes
from the settings (``SIDECAR_POSTGRES__DSN`` in the child's environment), never argv.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any


def _rss_mib() -> float:
    """The process's resident memory now (MiB)."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    """The process's peak resident memory (MiB): VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss would carry the parent's peak over into the child)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batches(job: dict[str, Any]) -> Iterator[Any]:
    if job["kind"].startswith("pg"):
        from sidecar.settings import load_settings
        from sidecar.training import PostgresSource

        with PostgresSource(load_settings().postgres) as pg:
            yield from pg.batches(job["source"], option="--kb-sql", kb=True, progress=False)
    else:
        from sidecar.training import parquet_batches

        yield from parquet_batches(job["source"], kb=True, progress=False)


def _stream(job: dict[str, Any]) -> dict[str, Any]:
    """Read every batch and drop it: the reader's own cost."""
    every, rows, dims = int(job["every"]), 0, None
    rss_at: dict[str, float] = {}
    start_rss = _rss_mib()
    t0 = time.perf_counter()
    for batch in _batches(job):
        before = rows
        rows += len(batch.texts)
        if batch.embeddings is not None:
            dims = int(batch.embeddings.shape[1])
        if rows // every > before // every:  # the rows read when sampled
            rss_at[str(rows)] = round(_rss_mib(), 1)
    seconds = time.perf_counter() - t0
    return {
        "rows": rows,
        "dims": dims,
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "rss_before_mib": round(start_rss, 1),
        "rss_mib_at_rows": rss_at,
        "peak_rss_mib": round(_peak_rss_mib(), 1),
    }


def _load(job: dict[str, Any]) -> dict[str, Any]:
    """The training job's input loading: the KB (and ID queries) with stored embeddings,
    a sample re-embedded as proof, nothing else encoded."""
    from sidecar.settings import load_settings
    from sidecar.training import InputSources, load_inputs

    start_rss = _rss_mib()
    t0 = time.perf_counter()
    inputs, check_s = load_inputs(
        InputSources(kb_sql=job["source"], id_queries_sql=job["queries"]),
        load_settings(),
        progress=False,
    )
    seconds = time.perf_counter() - t0
    return {
        "rows": len(inputs.kb),
        "dims": int(inputs.kb.shape[1]),
        "seconds": round(seconds, 2),
        "rows_per_s": round(len(inputs.kb) / seconds),
        "encoder_s": round(check_s, 2),
        "kb_matrix_mib": round(inputs.kb.nbytes / 2**20, 1),
        "rss_before_mib": round(start_rss, 1),
        "rss_after_mib": round(_rss_mib(), 1),
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "probes_recorded": inputs.encoder_probes is not None,
    }


def main(argv: list[str]) -> None:
    job = json.loads(argv[0])
    result = _load(job) if job["kind"] == "pg-load-inputs" else _stream(job)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
