"""What wakes a role's ioLoop: requests, the periodic sync timer, the other role's changes;
and what a producer learns of the consumer's stored position, batch after batch."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers_format import read_meta
from test_roles import _get, _pair

from aiodiskqueue import DiskQueue
from aiodiskqueue._core import notify


async def test_a_producer_counts_from_each_stored_position_of_the_consumer(
        tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, sync_every=1000, sync_interval=60)
    try:
        await p.put_many([b"%d" % i for i in range(20)])
        put, taken, stored = 20, 0, 0
        assert p.qsize() == put
        for _ in range(3):
            for _ in range(5):
                await _get(c)
            taken += 5
            await p.put(b"x")  # the consumer stored nothing since: counted as before
            put += 1
            assert p.qsize() == put - stored
            await c.sync()  # stores its read position
            stored = taken
            for _ in range(2):  # the batch after the store sees it, and the next one
                await p.put(b"y")
                put += 1
                assert p.qsize() == put - stored
            await p.sync()  # the producer's own store rewrites the roles file
            await p.put(b"z")
            put += 1
            assert p.qsize() == put - stored
        assert p.statistics().read_pos == c.statistics().read_pos
    finally:
        await c.aclose()
        await p.aclose()


async def test_the_consumers_timed_store_reaches_the_producer(tmp_path: Path) -> None:
    # No sync(), and fewer gets than sync_every: only the periodic timer stores the
    # consumer's position, with nothing else waking its ioLoop.
    p, c = await _pair(tmp_path, sync_every=1000, sync_interval=0.1)
    loop = asyncio.get_running_loop()
    try:
        await p.put_many([b"%d" % i for i in range(10)])
        assert [await _get(c) for _ in range(3)] == [b"0", b"1", b"2"]
        deadline = loop.time() + 10
        puts = 0
        while True:
            await p.put(b"x")  # each batch reads the consumer's stored position
            puts += 1
            if p.qsize() == 10 + puts - 3:
                break
            assert p.qsize() == 10 + puts, "a position not stored was counted"
            assert loop.time() < deadline, "the consumer's timed store never came"
            await asyncio.sleep(0.02)
    finally:
        await c.aclose()
        await p.aclose()


async def test_a_producer_alone_stores_its_meta_by_the_timer(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    async with DiskQueue(tmp_path, "q", "producer", sync_every=1000, sync_interval=0.1) as p:
        for round_ in range(1, 4):  # the timer is armed again after each store
            await p.put_many([b"m"] * 5)
            deadline = loop.time() + 10
            while read_meta(tmp_path, "q").depth != 5 * round_:
                assert loop.time() < deadline, "the producer's timed store never came"
                await asyncio.sleep(0.02)


async def test_a_maxsize_putter_wakes_when_the_consumer_stores(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, maxsize=2, sync_every=1000, sync_interval=60)
    try:
        await p.put(b"a")
        await p.put(b"b")
        blocked = asyncio.ensure_future(p.put(b"c"))
        assert await _get(c) == b"a"
        await asyncio.sleep(0.05)
        assert not blocked.done()  # the consumer has not stored its position
        await c.sync()
        await asyncio.wait_for(blocked, 10)
        assert [await _get(c) for _ in range(2)] == [b"b", b"c"]
    finally:
        await c.aclose()
        await p.aclose()


async def test_a_watch_looks_again_without_a_change(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "_WATCHED_CHECK", 0.05)
    path = tmp_path / "f"
    path.write_bytes(b"")
    watch = notify.FileWatch(asyncio.get_running_loop(), str(path))
    try:
        if not watch.inotify:
            pytest.skip("no inotify here: the polling watch has its own test")
        for _ in range(3):  # one look shared by the waits until it ends, then armed again
            await asyncio.wait_for(watch.wait(), 10)
        w = watch.wait()
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"x" * 100)
        finally:
            os.close(fd)
        await asyncio.wait_for(w, 10)
    finally:
        watch.close()


async def test_a_watch_drains_its_events_on_each_wake(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "_WATCHED_CHECK", 3600.0)
    a, b = tmp_path / "a", tmp_path / "b"
    watch = notify.FileWatch(asyncio.get_running_loop(), str(tmp_path),
                             mask=notify.DIR_CHANGES)
    try:
        if not watch.inotify:
            pytest.skip("no inotify here")
        w = watch.wait()
        for i in range(200):  # events with names: distinct, not merged
            (a if i % 2 else b).with_name(f"f{i}").write_bytes(b"")
        await asyncio.wait_for(w, 10)
        await asyncio.sleep(0.05)  # every event read: none left to wake the next wait
        w = watch.wait()
        await asyncio.sleep(0.05)
        assert not w.done()
    finally:
        watch.close()
