"""What a command checks before it stores, promotes or serves a model: an artifact
directory verified as it is read (checksums, schema, signature), and the model checked
as a worker would (:func:`sidecar.training.servable_model`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from model_store import Artifact
    from sidecar.settings import Settings


def servable_model(artifact: Artifact, *, refused: str, workers: Settings | None = None) -> Any:
    """:func:`sidecar.training.servable_model`, its notes printed on stderr."""
    from sidecar.training import servable_model as check

    return check(artifact, refused=refused, workers=workers, note=lambda m: click.echo(m, err=True))


_any_encoder_option = click.option(
    "--any-encoder",
    is_flag=True,
    help="Promote even when the model was built with another encoder than the settings' "
    "scoring.encoder (workers running that encoder refuse it and keep their model).",
)


def _load_for_import(directory: Path, key: bytes | None, *, allow_unsigned: bool) -> Artifact:
    """Load and verify an artifact directory; ``allow_unsigned`` waives only a missing signature.

    A signature that is present but wrong (tampered, or made with another key) is always
    rejected: put() re-signs with the local key, so accepting it would launder the artifact.
    """
    from model_store import SignatureInvalid, load_dir

    if key is None and allow_unsigned:
        click.echo("note: no signing key is configured, so --allow-unsigned changes nothing")
    if key is None or not allow_unsigned:
        try:
            return load_dir(directory, hmac_key=key)
        except SignatureInvalid as exc:
            if "unsigned" not in str(exc):
                raise
            # `sidecar train --out` writes unsigned models: say how to bring one in
            raise SignatureInvalid(
                f"{exc}; --allow-unsigned imports it signed with that key"
            ) from exc
    return load_local_dir(directory, key)


def load_local_dir(directory: Path, key: bytes | None) -> Artifact:
    """An artifact directory a command reads as is (``--artifact``): checksums and schema
    verified, and, with a signing key configured, a signature it carries must be right.

    An unsigned directory is a local file the user made (``sidecar train --out``); a
    signed one whose signature fails was changed after signing, and whatever is made
    from it (a recalibrated copy, put() re-signing it) would carry the change on.
    """
    from model_store import load_dir

    return load_dir(directory, hmac_key=key, allow_unsigned=True)
