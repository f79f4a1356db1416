"""The worker's shared state and its batch handler: score, publish, ack, or halt.

See :mod:`sidecar.stream._app` for the processing guarantee this implements (holds on
messages, acks after delivery, the halt on a batch that cannot be scored or delivered).

An encoder behind an embedding server (``remote``) is also watched here: the worker
consumes nothing until the server first answers, ``/readyz`` follows its answers, and a
server whose vectors stop matching the models in service is suspended (its batches get
``scoring.fail_mode`` verdicts) until they match again.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sidecar.errors import EncoderMismatch, StreamHalted
from sidecar.settings import Settings
from sidecar.stream._batch import BatchScorer
from sidecar.stream._encoder_thread import language_detector
from sidecar.stream._metrics import StreamMetrics
from sidecar.stream._publish import Publisher
from sidecar.stream._records import InputPolicy, Raw

log = logging.getLogger(__name__)

# How long the scoring agent waits for the first model load before fail_mode applies.
_INITIAL_LOAD_WAIT_S = 60.0
# An embedding server that does not answer is asked again this often (at most).
_ENCODER_RETRY_S = 1.0
# Probe vectors this close to the last ones are the same server weights.
_SAME_PROBES_COSINE = 0.9999


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
            languages=language_detector(sc, encoder.name),
            embedding_fallback=sc.embedding_fallback,
        )
        self.publisher: Publisher | None = None  # bound to the app's producer in create_app
        self.models_loaded = asyncio.Event()
        self.next_offset: dict[tuple[str, int], int] = {}
        self.batches = 0
        self.encoder_warm = False
        # Set once the encoder has answered (at once for a local one; see watch_encoder).
        self.encoder_ready = asyncio.Event()
        self._encoder_probes: np.ndarray | None = None
        self._inflight: asyncio.Future[None] | None = None
        # Why the worker halted (None while it runs); see halt().
        self.halted: str | None = None
        # Called once when the worker halts (create_app: stop the app without waiting
        # for the held records).
        self.on_halt: Callable[[str], None] | None = None

    @property
    def remote_encoder(self) -> bool:
        """Whether the encoder is an embedding server (whose weights may change)."""
        return bool(getattr(self.encoder, "remote", False))

    async def warm_up(self) -> None:
        """Run the encoder once at full batch size, on its thread: torch's first call is slow.

        An embedding server has nothing to warm here: this waits until it has answered
        (:meth:`watch_encoder`), so queries wait in Kafka while it cannot.
        """
        if self.remote_encoder:
            await self.encoder_ready.wait()
            self.encoder_warm = True
            return
        texts = ["warm-up query for the sidecar encoder"] * self.settings.scoring.batch_max
        t0 = time.perf_counter()
        await self.scorer.encoder_thread.encode(texts, batch_size=len(texts))
        self.encoder_warm = True
        self.encoder_ready.set()
        log.info("encoder warm-up took %.0f ms", (time.perf_counter() - t0) * 1000)

    def encoder_check(self) -> dict[str, Any]:
        """The ``/readyz`` encoder check: warm, and for a server, answering with the
        vectors of the models in service."""
        check: dict[str, Any] = {
            "ok": self.encoder_warm,
            "name": self.encoder.name,
            "backend": getattr(self.encoder, "backend", None),
        }
        if self.remote_encoder:
            server = self.encoder.describe()
            check["ok"] = bool(
                self.encoder_warm and server["reachable"] and server["suspended"] is None
            )
            check["server"] = server
        return check

    async def watch_encoder(self) -> None:
        """Ask an embedding server for the probe sentences every ``check_interval_s``, and
        every second while it does not answer, for as long as the worker runs.

        Its answer sets ``encoder_ready``; the encoder is suspended while the vectors differ
        from a model in service and resumed when they match again; and after an outage, or
        when the vectors changed, the watcher retries the versions it could not install.
        """
        server = self.settings.embedding_server
        quick = min(server.timeout_s, server.deadline_s)
        while True:
            down = self.encoder.state().reachable is False  # also after a failed batch
            try:
                probes = await asyncio.to_thread(self.encoder.probe, deadline_s=quick)
            except Exception as exc:  # the encoder recorded why; /readyz shows it
                log.debug("embedding server check failed: %s", exc)
            else:
                await self._encoder_answered(np.asarray(probes), back=down)
            await self._until_next_check(server.check_interval_s)

    async def _until_next_check(self, interval_s: float) -> None:
        """Sleep ``interval_s``, or a second while the server does not answer."""
        loop = asyncio.get_running_loop()
        end = loop.time() + interval_s
        while (left := end - loop.time()) > 0:
            await asyncio.sleep(min(_ENCODER_RETRY_S, left))
            if self.encoder.state().reachable is False:
                return

    async def _encoder_answered(self, probes: np.ndarray, *, back: bool) -> None:
        from sidecar.scoring import probe_cosines

        self.encoder.suspend(self._models_refusing(probes))
        last, self._encoder_probes = self._encoder_probes, probes
        changed = last is not None and (
            last.shape != probes.shape
            or not float(np.min(probe_cosines(last, probes))) >= _SAME_PROBES_COSINE
        )
        if not self.encoder_ready.is_set():
            self.encoder_ready.set()  # the first answer: the watcher starts after it
            return
        if changed or back:
            why = "changed its vectors" if changed else "answers again"
            log.info("embedding server %s: trying the models it held back again", why)
            try:
                await self.watcher.recheck()
            except Exception as exc:  # the watcher's own loops retry; say it once here
                log.warning("re-checking the models failed: %s", exc)

    def _models_refusing(self, probes: np.ndarray) -> str | None:
        """Why the server's probe vectors do not fit a model in service, or None."""
        for kb, loaded in sorted(self.holder.snapshot().items()):
            try:
                loaded.model.check_encoder(self.encoder.name, probes.shape[1], probes)
            except EncoderMismatch as exc:
                return f"its vectors no longer match version {loaded.version} of KB {kb}: {exc}"
        return None

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
                headers=_headers(getattr(ev.message, "headers", None)),
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
            handed_ms = await self.publisher.publish(outcome)
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
        # Latency ends where each verdict's latency_ms does: at the hand-off to the
        # producer (the wait for the broker's acks is the produce stage).
        self.metrics.observe_batch(outcome, handed_ms)


def _headers(headers: Any) -> tuple[tuple[str, Any], ...]:
    """A consumed record's headers as (key, value) pairs (faust gives a list or a mapping)."""
    if not headers:
        return ()
    items = headers.items() if hasattr(headers, "items") else headers
    return tuple((str(k), v) for k, v in items)


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
