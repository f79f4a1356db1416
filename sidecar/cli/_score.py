"""``sidecar score``: the worker's verdicts for a few queries, without Kafka.

For operators: check what the active model (or a candidate version, or a freshly trained
artifact directory) says about known queries before promoting it, or reproduce a verdict
from the stream. The queries go through the worker's own batch scorer
(:func:`sidecar.stream.score_once`), so the verdicts are the ones the stream would write,
and a malformed line gets the dead-letter reason the stream would give it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from sidecar._input_files import input_file
from sidecar.cli._model_inputs import read_model
from sidecar.cli._root import main
from sidecar.cli._servable import servable_model
from sidecar.cli._store_access import _store_options, _version_option

_TEXT_WIDTH = 70


@main.command("score")
@click.argument("texts", nargs=-1)
@click.option(
    "--file",
    "query_file",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=None,
    help="One query per line: plain text, or a JSON record as on the queries topic "
    '({"text"[, "id", "kb", "embedding", "encoder", ...]}); \'-\' reads standard input.',
)
@click.option("--kb", default=None, help="KB to score against [default: scoring.default_kb].")
@_version_option
@click.option(
    "--artifact",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Score with this artifact directory (`sidecar train --out`) instead of the store.",
)
@_store_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print the verdict / dead-letter records as JSON lines."
)
def score_command(
    texts: tuple[str, ...],
    query_file: Path | None,
    kb: str | None,
    ref: str,
    artifact: Path | None,
    store_dir: Path | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Score TEXTS (and/or --file) with a model and print the worker's verdicts.

    The model is the KB's active version in the store by default (--version picks another,
    e.g. a candidate stored with `sidecar train --publish --no-promote`), or an artifact
    directory (--artifact; checksums verified). The encoder is the worker's (settings:
    scoring.encoder and its backend), checked against the one the model was built with.
    Records the stream would dead-letter are shown with their reason code; the exit status
    is 0 either way.
    """
    from sidecar.errors import DataError
    from sidecar.settings import load_settings

    settings = load_settings()
    kb_name = kb or settings.scoring.default_kb
    records = [{"id": f"arg-{i}", "text": t} for i, t in enumerate(texts)]
    lines = _read_lines(query_file)
    values = [json.dumps(r).encode() for r in records] + [v for _, v in lines]
    # where each query came from, for the dead letters of the table
    origin = [str(r["id"]) for r in records] + [f"line {n}" for n, _ in lines]
    if not values and query_file is not None:
        name = "standard input" if str(query_file) == "-" else str(query_file)
        raise DataError(f"{name} holds no queries")
    if not values:
        raise click.UsageError("give query TEXTS or --file")
    art, version = read_model(artifact, kb, ref, store_dir, redis_url, kb_name)
    from sidecar.stream import score_once

    model = servable_model(art, refused="nothing was scored")
    outcome = score_once(settings, model, version, values)

    now_ms = time.time() * 1000.0
    rows = sorted(
        [(v.query.raw.offset, v.to_record(now_ms=now_ms), v.query.text) for v in outcome.verdicts]
        + [(d.raw.offset, d.to_record(now_ms=now_ms), origin[d.raw.offset]) for d in outcome.dead],
        key=lambda r: r[0],
    )
    if as_json:
        for _, doc, _ in rows:
            click.echo(json.dumps(doc))
        return
    click.echo(
        f"KB {model.kb!r}, version {version[:12]}, detector {model.detector_name}, "
        f"threshold {model.threshold:.4f} (score above it: OOD)"
    )
    for _, doc, text in rows:
        # control characters escaped: a query must not drive the operator's terminal
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
        if "verdict" not in doc:  # a dead letter; ``text`` says which query it was
            click.echo(f"  DLQ  {text}  {doc['reason']}: {doc['detail']}")
            continue
        shown = text if len(text) <= _TEXT_WIDTH else text[: _TEXT_WIDTH - 1] + "…"
        score = f"{doc['score']:+9.4f}" if doc["score"] is not None else f"{doc['reason']:>9}"
        if doc.get("embedding_source") == "client":
            shown += "  [its own embedding]"
        elif "embedding_fallback" in doc:
            shown += f"  [its embedding refused: {doc['embedding_fallback']}; text embedded]"
        click.echo(f"  {doc['verdict']:<4} {score}  {shown}")


def _read_lines(path: Path | None) -> list[tuple[int, bytes]]:
    """Record values from the non-blank lines of ``path`` ('-': standard input), each
    with its line number.

    A line that starts with ``{`` is a record as the queries topic carries it (an ``id``
    is filled in when missing; anything else wrong with it is the stream's dead letter);
    any other line is the text of one query. A path that cannot be read raises its
    ``OSError`` (one line and exit status 2, like every wrong path).
    """
    if path is None:
        return []
    if str(path) == "-":
        data = sys.stdin.buffer.read()
    else:
        data = input_file(
            path, "a file of queries", missing=f"--file {path}: not found"
        ).read_bytes()
    out = []
    for n, line in enumerate(data.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith(b"{"):
            text = line.decode("utf-8", errors="surrogateescape")
            out.append((n, json.dumps({"id": f"line-{n}", "text": text}).encode()))
            continue
        try:
            doc = json.loads(stripped)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "id" not in doc:
            doc["id"] = f"line-{n}"
            stripped = json.dumps(doc).encode()
        out.append((n, stripped))
    return out
