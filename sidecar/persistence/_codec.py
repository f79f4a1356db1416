"""The model <-> artifact codec: an :class:`~sidecar.scoring.OODModel` as a JSON manifest
plus arrays (:class:`model_store.Artifact`, never pickle), and back.

Scoring gives and takes plain state (:func:`~sidecar.scoring.model_state` /
:func:`~sidecar.scoring.model_from_state`);
this module wraps that state in the store's artifact format and translates a state that
cannot be rebuilt into the store's :class:`~model_store.IncompatibleArtifact`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model_store import Artifact, IncompatibleArtifact, build_artifact
from sidecar.errors import InvalidModelState

if TYPE_CHECKING:  # scoring (numpy, scikit-learn) loads with the first model, not with the
    # store: `sidecar models list` and the store's users do not pay for it
    from sidecar.scoring import OODModel


def model_to_artifact(model: OODModel) -> Artifact:
    """``model`` as an artifact (manifest + arrays), ready to save or publish.

    Raises
    ------
    sidecar.errors.DataError
        The model has no finite threshold (calibrate it first).
    """
    from sidecar.scoring import model_state

    section, arrays = model_state(model)
    return build_artifact(
        kb=model.kb, encoder=model.encoder, model=section, arrays=arrays, metrics=model.metrics
    )


def model_from_artifact(artifact: Artifact) -> OODModel:
    """Rebuild the model of a verified artifact (checksums and signature already checked).

    Raises
    ------
    model_store.IncompatibleArtifact
        Unknown detector kind, or a model section or arrays that do not fit together.
    """
    from sidecar.scoring import model_from_state

    manifest = artifact.manifest
    try:
        return model_from_state(
            manifest.get("model"),
            artifact.arrays,
            kb=manifest.get("kb"),
            encoder=manifest.get("encoder"),
            metrics=manifest.get("metrics"),
            version=artifact.version,
        )
    except InvalidModelState as exc:
        raise IncompatibleArtifact(str(exc)) from exc
