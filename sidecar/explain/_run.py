"""Explain one RAG answer as ``sidecar explain`` does: sources in, minimal rules and their JSON out.

:func:`run_explain` reads the retrieved sources, picks the black box (an OpenAI-compatible
endpoint, or the packaged local model), parses the predicate, mines the rules an
:class:`ExplainRequest` asks for and returns them with the JSON document the command
writes. No Kafka, no Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sidecar.errors import ConfigError
from sidecar.explain._client import BlackBox, ChatCompletionsClient
from sidecar.explain._explain import Explanation, MinerName, explain
from sidecar.explain._lattice import RULE_TYPES, RuleType
from sidecar.explain._local import LocalSmolLM2
from sidecar.explain._predicates import parse_predicate
from sidecar.explain._prompt import Source, load_sources
from sidecar.settings import ExplainSettings


class ProgressBar(Protocol):
    """What :func:`run_explain` tells about its progress: one ``update(1)`` per subset
    of sources answered (a tqdm bar has it)."""

    def update(self, n: int = 1) -> Any: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


@dataclass(frozen=True)
class ExplainRequest:
    """One answer to explain: the user's ``query``, the JSONL file of retrieved
    ``sources`` (in retrieval order), the ``predicate`` spec (``contains:TEXT`` ...), the
    rule types to mine, the miner (``dual`` or ``mono``), and whether the packaged local
    model answers instead of the endpoint of the settings."""

    query: str
    sources: Path
    predicate: str
    rules: Sequence[RuleType] = RULE_TYPES
    miner: MinerName = "dual"
    local_model: bool = False


@dataclass(frozen=True)
class ExplainRun:
    """The mined rules (``result``) and the JSON document that records them with the
    decoding settings, the sources and, for an endpoint, what reached it."""

    result: Explanation
    document: dict[str, Any]


def run_explain(
    es: ExplainSettings,
    request: ExplainRequest,
    *,
    progress: Callable[[], AbstractContextManager[ProgressBar]] | None = None,
) -> ExplainRun:
    """Mine the minimal rules of ``request`` with the black box of ``es``.

    ``progress`` makes the bar (a context manager) that the walk over the subset lattice
    updates once per subset answered; it is opened when the walk starts, after the sources,
    the black box and the predicate were all set up. Raises ConfigError when the sources
    exceed ``es.max_sources`` (the lattice has 2**n subsets).
    """
    sources = load_sources(request.sources)
    if len(sources) > es.max_sources:
        raise ConfigError(
            f"{len(sources)} sources > explain.max_sources={es.max_sources} "
            "(the lattice has 2**n subsets)"
        )
    black_box: BlackBox
    if request.local_model:
        black_box = LocalSmolLM2(
            max_tokens=es.max_tokens, temperature=es.temperature, top_p=es.top_p
        )
    else:
        black_box = ChatCompletionsClient(es)
    predicate = parse_predicate(request.predicate, black_box=black_box, seed=es.seed)
    bar = progress or (lambda: nullcontext(_NoBar()))

    async def mine() -> Explanation:
        try:
            with bar() as shown:
                return await explain(
                    request.query,
                    sources,
                    predicate,
                    black_box,
                    rules=request.rules,
                    miner=request.miner,
                    votes=es.votes,
                    seed=es.seed,
                    concurrency=es.concurrency,
                    progress=lambda _m, _v: shown.update(1),
                )
        finally:
            await black_box.aclose()

    result = asyncio.run(mine())
    return ExplainRun(result, _document(es, request, result, sources, black_box))


def _document(
    es: ExplainSettings,
    request: ExplainRequest,
    result: Explanation,
    sources: Sequence[Source],
    black_box: BlackBox,
) -> dict[str, Any]:
    doc = {
        "query": request.query,
        "miner": request.miner,
        **result.to_dict(),
        "decoding": {
            "temperature": es.temperature,
            "top_p": es.top_p,
            "max_tokens": es.max_tokens,
            "seed": es.seed,
        },
        "sources": [{"id": s.id, "snippet": s.snippet()} for s in sources],
    }
    if isinstance(black_box, ChatCompletionsClient):
        # stats.calls counts answers used (subsets x votes); what reached the endpoint
        # differs: a judge predicate asks once more per answer, the disk cache not at all.
        doc["endpoint"] = {
            "requests_sent": black_box.requests_sent,
            "cache_hits": black_box.cache_hits,
        }
    return doc
