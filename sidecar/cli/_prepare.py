"""``sidecar prepare-encoder``: export and check the ONNX encoder ahead of time."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli._root import main


@main.command("prepare-encoder")
@click.option(
    "--encoder",
    default=None,
    help="sentence-transformers name or local model directory [default: scoring.encoder].",
)
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the export [default: scoring.onnx_cache_dir].",
)
def prepare_encoder(encoder: str | None, out_dir: str | None) -> None:
    """Export the encoder to ONNX and check it against torch, once, ahead of time.

    Writes <model>-<content hash>.onnx and the torch embeddings of the probe texts it
    was checked against. A worker whose scoring.onnx_prebuilt_dir (read-only is fine) or
    scoring.onnx_cache_dir holds both files loads the encoder without importing torch,
    in a fraction of the time and memory of a first start. The container image runs
    this at build time; run it yourself for a shared cache volume or a custom model.
    Needs torch and the onnx package, and a Transformer + mean Pooling model.
    """
    from sidecar.errors import ConfigError

    if out_dir is not None:
        # Checked before the model loads (seconds): the export is written there at the end.
        if not out_dir:
            raise ConfigError("--dir is empty; name the directory to write the export to")
        _check_writable_dir(Path(out_dir).expanduser(), "--dir")

    from sidecar.encoders import OnnxEncoder, available_cpus
    from sidecar.settings import load_settings

    scoring = load_settings().scoring
    where = Path(out_dir) if out_dir is not None else scoring.onnx_cache_dir
    enc = OnnxEncoder(encoder or scoring.encoder, threads=available_cpus(), cache_dir=where)
    path = enc.export_path
    mb = path.stat().st_size / 2**20
    click.echo(f"{enc.name}: {path} ({mb:.0f} MB), checked against {enc.reference_path.name}")
    click.echo(f"serve it with SIDECAR_SCORING__ONNX_PREBUILT_DIR={path.parent}")


def _check_writable_dir(path: Path, option: str) -> None:
    """Raise ConfigError unless a file can be written in ``path`` (made if missing).

    Beyond :func:`check_output_dir`, which goes by permission bits (that root passes
    everywhere), it tries: makes the missing folders, writes and removes a probe file, and
    removes the folders it made, so nothing is left behind.
    """
    import contextlib
    import os
    import tempfile

    from sidecar.cli._options import check_output_dir
    from sidecar.errors import ConfigError

    check_output_dir(path, option)
    made: list[Path] = []
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made.append(p)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".prepare-encoder-", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{option} {path} is not a writable directory ({exc.strerror or exc})"
        ) from exc
    finally:
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()
