"""Where models meet the store: the configured store opened from the settings.

:func:`open_store` / :func:`open_async_store` open the Redis or directory store that
``settings.store.backend`` names, with the signing key of ``settings.store.hmac_key``.
"""

from sidecar.persistence._stores import open_async_store, open_store, signing_key

__all__ = ["open_async_store", "open_store", "signing_key"]
