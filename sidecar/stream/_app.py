"""The faust app factory: one scoring agent, the model watcher, and the worker's HTTP views.

Processing guarantee: **at-least-once**. A consumed record is acknowledged (its offset may
be committed) only after its verdict, or its dead letter, has been acknowledged by the
broker. A crash or a rebalance can therefore re-deliver records that already have a
verdict; a verdict is idempotent by ``id`` + ``model_version`` (consumers deduplicate on
that pair; the same query scored again by the same model gets the same decision).

How a record is kept from being acked early: faust's stream acks an event when the agent
asks for the next one. Each event's message is therefore *held* (one extra reference)
from the moment the agent queues it for a batch and released (acked) only after
:meth:`Publisher.publish` returned for its batch; whichever ack comes last is the final
one.

A batch that cannot be scored or delivered *halts* the worker (:meth:`Runtime.halt`):
nothing after it is published or acked, its records keep their hold, and the worker
stops with a non-zero exit so that its orchestrator restarts it. Carrying on in the same
process would be unsafe: faust would keep fetching past the held records, which then
never come back while the process lives, and its commit of a later record on the same
partition could step over them. Stopping is the one way back to the committed offsets,
where the restarted worker (or another replica, after the rebalance) reads them again.

Batching is the :class:`~sidecar.stream._batcher.MicroBatcher`'s: the agent queues events
as faust delivers them and one runner scores whatever has queued while the previous batch
was being encoded (``scoring.batch_max`` at most), so the batch size follows the load and
a lone query waits at most ``scoring.batch_timeout_ms`` for companions. Publishing one
batch overlaps the encoding of the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sidecar.errors import ConfigError, StreamHalted
from sidecar.settings import Settings
from sidecar.stream._batch import BatchScorer
from sidecar.stream._batcher import MicroBatcher
from sidecar.stream._metrics import StreamMetrics
from sidecar.stream._publish import Headers, Publisher, TopicNames
from sidecar.stream._records import InputPolicy, Raw

if TYPE_CHECKING:
    import faust

log = logging.getLogger(__name__)

# How long the scoring agent waits for the first model load before fail_mode applies.
_INITIAL_LOAD_WAIT_S = 60.0


class Runtime:
    """Everything one worker shares between its agent, its services and its views."""

    def __init__(
        self,
        settings: Settings,
        *,
        encoder: Any,
        holder: Any,
        store: Any,
        watcher: Any,
    ) -> None:
        self.settings = settings
        self.encoder = encoder
        self.holder = holder
        self.store = store
        self.watcher = watcher
        self.metrics = StreamMetrics()
        sc = settings.scoring
        self.scorer = BatchScorer(
            encoder,
            holder,
            InputPolicy(
                kbs=frozenset(sc.kbs),
                default_kb=sc.default_kb,
                max_text_chars=sc.max_text_chars,
                overlong=sc.overlong,
            ),
            fail_mode=sc.fail_mode,
            encode_batch_size=sc.batch_max,
        )
        self.publisher: Publisher | None = None  # bound to the app's producer in create_app
        self.models_loaded = asyncio.Event()
        self.next_offset: dict[tuple[str, int], int] = {}
        self.batches = 0
        self.encoder_warm = False
        self._inflight: asyncio.Future[None] | None = None
        # Why the worker halted (None while it runs); see halt().
        self.halted: str | None = None
        # Called once when the worker halts (create_app: stop the app without waiting
        # for the held records).
        self.on_halt: Callable[[str], None] | None = None

    async def warm_up(self) -> None:
        """Run the encoder once at full batch size, on its thread: torch's first call is slow."""
        texts = ["warm-up query for the sidecar encoder"] * self.settings.scoring.batch_max
        t0 = time.perf_counter()
        await self.scorer.encoder_thread.encode(texts, batch_size=len(texts))
        self.encoder_warm = True
        log.info("encoder warm-up took %.0f ms", (time.perf_counter() - t0) * 1000)

    async def wait_models(self, timeout_s: float = _INITIAL_LOAD_WAIT_S) -> None:
        """Let the first load finish before consuming (else early queries get fail_mode)."""
        try:
            await asyncio.wait_for(self.models_loaded.wait(), timeout_s)
        except TimeoutError:
            log.warning("no initial model load after %.0f s; serving with fail_mode", timeout_s)

    async def handle(self, events: Sequence[Any]) -> None:
        """Score one batch of held faust events and start publishing it.

        Publishing overlaps the scoring of the next batch; at most one batch is in flight
        (its delivery is awaited before the next one starts, which keeps verdicts in
        order and re-raises a delivery failure here).
        """
        raws = [
            Raw(
                value=ev.message.value,
                topic=ev.message.topic,
                partition=ev.message.partition,
                offset=ev.message.offset,
                timestamp_ms=(ev.message.timestamp * 1000.0) if ev.message.timestamp else None,
            )
            for ev in events
        ]
        if log.isEnabledFor(logging.DEBUG):
            oldest = min((r.timestamp_ms for r in raws if r.timestamp_ms), default=None)
            age = time.time() * 1000.0 - oldest if oldest else float("nan")
            log.debug("batch of %s taken; oldest record %.1f ms old", len(raws), age)
        if self.halted is not None:
            raise StreamHalted(self.halted)
        try:
            outcome = await self.scorer.score(raws)
        except Exception as exc:
            # Per-record failures are dead letters inside score(); this is the encoder
            # thread or the scorer itself failing, which retrying the batch will not fix.
            log.exception("batch of %s could not be scored", len(raws))
            raise self.halt(f"a batch could not be scored ({_describe(exc, raws)})") from None
        log.debug("batch of %s scored: %s", len(raws), outcome.timings)
        await self.drain()
        self._inflight = asyncio.ensure_future(self._publish(events, raws, outcome))
        # A failure is also handled by halt(); retrieving it here keeps asyncio from
        # logging it again when nothing drains the future (the worker is stopping).
        self._inflight.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def drain(self) -> None:
        """Wait for the batch in flight (raises :class:`StreamHalted` if it failed)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            await inflight

    def halt(self, reason: str) -> StreamHalted:
        """Stop publishing and acking for good; returns the error to raise.

        The first call logs the reason, marks ``/readyz`` unready and calls ``on_halt``.
        """
        if self.halted is None:
            self.halted = reason
            log.critical(
                "stream halted: %s; nothing more is published or committed, and the worker "
                "stops so that the records from the oldest uncommitted offset are delivered "
                "again",
                reason,
            )
            if self.on_halt is not None:
                self.on_halt(reason)
        return StreamHalted(self.halted)

    async def _publish(self, events: Sequence[Any], raws: list[Raw], outcome: Any) -> None:
        assert self.publisher is not None
        # No halted check here: a batch scored before the one that failed precedes it on
        # every partition, so delivering and acking it commits nothing past the failure.
        t0 = time.perf_counter()
        try:
            await self.publisher.publish(outcome)
        except Exception as exc:
            # The producer has already retried what the broker calls retriable; what
            # reaches here will not heal by sending the batch again.
            self.metrics.produce_errors.inc()
            log.exception("batch of %s not delivered; its offsets stay uncommitted", len(raws))
            raise self.halt(f"a batch was not delivered ({_describe(exc, raws)})") from None
        outcome.timings["produce"] = time.perf_counter() - t0
        for ev in events:
            # Release the hold. Whichever of this and the stream's own ack comes last is
            # the final ack that marks the offset committable.
            ev.ack()
        for r in raws:
            key = (r.topic, r.partition)
            self.next_offset[key] = max(self.next_offset.get(key, 0), r.offset + 1)
        self.batches += 1
        self.metrics.observe_batch(outcome, time.time() * 1000.0)


def _describe(exc: BaseException, raws: Sequence[Raw]) -> str:
    """The error and where its batch starts on each partition: one line, no query text."""
    first: dict[tuple[str, int], int] = {}
    for r in raws:
        key = (r.topic, r.partition)
        first[key] = min(first.get(key, r.offset), r.offset)
    where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(first.items()))
    return f"{type(exc).__name__}: {exc}; {len(raws)} records from {where}"


def freeze_startup_heap() -> float:
    """Collect once, then move every surviving object out of the garbage collector's view.

    torch, transformers and faust leave about half a million tracked objects after start;
    one full collection over them takes about 200 ms on one core, holds the GIL and so
    stops the event loop and the encoder thread at once (seen as a 230 ms half-rate p99
    in one benchmark run of three). Frozen objects are never scanned again, so later
    full collections only walk what the stream allocates. Returns the collection's ms.
    """
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    ms = (time.perf_counter() - t0) * 1000.0
    log.info("startup heap frozen: %s objects, collection took %.0f ms", gc.get_freeze_count(), ms)
    return ms


def create_app(
    settings: Settings,
    *,
    encoder: Any = None,
    holder: Any = None,
    store: Any = None,
) -> faust.App:
    """Build the scoring worker's faust app from ``settings``.

    Parameters
    ----------
    settings : Settings
        The process settings (Kafka, store, scoring, web, explain sections are used).
    encoder : Encoder, optional
        Sentence encoder; default: ``SentenceTransformerEncoder(settings.scoring.encoder)``
        (loads the model now, about 10 s).
    holder : ModelHolder, optional
        Active model per KB; default: a new ``ModelHolder(settings.scoring.kbs)``.
    store : AsyncModelStore, optional
        Where models come from; default: ``open_async_store(settings)``.

    Returns
    -------
    faust.App
        Run it with ``faust.Worker(app, ...)`` (see ``sidecar worker``). The runtime state
        is reachable as ``app.sidecar`` (tests, views).
    """
    import faust

    from sidecar.hotswap import ModelHolder, ModelWatcher, open_async_store
    from sidecar.stream._transport import install_low_latency_transport
    from sidecar.stream._web import register_views

    k, sc = settings.kafka, settings.scoring
    if sc.default_kb not in sc.kbs:
        raise ConfigError(f"scoring.default_kb {sc.default_kb!r} is not in scoring.kbs {sc.kbs}")
    if encoder is None:
        from sidecar.scoring import load_encoder

        encoder = load_encoder(sc)
    holder = holder if holder is not None else ModelHolder(sc.kbs)
    owns_store = store is None
    store = store if store is not None else open_async_store(settings)
    watcher = ModelWatcher(
        store,
        holder,
        encoder={"name": encoder.name, "dim": encoder.dim},
        poll_interval_s=settings.store.poll_interval_s,
    )
    rt = Runtime(settings, encoder=encoder, holder=holder, store=store, watcher=watcher)

    app = faust.App(
        k.app_id,
        broker=k.brokers,
        autodiscover=False,
        store="memory://",
        datadir=str(Path(tempfile.gettempdir()) / f"sidecar-faust-{k.app_id}"),
        processing_guarantee="at_least_once",
        # The embedded broker has no idempotent producer; aiokafka's default is off too.
        producer_acks=-1,
        # faust's default is 20 minutes of retries; a batch that cannot be delivered in
        # kafka.produce_timeout_s halts the worker instead (see Runtime.halt).
        producer_request_timeout=k.produce_timeout_s,
        broker_session_timeout=k.session_timeout_s,
        broker_heartbeat_interval=max(k.session_timeout_s / 5.0, 0.5),
        broker_rebalance_timeout=max(k.session_timeout_s * 2, 10.0),
        consumer_auto_offset_reset="earliest",
        topic_partitions=k.partitions,
        topic_replication_factor=k.replication_factor,
        topic_allow_declare=True,
        broker_credentials=_credentials(settings),
        # HTTP: only this module's views; faust's data-exposing pages are off.
        web_enabled=True,
        web_port=settings.web.port,
        web_bind=settings.web.host,
        web_host=settings.web.host,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        debug=False,
    )
    app.sidecar = rt  # type: ignore[attr-defined]
    install_low_latency_transport(app, k.fetch_max_wait_ms)

    raw: dict[str, Any] = {
        "key_type": bytes,
        "value_type": bytes,
        "key_serializer": "raw",
        "value_serializer": "raw",
    }
    queries = app.topic(k.queries_topic, partitions=k.partitions, **raw)
    out_topics = {
        name: app.topic(name, partitions=k.partitions, **raw)
        for name in {k.verdicts_topic, k.dlq_topic, k.id_topic, k.ood_topic}
    }

    async def send(topic: str, key: bytes | None, value: bytes, headers: Headers) -> Any:
        # Straight to the app's producer: the topics are raw bytes, and faust's Topic.send
        # machinery (FutureMessage, callbacks) cost about 1 ms of event-loop CPU per verdict,
        # which competes with the encoder for the same cores.
        assert topic in out_topics, topic
        return await app.producer.send(
            topic, key, value, partition=None, timestamp=None, headers=list(headers)
        )

    rt.publisher = Publisher(
        send,
        TopicNames(
            verdicts=k.verdicts_topic,
            dlq=k.dlq_topic,
            id=k.id_topic if k.route_topics else None,
            ood=k.ood_topic if k.route_topics else None,
        ),
    )

    halting: list[asyncio.Future[None]] = []

    def stop_after_halt(reason: str) -> None:
        # The held records are never acked, so stopping must not wait for them (faust
        # would, for ever); then crash the app, which makes the worker exit non-zero.
        app.conf.stream_wait_empty = False
        halting.append(asyncio.ensure_future(app.crash(StreamHalted(reason))))

    rt.on_halt = stop_after_halt

    async def score(stream: Any) -> None:
        await rt.warm_up()
        await rt.wait_models()
        freeze_startup_heap()
        batcher: MicroBatcher[Any] = MicroBatcher(
            rt.handle, max_size=sc.batch_max, linger_s=sc.batch_timeout_ms / 1000.0
        )
        batcher.start()
        try:
            async for event in stream.events():
                event.message.incref()  # hold: the stream's own ack must not be the final one
                await batcher.put(event)
        except StreamHalted:
            return  # the app is stopping (see stop_after_halt); restarting here would not help
        finally:
            # Stopping (SIGTERM, or a halt): finish and publish the batch being scored;
            # queued events keep their hold, stay uncommitted and are delivered again.
            await batcher.close()
            with contextlib.suppress(StreamHalted):
                await rt.drain()

    app.agent(queries, name="sidecar.score", concurrency=1)(score)
    app.service(cast(Any, _watcher_service(rt, close_store=owns_store)))
    register_views(app, rt)

    if settings.explain.enabled:
        try:
            from sidecar.explain._agent import register_explain_agent
        except ImportError as exc:
            raise ConfigError(
                f"explain.enabled is set but the explanation agent is unavailable: {exc}"
            ) from exc
        register_explain_agent(app, settings)
    return app


def _watcher_service(rt: Runtime, *, close_store: bool) -> Any:
    """A mode service that runs the model watcher for as long as the app runs."""
    import mode

    class ModelWatcherService(mode.Service):
        async def on_start(self) -> None:
            try:
                await rt.watcher.start()
            except Exception:
                log.exception("model watcher failed to start; serving with fail_mode")
            finally:
                rt.models_loaded.set()

        async def on_stop(self) -> None:
            await rt.watcher.stop()
            if close_store:
                await rt.store.close()

    return ModelWatcherService()


def _credentials(settings: Settings) -> Any:
    import faust

    k = settings.kafka
    if k.security_protocol == "PLAINTEXT":
        return None
    import ssl

    ctx = ssl.create_default_context() if k.security_protocol.endswith("SSL") else None
    if k.security_protocol.startswith("SASL"):
        if k.sasl_username is None or k.sasl_password is None:
            raise ConfigError("SASL needs kafka.sasl_username and kafka.sasl_password")
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password.get_secret_value(),
            mechanism=k.sasl_mechanism,
            ssl_context=ctx,
        )
    return faust.SSLCredentials(ctx)
