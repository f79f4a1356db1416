"""Whether a stored model can serve: loaded and checked as a worker checks it before it
swaps (warm-up), built with the workers' encoder (name and width), and embedding the
encoder's probe sentences as the workers' encoder does."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model_store import Artifact
    from sidecar.settings import Settings


def servable_model(
    artifact: Artifact,
    *,
    refused: str,
    workers: Settings | None = None,
    note: Callable[[str], None] | None = None,
) -> Any:
    """The :class:`~sidecar.scoring.OODModel` of ``artifact``, checked as a worker checks
    it before it swaps (:func:`~sidecar.persistence.warm_up`); else
    :class:`~model_store.IncompatibleArtifact`. Every command that promotes passes the
    ``workers``' settings: a model of another encoder than theirs is refused as well
    (:func:`_check_encoder`; commands leave them out under ``--any-encoder``).

    Its encoder probes are compared too, with the workers' encoder loaded here
    (:func:`_check_probes`).

    Checksums and signature say the bytes are intact, not that the model section makes
    sense or that its arrays fit together; a version no worker can load must never become
    active, and no command should crash on one. ``refused`` says what did not happen
    ("nothing was imported").
    """
    from model_store import ArtifactRejected, IncompatibleArtifact
    from sidecar.persistence import model_from_artifact, warm_up  # numpy, scikit-learn

    try:
        model = model_from_artifact(artifact)
        warm_up(model, int(model.encoder["dim"]))
    except ArtifactRejected as exc:
        raise IncompatibleArtifact(
            f"{artifact.kb}/{artifact.version} is not a loadable model: {exc}; {refused}"
        ) from exc
    if workers is not None:
        _check_encoder(artifact, workers, refused=refused)
        _check_probes(artifact, model, workers, refused=refused, note=note)
    return model


def _check_encoder(artifact: Artifact, settings: Settings, *, refused: str) -> None:
    """Refuse to promote a model of another encoder than the workers' (the settings').

    Workers refuse such a version and keep serving their old model; one that starts
    afterwards has none at all and answers every query with its fail mode.
    """
    from model_store import IncompatibleArtifact
    from sidecar.encoders import encoder_dim, encoder_label

    want = encoder_label(settings.scoring.encoder)
    got = str(artifact.encoder.get("name"))
    if got != want:
        raise IncompatibleArtifact(
            f"{artifact.kb}/{artifact.version} was built with encoder {got!r}, but the "
            f"workers' scoring.encoder is {want!r}; {refused} (set scoring.encoder as the "
            "workers do, or pass --any-encoder)"
        )
    width, dim = encoder_dim(settings.scoring.encoder), artifact.encoder.get("dim")
    if width is not None and dim != width:
        raise IncompatibleArtifact(
            f"{artifact.kb}/{artifact.version} has {dim}-dim embeddings, but the workers' "
            f"encoder {want!r} gives {width}; {refused} (pass --any-encoder to promote it "
            "anyway)"
        )


def _check_probes(
    artifact: Artifact,
    model: Any,
    settings: Settings,
    *,
    refused: str,
    note: Callable[[str], None] | None,
) -> None:
    """Refuse to promote a model whose encoder probes the workers' encoder does not embed
    as recorded (same name, other weights). Needs that encoder here: where it cannot be
    loaded, say so and leave the check to the workers, which keep their model."""
    from model_store import IncompatibleArtifact
    from sidecar.encoders import embed_probes, load_encoder
    from sidecar.errors import EncoderMismatch, SidecarError
    from sidecar.scoring import PROBE_TEXTS

    if model.encoder_probes is None or tuple(model.encoder_probe_texts) != PROBE_TEXTS:
        return  # trained from embeddings, or by a release without probes
    try:
        encoder = load_encoder(settings)
        running = embed_probes(encoder.encode)
    except (SidecarError, OSError, RuntimeError) as exc:  # e.g. an ONNX export that failed
        if note is not None:
            note(
                f"note: {artifact.kb}/{artifact.version}'s encoder probes were not compared: "
                f"the workers' encoder cannot run here ({exc})"
            )
        return
    try:
        model.check_encoder(encoder.name, encoder.dim, probes=running)
    except EncoderMismatch as exc:
        raise IncompatibleArtifact(
            f"{artifact.kb}/{artifact.version}: {exc}; {refused} (workers running this "
            "encoder would refuse it too; pass --any-encoder to promote it anyway)"
        ) from exc
