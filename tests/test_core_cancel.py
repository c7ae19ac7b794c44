"""Cancellation of get() and put(), shutdown(), and closing with callers blocked."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from conftest import MakeQueue
from helpers_format import read_queue

from aiodiskqueue import DiskQueue, QueueClosed


async def spin(n: int) -> None:
    """Let the event loop run ``n`` iterations (to place a cancellation at many points)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_cancelled_get_on_empty_queue(make_queue: MakeQueue) -> None:
    q = await make_queue()
    getter = asyncio.create_task(q.get())
    await spin(5)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    await q.put(b"kept")
    assert q.qsize() == 1
    assert await q.get() == b"kept"


@pytest.mark.parametrize("delay", range(12), ids=lambda d: f"cancel-after-{d}")
async def test_cancelled_get_racing_a_put_loses_nothing(make_queue: MakeQueue,
                                                        delay: int) -> None:
    q = await make_queue()
    getter = asyncio.create_task(q.get())
    await spin(2)
    q.put_nowait(b"m")
    await spin(delay)
    getter.cancel()
    try:
        got = [await getter]
    except asyncio.CancelledError:
        got = []
    # Either the getter took it before the cancel, or it is still in the queue.
    assert q.qsize() == 1 - len(got)
    got += [await q.get() for _ in range(q.qsize())]
    assert got == [b"m"]


async def test_many_getters_some_cancelled(make_queue: MakeQueue) -> None:
    rng = random.Random(3)
    q = await make_queue()
    n = 200
    getters = [asyncio.create_task(q.get()) for _ in range(2 * n)]
    await spin(3)
    for i in range(n):
        q.put_nowait(b"%04d" % i)
        if rng.random() < 0.3:
            await spin(rng.randrange(3))
        victim = getters[rng.randrange(len(getters))]
        victim.cancel()
    await q.sync()
    await spin(20)
    taken: list[bytes] = []
    for t in getters:
        if t.done() and not t.cancelled():
            taken.append(t.result())
        else:
            t.cancel()
    await asyncio.gather(*getters, return_exceptions=True)
    for t in getters:  # a getter finishing after the last check still counts
        if not t.cancelled() and t.result() not in taken:
            taken.append(t.result())
    rest = [await q.get() for _ in range(q.qsize())]
    assert sorted(taken + rest) == [b"%04d" % i for i in range(n)]
    assert rest == sorted(rest)  # the queue kept its order


@pytest.mark.parametrize("delay", range(8), ids=lambda d: f"cancel-after-{d}")
async def test_cancelled_put_leaves_queue_consistent(tmp_path: Path, delay: int) -> None:
    async with DiskQueue(tmp_path, "q", sync_every=1) as q:
        await q.put(b"before")
        putter = asyncio.create_task(q.put(b"maybe"))
        await spin(delay)
        putter.cancel()
        try:
            await putter
            landed = True
        except asyncio.CancelledError:
            landed = q.qsize() == 2  # documented: a cancelled put may have landed
        assert q.qsize() == 1 + landed
        await q.put(b"after")
        expected = [b"before"] + [b"maybe"] * landed + [b"after"]
        await q.sync()
        assert read_queue(tmp_path, "q") == expected
        assert [await q.get() for _ in range(q.qsize())] == expected


async def test_cancelled_put_blocked_by_maxsize(make_queue: MakeQueue) -> None:
    q = await make_queue(maxsize=1)
    await q.put(b"a")
    blocked = asyncio.create_task(q.put(b"never"))
    waiting = asyncio.create_task(q.put(b"b"))
    await spin(5)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert q.qsize() == 1
    assert await q.get() == b"a"
    # The room freed goes to the other blocked put: the cancelled one did not swallow it.
    await asyncio.wait_for(waiting, 10)
    assert await q.get() == b"b"
    assert q.qsize() == 0


