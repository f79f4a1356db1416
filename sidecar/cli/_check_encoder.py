"""``sidecar check-encoder ...``: prove a client's encoder against a model before the client
sends query embeddings.

``probes`` prints the model's probe sentences (with its encoder's name, width and the
tolerance); the client embeds them with its own encoder and ``verify`` compares its
vectors with those the model recorded at training. Exit status: 0 pass, 1 fail, 2 for a
file that is not embeddings of the probe sentences (one ``error:`` line).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from sidecar.cli._model_inputs import model_options, read_model
from sidecar.cli._root import main
from sidecar.cli._store_access import _store_options

_FILE = click.Path(path_type=Path, dir_okay=False, allow_dash=True)


@main.group("check-encoder")
def check_encoder() -> None:
    """Prove that a client's encoder is a model's, before the client sends embeddings.

    A query record may carry the query's embedding ("embedding", with its encoder named in
    "encoder" or the sidecar-encoder header), which the worker then scores without
    encoding the text. The model accepts only vectors of the encoder it was built with:
    `probes` prints the model's probe sentences; embed them with the client's encoder and
    give the vectors to `verify`, which compares them with the ones the model recorded.
    The worker answers the same at /encoder/probes (GET the sentences, POST the vectors).
    """


def _model(
    artifact: Path | None, kb: str | None, ref: str, store_dir: Path | None, redis_url: str | None
) -> tuple[Any, str]:
    from sidecar.persistence import model_from_artifact
    from sidecar.settings import load_settings

    default_kb = load_settings().scoring.default_kb
    art, version = read_model(artifact, kb, ref, store_dir, redis_url, default_kb)
    return model_from_artifact(art), version


@check_encoder.command("probes")
@model_options("Read")
@_store_options
@click.option("--json", "as_json", is_flag=True, help="Print the probe sheet as JSON.")
def probes_command(
    artifact: Path | None,
    kb: str | None,
    ref: str,
    store_dir: Path | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Print the probe sentences of a KB's model (the active one by default), the name
    of its encoder (the one records must name), its width and the tolerance."""
    from sidecar.stream import probe_sheet

    model, version = _model(artifact, kb, ref, store_dir, redis_url)
    sheet = probe_sheet(model, version)
    if as_json:
        click.echo(json.dumps(sheet, indent=2, ensure_ascii=False))
        return
    click.echo(f"KB:         {sheet['kb']}")
    click.echo(f"version:    {sheet['version']}")
    click.echo(f"encoder:    {sheet['encoder']} ({sheet['dim']} dims)")
    click.echo(f"min cosine: {sheet['min_cosine']} on every sentence")
    click.echo(
        f"Embed these {len(sheet['texts'])} sentences with the client's encoder as it embeds "
        "queries, in this order,\nand give the vectors to `sidecar check-encoder verify FILE` "
        "(see its --help):"
    )
    for i, text in enumerate(sheet["texts"], start=1):
        click.echo(f"  {i}. {text}")


@check_encoder.command("verify")
@click.argument("file", type=_FILE)
@model_options("Check against")
@_store_options
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def verify_command(
    file: Path,
    artifact: Path | None,
    kb: str | None,
    ref: str,
    store_dir: Path | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Check a client's embeddings of the probe sentences (FILE, '-': standard input)
    against a KB's model; exit 0 when every cosine meets the tolerance, 1 when not.

    FILE is JSON: a list with one vector per sentence in the order `probes` printed them
    (each a JSON array of numbers or a base64 string of little-endian float32), an object
    {"embeddings": [...], "encoder": "<the name records will send>"}, or an OpenAI-style
    /v1/embeddings response as the embedding server answered it.
    """
    from sidecar.stream import check_probe_embeddings

    doc = _read_json(file)
    model, version = _model(artifact, kb, ref, store_dir, redis_url)
    check = check_probe_embeddings(model, doc, version)
    if as_json:
        click.echo(json.dumps(check.to_dict(), indent=2))
    else:
        word = "PASS" if check.ok else "FAIL"
        click.echo(
            f"{word}: encoder {check.encoder} ({check.dim} dims) of KB {check.kb}, "
            f"version {(check.version or '-')[:12]}: {check.detail}"
        )
    if not check.ok:
        sys.exit(1)


def _read_json(path: Path) -> Any:
    """The JSON document in ``path`` ('-': standard input); DataError when it is not."""
    from sidecar._input_files import input_file
    from sidecar.errors import DataError

    if str(path) == "-":
        data, name = sys.stdin.buffer.read(), "standard input"
    else:
        data = input_file(path, "a file of embeddings", missing=f"{path}: not found").read_bytes()
        name = str(path)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{name} is not JSON: {str(exc)[:200]}") from None
