"""The streaming sidecar: Kafka queries in, ID/OOD verdicts out, on faust-streaming.

``create_app(settings)`` builds the worker's faust app (no module-level app or model);
``BatchScorer`` and ``Publisher`` are the scoring path and its output (``score_once``
runs that path once, without Kafka); the record shapes and dead-letter reason codes live
in :mod:`sidecar.stream._records`. A query may carry its own embedding
(:mod:`sidecar.stream._embedding`) and its language (``LANGUAGE_HEADER``,
:mod:`sidecar.stream._query_language`); :func:`probe_sheet` and :func:`check_probe_embeddings`
let a client prove that its encoder is the model's before it sends any. The explanation agent
(:func:`register_explain_agent`) wraps the rule miners of :mod:`sidecar.explain` in the
same app.
"""

from typing import TYPE_CHECKING, Any

from sidecar.stream._app import create_app
from sidecar.stream._batch import STAGES, BatchOutcome, BatchScorer
from sidecar.stream._embedding import ENCODER_HEADER
from sidecar.stream._encoder_proof import ProbeCheck, check_probe_embeddings, probe_sheet
from sidecar.stream._encoder_thread import EncoderThread
from sidecar.stream._metrics import StreamMetrics
from sidecar.stream._publish import Publisher, TopicNames
from sidecar.stream._query_language import LANGUAGE_HEADER
from sidecar.stream._records import (
    NO_MODEL,
    REASONS,
    DeadLetter,
    InputPolicy,
    Query,
    Raw,
    Rejected,
    Verdict,
    parse_query,
)
from sidecar.stream._runtime import Runtime
from sidecar.stream._score_once import score_once
from sidecar.stream._topics import bootstrap_servers, ensure_topics, reach_brokers, sidecar_topics

__all__ = [
    "ENCODER_HEADER",
    "LANGUAGE_HEADER",
    "NO_MODEL",
    "REASONS",
    "STAGES",
    "BatchOutcome",
    "BatchScorer",
    "DeadLetter",
    "EncoderThread",
    "InputPolicy",
    "ProbeCheck",
    "Publisher",
    "Query",
    "Raw",
    "Rejected",
    "Runtime",
    "StreamMetrics",
    "TopicNames",
    "Verdict",
    "bootstrap_servers",
    "check_probe_embeddings",
    "create_app",
    "ensure_topics",
    "parse_query",
    "probe_sheet",
    "reach_brokers",
    "register_explain_agent",
    "score_once",
    "sidecar_topics",
]

if TYPE_CHECKING:
    from sidecar.stream._explain_agent import register_explain_agent


def __getattr__(name: str) -> Any:
    # The explanation agent, and the LLM client it brings, load only for a worker that
    # serves explanations (or for whoever asks for it by name): the scoring worker starts
    # without them.
    if name == "register_explain_agent":
        from sidecar.stream._explain_agent import register_explain_agent

        return register_explain_agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
