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

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sidecar.errors import ConfigError, StreamHalted
from sidecar.settings import Settings
from sidecar.stream._batcher import MicroBatcher
from sidecar.stream._halt import stop_without_waiting
from sidecar.stream._publish import Headers, Publisher, TopicNames
from sidecar.stream._runtime import Runtime, freeze_startup_heap
from sidecar.stream._topics import RAW_BYTES

if TYPE_CHECKING:
    import faust

log = logging.getLogger(__name__)


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
        Sentence encoder; default: ``load_encoder(settings)`` (loads the model now,
        seconds; an embedding server is not asked until the worker starts).
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
    from sidecar.stream._transport import install_low_latency_transport
    from sidecar.stream._web import register_views

    sc = settings.scoring
    if sc.default_kb not in sc.kbs:
        raise ConfigError(f"scoring.default_kb {sc.default_kb!r} is not in scoring.kbs {sc.kbs}")
    owns_store = store is None
    rt = _runtime(settings, encoder=encoder, holder=holder, store=store)
    app = _faust_app(settings)
    app.sidecar = rt  # type: ignore[attr-defined]
    install_low_latency_transport(app, settings.kafka.fetch_max_wait_ms)
    queries = _wire_topics(app, rt, settings)

    def stop_after_halt(reason: str) -> None:
        stop_without_waiting(app, StreamHalted(reason))

    rt.on_halt = stop_after_halt
    app.agent(queries, name="sidecar.score", concurrency=1)(_score_agent(rt, settings))
    app.service(cast(Any, _watcher_service(rt, close_store=owns_store)))
    register_views(app, rt)
    if settings.explain.enabled:
        _register_explain_agent(app, settings)
    return app


def _one_blas_thread() -> None:
    """Cap numpy's BLAS pool at one thread for this process.

    The detectors' products are a few hundred multiply-adds per query; OpenBLAS sizes its
    pool to every CPU the process may use, and on a 2-CPU worker its second thread took
    the encoder's CPU: the detect stage ran 30-50x slower and the worker reached 0.62 of
    the encoder's throughput instead of 0.77 (`benchmarks/results/e2e_openblas_threads.json`).
    The encoder's own threads (torch, ONNX Runtime) are not BLAS pools and keep theirs.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _runtime(settings: Settings, *, encoder: Any, holder: Any, store: Any) -> Runtime:
    """The worker's runtime: encoder, model holder, store and the watcher that swaps models."""
    from sidecar.encoders import embed_probes, load_encoder
    from sidecar.hotswap import ModelHolder, ModelWatcher
    from sidecar.persistence import open_async_store

    sc = settings.scoring
    _one_blas_thread()
    if encoder is None:
        encoder = load_encoder(settings)
    holder = holder if holder is not None else ModelHolder(sc.kbs)
    store = store if store is not None else open_async_store(settings)
    if getattr(encoder, "remote", False):
        # A server's weights can change behind its URL: its probes are asked for before
        # every install, and its width is the one they have.
        identity = {"name": encoder.name, "dim": encoder.known_dim or 0}
        probes, probe_encoder = None, _probe_call(encoder)
    else:
        identity = {"name": encoder.name, "dim": encoder.dim}
        probes, probe_encoder = embed_probes(encoder.encode), None
    watcher = ModelWatcher(
        store,
        holder,
        encoder=identity,
        encoder_probes=probes,
        probe_encoder=probe_encoder,
        poll_interval_s=settings.store.poll_interval_s,
    )
    return Runtime(settings, encoder=encoder, holder=holder, store=store, watcher=watcher)


def _probe_call(encoder: Any) -> Any:
    """The remote encoder's probe embeddings, asked for off the event loop."""
    import asyncio

    async def probe() -> Any:
        return await asyncio.to_thread(encoder.probe)

    return probe


def _faust_app(settings: Settings) -> faust.App:
    """The faust app itself: broker, at-least-once, timeouts, and the HTTP server."""
    import faust

    k = settings.kafka
    return faust.App(
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


def _wire_topics(app: faust.App, rt: Runtime, settings: Settings) -> Any:
    """Declare the raw-bytes topics, give the runtime its publisher; the queries topic."""
    k = settings.kafka
    raw: dict[str, Any] = {**RAW_BYTES, "partitions": k.partitions}
    queries = app.topic(k.queries_topic, **raw)
    out_topics = {
        name: app.topic(name, **raw)
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
    return queries


def _score_agent(rt: Runtime, settings: Settings) -> Any:
    """The scoring agent: hold each event, micro-batch, score, publish, then release."""
    sc = settings.scoring

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
            # queued events keep their hold, stay uncommitted and are delivered again. After
            # a halt the runner's failure comes back from close() and drain(): it is known.
            with contextlib.suppress(StreamHalted):
                await batcher.close()
            with contextlib.suppress(StreamHalted):
                await rt.drain()

    return score


def _register_explain_agent(app: faust.App, settings: Settings) -> None:
    try:
        from sidecar.stream._explain_agent import register_explain_agent
    except ImportError as exc:
        raise ConfigError(
            f"explain.enabled is set but the explanation agent is unavailable: {exc}"
        ) from exc
    register_explain_agent(app, settings)


def _watcher_service(rt: Runtime, *, close_store: bool) -> Any:
    """A mode service that runs the model watcher for as long as the app runs (and the
    embedding server's checks, after whose first answer the watcher starts)."""
    import asyncio

    import mode

    class ModelWatcherService(mode.Service):
        async def on_start(self) -> None:
            if rt.remote_encoder:
                # Not awaited here: the web views must answer while the server is down.
                self._background = [
                    asyncio.create_task(rt.watch_encoder(), name="encoder-checks"),
                    asyncio.create_task(self._start_watcher(), name="model-watcher-start"),
                ]
                return
            await self._start_watcher()

        async def _start_watcher(self) -> None:
            if rt.remote_encoder:
                # Models are checked against the server's vectors: it must answer first.
                await rt.encoder_ready.wait()
            try:
                await rt.watcher.start()
            except Exception:
                log.exception("model watcher failed to start; serving with fail_mode")
            finally:
                rt.models_loaded.set()

        async def on_stop(self) -> None:
            for task in getattr(self, "_background", []):
                task.cancel()
            await rt.watcher.stop()
            if close_store:
                await rt.store.close()

    return ModelWatcherService()


def _credentials(settings: Settings) -> Any:
    import faust

    from sidecar.stream._topics import hide_sasl_payloads, ssl_context

    k = settings.kafka
    if k.security_protocol == "PLAINTEXT":
        return None
    ctx = ssl_context(settings)
    if k.security_protocol.startswith("SASL"):
        if k.sasl_username is None or k.sasl_password is None:
            raise ConfigError("SASL needs kafka.sasl_username and kafka.sasl_password")
        hide_sasl_payloads()
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password.get_secret_value(),
            mechanism=k.sasl_mechanism,
            ssl_context=ctx,
        )
    return faust.SSLCredentials(ctx)
