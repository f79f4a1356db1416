"""Where models meet the store.

:func:`model_to_artifact` / :func:`model_from_artifact` turn an
:class:`~sidecar.scoring.OODModel` into a store artifact (JSON manifest + arrays, never
pickle) and back; :func:`warm_up` is the check every model passes before it serves;
:func:`open_store` / :func:`open_async_store` open the Redis or directory store that
``settings.store.backend`` names, with the signing key of ``settings.store.hmac_key``;
:func:`publish_model` puts an artifact there and promotes it when asked.
"""

from sidecar.persistence._checks import check_threshold, warm_up
from sidecar.persistence._codec import model_from_artifact, model_to_artifact
from sidecar.persistence._publish import publish_model
from sidecar.persistence._stores import open_async_store, open_store, signing_key

__all__ = [
    "check_threshold",
    "model_from_artifact",
    "model_to_artifact",
    "open_async_store",
    "open_store",
    "publish_model",
    "signing_key",
    "warm_up",
]
