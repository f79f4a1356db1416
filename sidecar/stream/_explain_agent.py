"""The explanation agent: requests from the audit topic, rules to the results topic.

Request (``kafka.audit_topic``), JSON::

    {"request_id": str, "query": str, "sources": [{"id": str, "text": str}, ...],
     "predicate": "contains:Paris", "rules": ["retention", "omission"]?,
     "miner": "dual"|"mono"?, "votes": int?}

Result (``kafka.explanations_topic``, keyed by ``request_id``)::

    {"request_id", "predicate", "black_box", "votes", "n_sources", "source_ids",
     "rules": {"retention": [[id, ...], ...], "omission": [...]},
     "answer_all_sources", "answer_no_sources", "stats": {...}, "ts"}

Bad requests go to ``kafka.dlq_topic`` as the scoring path's dead letters (the same
record, payload cap and JSON writer) with one of the reason codes below. Requests are
handled one at a time per worker; each one's black-box calls run concurrently up to
``explain.concurrency``, and the next request is taken only once the broker acknowledged
the previous result or dead letter, so a committed offset always has its answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from sidecar.errors import BlackBoxError, ConfigError, DataError
from sidecar.explain import (
    RULE_TYPES,
    BlackBox,
    ChatCompletionsClient,
    Predicate,
    RuleType,
    Source,
    explain,
    parse_predicate,
    sources_from_records,
)
from sidecar.settings import Settings
from sidecar.stream._halt import stop_without_waiting
from sidecar.stream._records import MAX_ID_CHARS, DeadLetter, Raw, dumps, utf8_encodable
from sidecar.stream._topics import RAW_BYTES

log = logging.getLogger(__name__)

# Reason codes of explanation requests on the dead-letter topic.
INVALID_JSON = "explain_invalid_json"  # not UTF-8 JSON, or not an object
BAD_REQUEST = "explain_bad_request"  # a field is missing or has the wrong type
BAD_PREDICATE = "explain_bad_predicate"  # the predicate spec does not parse
TOO_MANY_SOURCES = "explain_too_many_sources"  # over explain.max_sources
BLACK_BOX_FAILED = "explain_black_box_failed"  # the LLM failed after its retries
EXPLAIN_FAILED = "explain_failed"  # anything else raised while mining (logged with traceback)

REASONS = (
    INVALID_JSON,
    BAD_REQUEST,
    BAD_PREDICATE,
    TOO_MANY_SOURCES,
    BLACK_BOX_FAILED,
    EXPLAIN_FAILED,
)


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ExplainRequest:
    request_id: str
    query: str
    sources: list[Source]
    predicate: str
    rules: tuple[RuleType, ...]
    miner: str
    votes: int


def parse_request(value: bytes | None, settings: Settings) -> ExplainRequest:
    """Validate one request (pure: no I/O); raises ``_Rejected`` with a reason code."""
    try:
        # Decoded as UTF-8 first: json.loads of bytes would take UTF-16 and UTF-32 too.
        doc = json.loads((value or b"").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Rejected(INVALID_JSON, f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except ValueError as exc:  # JSONDecodeError, and an integer of more than 4,300 digits
        raise _Rejected(INVALID_JSON, f"not JSON: {exc}") from exc
    except RecursionError:
        raise _Rejected(INVALID_JSON, "not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise _Rejected(INVALID_JSON, "the request must be a JSON object")
    rid, query, spec = doc.get("request_id"), doc.get("query"), doc.get("predicate")
    if not isinstance(rid, str) or not rid:
        raise _Rejected(BAD_REQUEST, "'request_id' must be a non-empty string")
    # The id is the result's key: it must encode, and stay small.
    if len(rid) > MAX_ID_CHARS or not utf8_encodable(rid):
        raise _Rejected(
            BAD_REQUEST, f"'request_id' must be valid UTF-8 of at most {MAX_ID_CHARS} characters"
        )
    if not isinstance(query, str) or not query.strip():
        raise _Rejected(BAD_REQUEST, "'query' must be a non-empty string")
    if not isinstance(spec, str):
        raise _Rejected(BAD_PREDICATE, "'predicate' must be a spec string like contains:Paris")
    # Every text goes into prompts sent as UTF-8: a lone surrogate ("\ud800") cannot.
    if not utf8_encodable(query) or not utf8_encodable(spec):
        raise _Rejected(BAD_REQUEST, "'query' and 'predicate' must be valid UTF-8 text")
    raw_sources = doc.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise _Rejected(BAD_REQUEST, "'sources' must be a non-empty list of {id, text}")
    if len(raw_sources) > settings.explain.max_sources:
        raise _Rejected(
            TOO_MANY_SOURCES,
            f"{len(raw_sources)} sources > explain.max_sources={settings.explain.max_sources}",
        )
    try:
        sources = sources_from_records(raw_sources)
    except DataError as exc:
        raise _Rejected(BAD_REQUEST, str(exc)) from exc
    if not all(utf8_encodable(s.id) and utf8_encodable(s.text) for s in sources):
        raise _Rejected(BAD_REQUEST, "every source's 'id' and 'text' must be valid UTF-8 text")
    rules = doc.get("rules", list(RULE_TYPES))
    if not isinstance(rules, list) or not rules or any(r not in RULE_TYPES for r in rules):
        raise _Rejected(BAD_REQUEST, f"'rules' must be a non-empty subset of {list(RULE_TYPES)}")
    miner = doc.get("miner", "dual")
    if miner not in ("mono", "dual"):
        raise _Rejected(BAD_REQUEST, "'miner' must be 'mono' or 'dual'")
    votes = doc.get("votes", settings.explain.votes)
    if not isinstance(votes, int) or isinstance(votes, bool) or not 1 <= votes <= 15:
        raise _Rejected(BAD_REQUEST, "'votes' must be an integer in 1..15")
    return ExplainRequest(rid, query, sources, spec, tuple(rules), miner, votes)


def dead_letter(
    value: bytes | None, topic: str, partition: int, offset: int, reason: str, detail: str
) -> dict[str, Any]:
    """The dead-letter record of a request: the scoring path's, payload capped alike."""
    raw = Raw(value=value, topic=topic, partition=partition, offset=offset, timestamp_ms=None)
    return DeadLetter(raw, reason, detail).to_record(now_ms=time.time() * 1000.0)


