"""The dynamic micro-batcher between the consumer and the encoder (no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.stream._batcher import MicroBatcher


class SlowHandler:
    """Records each batch; holds the first one until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, batch: list[int]) -> None:
        self.batches.append(batch)
        self.started.set()
        await self.release.wait()


async def test_records_queued_during_a_batch_form_the_next_batch_at_once() -> None:
    h = SlowHandler()
    b: MicroBatcher[int] = MicroBatcher(h, max_size=8, linger_s=0.0)
    b.start()
    await b.put(0)
    await h.started.wait()  # batch [0] is being handled
    for i in range(1, 6):
        await b.put(i)
    assert b.queued == 5
    h.release.set()
    while sum(map(len, h.batches)) < 6:
        await asyncio.sleep(0)
    await b.close()
    assert h.batches == [[0], [1, 2, 3, 4, 5]]


async def test_batches_never_exceed_max_size_and_keep_arrival_order() -> None:
    h = SlowHandler()
    b: MicroBatcher[int] = MicroBatcher(h, max_size=3, linger_s=0.0, max_queued=10)
    b.start()
    await b.put(0)
    await h.started.wait()
    for i in range(1, 8):
        await b.put(i)
    h.release.set()
    while sum(map(len, h.batches)) < 8:
        await asyncio.sleep(0)
    await b.close()
    assert [x for batch in h.batches for x in batch] == list(range(8))
    assert max(map(len, h.batches)) == 3


async def test_an_idle_batcher_lingers_for_companions_of_a_lone_record() -> None:
    got: list[list[int]] = []
    done = asyncio.Event()

    async def handler(batch: list[int]) -> None:
        got.append(batch)
        done.set()

    b: MicroBatcher[int] = MicroBatcher(handler, max_size=4, linger_s=30.0)
    b.start()
    await b.put(1)
    await b.put(2)
    assert got == []  # lingering: a lone pair waits for more (or for max_size)
    await b.put(3)
    await b.put(4)  # max_size reached: the batch goes without waiting out the linger
    await asyncio.wait_for(done.wait(), 5)
    await b.close()
    assert got == [[1, 2, 3, 4]]


async def test_put_waits_while_the_queue_is_full() -> None:
    h = SlowHandler()
    b: MicroBatcher[int] = MicroBatcher(h, max_size=2, linger_s=0.0, max_queued=2)
    b.start()
    await b.put(0)
    await h.started.wait()
    await b.put(1)
    await b.put(2)
    blocked = asyncio.ensure_future(b.put(3))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # backpressure: the agent stops pulling
    h.release.set()
    await asyncio.wait_for(blocked, 5)
    await b.close()


async def test_a_handler_failure_is_raised_by_the_next_put() -> None:
    async def handler(batch: list[int]) -> None:
        raise RuntimeError("broker gone")

    b: MicroBatcher[int] = MicroBatcher(handler, max_size=4, linger_s=0.0)
    b.start()
    await b.put(1)
    with pytest.raises(RuntimeError, match="broker gone"):
        for _ in range(100):
            await asyncio.sleep(0)
            await b.put(2)


async def test_close_finishes_the_batch_in_progress_and_leaves_the_queue() -> None:
    h = SlowHandler()
    b: MicroBatcher[int] = MicroBatcher(h, max_size=1, linger_s=0.0)
    b.start()
    await b.put(0)
    await h.started.wait()
    await b.put(1)
    closing = asyncio.ensure_future(b.close())
    await asyncio.sleep(0.01)
    assert not closing.done()  # waits for the batch being handled
    h.release.set()
    await asyncio.wait_for(closing, 5)
    assert h.batches == [[0]]  # 1 was never handed over: its offset stays uncommitted
    assert b.queued == 1


def test_freezing_the_startup_heap_takes_it_out_of_later_collections() -> None:
    import gc

    from sidecar.stream._runtime import freeze_startup_heap

    before = gc.get_freeze_count()
    survivor = [[i] for i in range(1000)]  # tracked objects alive at "startup"
    try:
        assert freeze_startup_heap() >= 0.0
        assert gc.get_freeze_count() >= before + len(survivor)
    finally:
        gc.unfreeze()
