"""Errors raised by the sidecar.

::

    SidecarError                    root; ``retryable`` says whether trying again can help
    ├── ConfigError                 settings or command-line options that cannot work
    ├── DataError                   an input file (KB, queries, sources) is missing or malformed
    │   ├── InvalidModelState       a model's or detector's saved state cannot be rebuilt
    │   └── SourceUnavailable       the database an input is read from cannot be reached
    │                               (retryable)
    ├── NotFittedError              a detector or subspace was used before ``fit``
    ├── EncoderMismatch             embeddings from another encoder than the model was built with
    ├── EncoderUnavailable          the embedding server gave no vectors in time (retryable)
    │   └── EncoderRefused          it refused this client: a wrong key, model or URL, or
    │                               answers that are not embeddings (not retryable)
    ├── EncoderInputRejected        the embedding server refused these texts (HTTP 400/413/422)
    ├── ModelNotLoaded              no active model for a KB the sidecar serves
    ├── BrokerError                 the Kafka broker (or the embedded one) failed (retryable)
    ├── StreamHalted                a batch could not be scored or delivered: the worker stops
    └── ExplainError                rule mining failed
        └── BlackBoxError           the LLM endpoint failed after its retries (retryable)
            └── BlackBoxRefused     the endpoint refused the request (HTTP 4xx: a wrong
                                    key, model or URL; not retryable)

Model-store failures keep their own tree (``model_store.ModelStoreError``) because the
store package is a leaf that imports nothing from ``sidecar``.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Root of every sidecar error."""

    retryable: bool = False


class ConfigError(SidecarError):
    """Settings or options that cannot work together."""


class DataError(SidecarError):
    """An input file is missing, unreadable or has the wrong shape."""


class InvalidModelState(DataError):
    """A model's or detector's saved state (parameters and arrays) cannot be rebuilt: an
    unknown detector kind, a missing array, or parts that do not fit together. The store
    layer reports it as ``model_store.IncompatibleArtifact``."""


class SourceUnavailable(DataError):
    """The database a KB or query set is read from is down, unreachable or refused the
    connection; trying again later can help."""

    retryable = True


class NotFittedError(SidecarError, AttributeError):
    """An estimator was used before ``fit`` (also an ``AttributeError``, like scikit-learn)."""


class EncoderMismatch(SidecarError):
    """Embeddings come from a different encoder (name or dimension) than the model expects."""


class EncoderUnavailable(SidecarError):
    """The embedding server gave no vectors before the deadline: unreachable, overloaded
    (429, 5xx) or too slow, after its retries. A worker answers such a batch with
    ``scoring.fail_mode`` and reports itself not ready until the server answers again."""

    retryable = True


class EncoderRefused(EncoderUnavailable):
    """The embedding server refused this client (HTTP 401, 403, 404, ...) or answered with
    something that is not the embeddings asked for: the same request would fail again
    until the server or the settings change."""

    retryable = False


class EncoderInputRejected(SidecarError):
    """The embedding server refused the texts of one request (HTTP 400, 413, 422): an input
    it will not take, not an outage. A worker retries such a batch query by query, so the
    one it refuses goes to the dead-letter topic."""


class ModelNotLoaded(SidecarError):
    """The sidecar serves a KB for which no model is loaded."""


class BrokerError(SidecarError):
    """The Kafka broker could not be started or reached."""

    retryable = True


class StreamHalted(SidecarError):
    """A batch could not be scored or its verdicts delivered; the worker stops consuming.

    Its records keep their uncommitted offsets and are delivered again to the worker that
    next owns their partitions (this one, restarted, or another replica).
    """

    retryable = True


class ExplainError(SidecarError):
    """Rule mining could not complete."""


class BlackBoxError(ExplainError):
    """The black-box LLM failed after retries."""

    retryable = True


class BlackBoxRefused(BlackBoxError):
    """The LLM endpoint refused the request itself (HTTP 401, 403, 404, 422, ...): the
    same request would be refused again."""

    retryable = False
