"""``sidecar bench e2e``: the worker end to end against the embedded broker (see
:func:`sidecar.bench.run_e2e_bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sidecar.cli._options import check_output_file
from sidecar.cli._root import bench


@bench.command("e2e")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the report here.",
)
@click.option(
    "--queries",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Queries in the saturation run.",
)
@click.option(
    "--half-rate-queries",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="At most this many queries in the half-rate run (about 30 s of traffic).",
)
@click.option(
    "--batch-max",
    type=click.IntRange(1, 4096),  # scoring.batch_max's own range
    default=64,
    show_default=True,
    help="scoring.batch_max of the worker (and the encoder-only batch size).",
)
@click.option(
    "--sweep-batch-max",
    "sweep",
    default=None,
    metavar="N,N,...",
    help="Run the whole benchmark once per batch_max in this comma-separated list (e.g. "
    "1,4,16,64,256) instead of once at --batch-max; the report holds one point per size, "
    "for drawing throughput and latency against batch size.",
)
@click.option(
    "--batch-timeout-ms",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="scoring.batch_timeout_ms of the worker.",
)
@click.option(
    "--encoder-threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="scoring.encoder_threads of the worker and of the encoder-only run "
    "(0: the worker's automatic choice, the CPUs minus one).",
)
@click.option(
    "--texts",
    "source",
    type=click.Choice(["demo", "clinc"]),
    default="demo",
    show_default=True,
    help="Query texts: the packaged demo queries, or CLINC-150 test utterances from "
    "../shared/data (validation ones where the file has no test split), cycled to --queries.",
)
@click.option(
    "--encoder-dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default="float32",
    show_default=True,
    help="scoring.encoder_dtype of the worker and of the encoder-only run.",
)
@click.option(
    "--encoder-backend",
    type=click.Choice(["auto", "torch", "onnx"]),
    default="auto",
    show_default=True,
    help="scoring.encoder_backend of the worker; the encoder-only run uses the backend "
    "the worker resolved (auto: onnx where it loads, else torch).",
)
@click.option(
    "--encoder",
    default=None,
    help="scoring.encoder of the worker [default: settings].",
)
@click.option(
    "--compare-encoders",
    "compare",
    default=None,
    metavar="NAME,NAME,...",
    help="Run the whole benchmark once per encoder in this comma-separated list (e.g. "
    "all-MiniLM-L6-v2,use-multilingual-v3) instead of once; the report holds one point "
    "per encoder: throughput, half-load latency, encoder-only ceiling, RSS.",
)
@click.option(
    "--repeat",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="Run the whole benchmark this many times; the report gives medians and every run.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the worker log and the directory store here.",
)
@click.option(
    "--with-embeddings",
    is_flag=True,
    help="Also time queries that carry their embedding (base64 float32 computed here with "
    "the model's encoder before the clock starts, and the encoder's name), on the same "
    "worker after the text path; the report holds both as {text, embeddings, speedup}, "
    "with each process's CPU per query and the decoder's own cost.",
)
@click.option(
    "--embedding-queries",
    type=click.IntRange(min=1),
    default=20000,
    show_default=True,
    help="Queries in the embeddings path's saturation run (with --with-embeddings).",
)
@click.option(
    "--pin",
    is_flag=True,
    help="Pin the broker and this load generator to the lowest CPU and the worker (and the "
    "encoder-only runs) to the others: on 2 CPUs, one each. Needs 2 CPUs or more.",
)
@click.option(
    "--compare-pinning",
    is_flag=True,
    help="Run the benchmark twice, unpinned and then with --pin, and report both with the "
    "text path's throughput, ceiling, encode time and latency side by side.",
)
def e2e(
    json_out: Path,
    queries: int,
    half_rate_queries: int,
    batch_max: int,
    sweep: str | None,
    batch_timeout_ms: int,
    encoder_threads: int,
    encoder_dtype: str,
    encoder_backend: str,
    encoder: str | None,
    compare: str | None,
    source: str,
    repeat: int,
    workdir: Path | None,
    with_embeddings: bool,
    embedding_queries: int,
    pin: bool,
    compare_pinning: bool,
) -> None:
    """Throughput, latency and memory of the real worker on the embedded broker.

    Starts the broker, a directory model store with the demo KB model and one
    `sidecar worker` child process; produces QUERIES realistic queries flat out
    (saturation), then at half the measured rate (latency), then measures the encoder
    alone in a fresh process with the same batch size and torch threads (the ceiling),
    and with all CPUs for comparison. Reports
    throughput_qps, latency_ms_p50/p99, encoder_only_qps, ratio_to_encoder,
    worker_peak_rss_mb, the per-query time split, each process's CPU time, the CPU model,
    flags and load average, each process's allowed CPUs, and the targets.
    """
    from sidecar.bench import (
        E2EBenchConfig,
        run_e2e_batch_sweep,
        run_e2e_bench,
        run_e2e_embeddings_bench,
        run_e2e_encoder_comparison,
        run_e2e_pinning_comparison,
    )

    check_output_file(json_out, "--json")
    sizes = _batch_sizes(sweep) if sweep is not None else None
    encoders = [e.strip() for e in (compare or "").split(",") if e.strip()]
    if compare is not None and not encoders:
        raise click.BadParameter("name at least one encoder", param_hint="--compare-encoders")
    if encoders and (sizes is not None or encoder is not None):
        raise click.UsageError("--compare-encoders runs each encoder: leave out "
                               "--encoder and --sweep-batch-max")  # fmt: skip
    alone = {"--with-embeddings": with_embeddings, "--compare-pinning": compare_pinning}
    for flag, on in alone.items():
        if on and (encoders or sizes is not None):
            raise click.UsageError(f"{flag} runs once per setting: leave out "
                                   "--compare-encoders and --sweep-batch-max")  # fmt: skip
    if pin and compare_pinning:
        raise click.UsageError("--compare-pinning runs both unpinned and pinned: leave out --pin")
    if (pin or compare_pinning) and _cpus() < 2:
        raise click.UsageError("pinning needs at least 2 CPUs, this process may use 1")
    config = E2EBenchConfig(
        json_out=json_out,
        queries=queries,
        half_rate_queries=half_rate_queries,
        batch_max=batch_max,
        batch_timeout_ms=batch_timeout_ms,
        encoder_threads=encoder_threads,
        encoder_dtype=encoder_dtype,
        encoder_backend=encoder_backend,
        source=source,
        repeat=repeat,
        workdir=workdir,
        encoder=encoder,
        pin=pin,
        embedding_queries=embedding_queries,
    )
    if compare_pinning:
        compared = run_e2e_pinning_comparison(
            config, with_embeddings=with_embeddings, echo=click.echo
        )
        for key, values in compared["comparison"].items():
            click.echo(f"{key:>42}: {json.dumps(values)}")
        click.echo(f"report: {json_out}")
        return
    if with_embeddings:
        both = run_e2e_embeddings_bench(config, echo=click.echo)
        for name in ("text", "embeddings"):
            r = both[name]
            click.echo(
                f"{name:>10}: {r['throughput_qps']:9.1f} q/s, half-rate p50 "
                f"{r['half_rate']['latency_ms_p50']:.1f} ms, p99 "
                f"{r['half_rate']['latency_ms_p99']:.1f} ms"
            )
        click.echo(f"   speedup: {both['speedup']}x")
        click.echo(f"report: {json_out}")
        return
    if encoders:
        compared = run_e2e_encoder_comparison(config, encoders, echo=click.echo)
        for p in compared["points"]:
            half = p["half_rate"]
            click.echo(
                f"{p['encoder']:>26}: {p['throughput_qps']:8.1f} q/s (encoder alone "
                f"{p['encoder_only_qps']:.1f}), half-rate p50 {half['latency_ms_p50']:.1f} ms, "
                f"p99 {half['latency_ms_p99']:.1f} ms"
            )
        click.echo(f"report: {json_out}")
        return
    if sizes is not None:
        swept = run_e2e_batch_sweep(config, sizes, echo=click.echo)
        for p in swept["points"]:
            half = p["half_rate"]
            click.echo(
                f"batch_max {p['batch_max']:>4}: {p['throughput_qps']:8.1f} q/s, half-rate "
                f"p50 {half['latency_ms_p50']:.1f} ms, p99 {half['latency_ms_p99']:.1f} ms"
            )
        click.echo(f"report: {json_out}")
        return
    report = run_e2e_bench(config, echo=click.echo)
    click.echo(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "queries",
                    "throughput_qps",
                    "encoder_only_qps",
                    "ratio_to_encoder",
                    "latency_ms_p50",
                    "latency_ms_p99",
                    "worker_peak_rss_mb",
                )
            },
            indent=2,
        )
    )
    click.echo(f"half rate: {json.dumps(report['half_rate'])}")
    click.echo(f"report: {json_out}")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _batch_sizes(text: str) -> list[int]:
    """``--sweep-batch-max`` as a list of sizes, or one readable usage error."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(not 1 <= n <= 4096 for n in sizes):
        raise click.BadParameter(
            f"expected comma-separated integers from 1 to 4096, got {text!r}",
            param_hint="--sweep-batch-max",
        )
    return sizes


@bench.command("e2e-encoder", hidden=True)
@click.option(
    "--texts-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True
)
@click.option("--batch-size", type=click.IntRange(1, 4096), required=True)
@click.option("--encoder", default="all-MiniLM-L6-v2")
@click.option("--repeats", type=click.IntRange(min=1), default=1)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    help="torch threads (0: as the worker's default).",
)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32")
@click.option("--backend", type=click.Choice(["torch", "onnx", "auto"]), default="torch")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def e2e_encoder(
    texts_file: Path,
    batch_size: int,
    encoder: str,
    repeats: int,
    threads: int,
    dtype: str,
    backend: str,
    json_out: Path,
) -> None:
    """Encoder-only ceiling of `bench e2e` (run in a fresh process by it)."""
    from sidecar.bench import measure_encoder

    texts = json.loads(texts_file.read_text())
    report = measure_encoder(
        texts, batch_size, encoder, repeats, threads=threads, dtype=dtype, backend=backend
    )
    json_out.write_text(json.dumps(report))