async def test_shutdown_wakes_blocked_getters(make_queue: MakeQueue) -> None:
    q = await make_queue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await spin(5)
    q.shutdown()
    for t in getters:
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(t, 10)
    with pytest.raises(QueueClosed):
        await q.put(b"late")
    with pytest.raises(QueueClosed):
        q.put_nowait(b"late")


async def test_shutdown_drains_then_closes_and_keeps_files(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q") as q:
        await q.put_many([b"1", b"2", b"3"])
        q.shutdown()
        assert await q.get() == b"1"
        got = [m async for m in q]  # ends when drained
        assert got == [b"2", b"3"]
        with pytest.raises(QueueClosed):
            await q.get()
    async with DiskQueue(tmp_path, "q") as q:
        assert q.qsize() == 0


async def test_shutdown_immediate(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q") as q:
        await q.put_many([b"1", b"2"])
        assert await q.get() == b"1"
        q.shutdown(immediate=True)
        with pytest.raises(QueueClosed):
            await q.get()
        with pytest.raises(QueueClosed):
            q.get_nowait()
        assert [m async for m in q] == []
    # Nothing stored is deleted: the message is there for the next open.
    async with DiskQueue(tmp_path, "q") as q:
        assert await q.get() == b"2"


async def test_shutdown_immediate_wakes_blocked_getter(make_queue: MakeQueue) -> None:
    q = await make_queue()
    getter = asyncio.create_task(q.get())
    await spin(5)
    q.shutdown(immediate=True)
    with pytest.raises(QueueClosed):
        await asyncio.wait_for(getter, 10)


async def test_aclose_idempotent_and_concurrent(tmp_path: Path) -> None:
    q = await DiskQueue.open(tmp_path, "q")
    await q.put(b"x")
    await asyncio.gather(q.aclose(), q.aclose())
    await q.aclose()
    assert "state=closed" in repr(q)
    assert read_queue(tmp_path, "q") == [b"x"]


async def test_aclose_wakes_getters_and_ends_async_for(make_queue: MakeQueue) -> None:
    q = await make_queue()
    got: list[bytes] = []

    async def iterate() -> None:
        async for m in q:
            got.append(m)

    it = asyncio.create_task(iterate())
    getter = asyncio.create_task(q.get())
    await q.put(b"one")
    await spin(10)
    await q.aclose()
    await asyncio.wait_for(it, 10)  # ended, no exception
    with pytest.raises(QueueClosed):
        await asyncio.wait_for(getter, 10)
    assert got == [b"one"]


async def test_aclose_with_puts_in_flight(tmp_path: Path) -> None:
    q = await DiskQueue.open(tmp_path, "q")
    putters = [asyncio.create_task(q.put(b"%03d" % i)) for i in range(100)]
    await spin(1)
    await q.aclose()
    results = await asyncio.gather(*putters, return_exceptions=True)
    stored = [b"%03d" % i for i, r in enumerate(results) if r is None]
    assert all(r is None or isinstance(r, QueueClosed) for r in results)
    assert read_queue(tmp_path, "q") == stored  # exactly the puts that returned


async def test_cancelled_aclose_still_syncs(tmp_path: Path) -> None:
    q = await DiskQueue.open(tmp_path, "q", sync_every=10**6, sync_interval=3600.0)
    for i in range(50):
        q.put_nowait(b"%d" % i)
    closer = asyncio.create_task(q.aclose())
    await spin(1)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    await q.aclose()  # waits for the shielded close to finish
    assert read_queue(tmp_path, "q") == [b"%d" % i for i in range(50)]


async def test_sync_and_purge_still_work_after_shutdown(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", sync_every=10**6, sync_interval=3600.0) as q:
        await q.put_many([b"a", b"b"])
        q.shutdown()
        await q.sync()  # allowed: stores what was accepted before the shutdown
        assert read_queue(tmp_path, "q") == [b"a", b"b"]
        assert await q.get() == b"a"
        await q.purge()
        assert q.qsize() == 0
        with pytest.raises(QueueClosed):
            await q.get()
    assert read_queue(tmp_path, "q") == []