class ExplainHandler:
    """Turns one raw request into ``(topic, key, value)`` to send; no Kafka inside."""

    def __init__(self, settings: Settings, black_box: BlackBox | None = None) -> None:
        self.settings = settings
        self._black_box = black_box

    @property
    def black_box(self) -> BlackBox:
        if self._black_box is None:  # built on first use, inside the running loop
            self._black_box = ChatCompletionsClient(self.settings.explain)
        return self._black_box

    async def handle(
        self, value: bytes | None, topic: str, partition: int, offset: int
    ) -> tuple[str, bytes | None, bytes]:
        k = self.settings.kafka
        try:
            req = parse_request(value, self.settings)
            try:
                predicate: Predicate = parse_predicate(
                    req.predicate, black_box=self.black_box, seed=self.settings.explain.seed
                )
            except ConfigError as exc:
                raise _Rejected(BAD_PREDICATE, str(exc)) from exc
            except (RecursionError, ValueError, re.error) as exc:  # e.g. a huge regex
                raise _Rejected(BAD_PREDICATE, f"{type(exc).__name__}: {exc}") from exc
            try:
                result = await explain(
                    req.query,
                    req.sources,
                    predicate,
                    self.black_box,
                    rules=req.rules,
                    miner="dual" if req.miner == "dual" else "mono",
                    votes=req.votes,
                    seed=self.settings.explain.seed,
                    concurrency=self.settings.explain.concurrency,
                )
            except BlackBoxError as exc:
                raise _Rejected(BLACK_BOX_FAILED, str(exc)) from exc
        except Exception as exc:
            if isinstance(exc, _Rejected):
                rej = exc
            else:  # mining or a bug: the agent lives on, the request is dead-lettered
                log.exception("explain request at %s[%s]@%s failed", topic, partition, offset)
                rej = _Rejected(EXPLAIN_FAILED, f"{type(exc).__name__}: {exc}")
            log.warning(
                "explain request at %s[%s]@%s rejected: %s", topic, partition, offset, rej.reason
            )
            record = dead_letter(value, topic, partition, offset, rej.reason, rej.detail)
            return k.dlq_topic, None, dumps(record)
        doc = {"request_id": req.request_id, **result.to_dict(), "ts": int(time.time() * 1000)}
        return k.explanations_topic, req.request_id.encode("utf-8"), dumps(doc)


def _where(msg: Any) -> tuple[str, int, int]:
    return msg.topic, msg.partition, msg.offset


def register_explain_agent(
    app: Any, settings: Settings, *, black_box: BlackBox | None = None
) -> Any:
    """Add the explanation agent to a faust ``app``; returns the agent.

    Parameters
    ----------
    app : faust.App
    settings : Settings
        Topic names from ``settings.kafka``, the LLM from ``settings.explain``.
    black_box : BlackBox, optional
        Default: a :class:`ChatCompletionsClient` on ``settings.explain``, built lazily.
    """
    k = settings.kafka
    raw: dict[str, Any] = {**RAW_BYTES, "partitions": k.partitions}
    requests = app.topic(k.audit_topic, **raw)
    out = {name: app.topic(name, **raw) for name in {k.explanations_topic, k.dlq_topic}}
    handler = ExplainHandler(settings, black_box)

    async def explain_requests(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            msg.incref()  # held until its answer is delivered (as on the scoring path)
            topic, key, value = await handler.handle(
                event.value, msg.topic, msg.partition, msg.offset
            )
            try:
                # faust's send only queues the record: wait for the broker's ack.
                await (await out[topic].send(key=key, value=value))
            except Exception as exc:
                # Never acked, so never committed; stop the worker rather than let faust
                # restart this agent past the request (see sidecar.stream._app).
                log.exception("explain answer for %s[%s]@%s not delivered", *_where(msg))
                stop_without_waiting(app, exc)
                return
            event.ack()

    return app.agent(requests, name="sidecar.explain", concurrency=1)(explain_requests)
