"""A faust Kafka transport whose consumer long-polls for a short time.

faust's aiokafka driver builds its consumer with a fixed ``fetch_max_wait_ms=1500``.
A broker that honours long polling answers as soon as a record arrives, so the wait only
matters when the topic is idle; but the embedded broker answers only when the wait
expires, and 1500 ms put a median of about 470 ms between a query being produced and the
worker taking it. This module swaps in a consumer thread that sets the wait
(``kafka.fetch_max_wait_ms``) before the consumer starts. Nothing else changes.
"""

from __future__ import annotations

from typing import Any


def install_low_latency_transport(app: Any, fetch_max_wait_ms: int) -> None:
    """Give ``app`` (before it starts) a transport with a short fetch wait."""
    from faust.transport.drivers import aiokafka as driver

    class ConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # aiokafka hands this to its fetcher in start(), which has not run yet.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class ShortWaitConsumer(driver.Consumer):
        def _new_consumer_thread(self) -> Any:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(driver.Transport):
        Consumer = ShortWaitConsumer

    app.transport = Transport(app.conf.broker_consumer, app)


def broker_contact(app: Any, *, within_s: float) -> dict[str, Any]:
    """Whether the worker's Kafka consumer is in touch with a broker, for ``/readyz``.

    In touch: at least one of its connections is open and one answered a request (a
    fetch, a heart-beat) within ``within_s`` (the session timeout: a member that heard
    nothing for that long has left its group anyway). A broker that went away closes the
    connections at once; one that hangs stops answering. Before the consumer has
    started there is no contact (the partitions check fails then too).
    """
    import time

    try:
        client = app.consumer._thread._ensure_consumer()._client
        conns = [c for c in list(client._conns.values()) if c.connected()]
    except Exception:  # ConsumerNotStarted while the worker boots
        return {"ok": False, "connections": 0, "last_response_s": None}
    ages = [time.monotonic() - c._last_action for c in conns]
    last = round(min(ages), 2) if ages else None
    ok = last is not None and last < within_s
    return {"ok": ok, "connections": len(conns), "last_response_s": last}
