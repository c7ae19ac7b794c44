"""go-diskqueue's own test scenarios (diskqueue_test.go), rebuilt for this API.

Where go-diskqueue peeks at private fields, these tests use ``statistics()``
and the bytes on disk instead. Record sizes are written out in comments.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import (
    bad_files,
    meta_name,
    patch_bytes,
    read_meta,
    read_queue,
    seg_name,
    segment_numbers,
)

from aiodiskqueue import DiskQueue, QueueClosed

TEN = bytes([1, 2, 3, 4, 5, 6, 7, 8, 9, 0])  # 10 bytes: a 14-byte record


async def poll(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` is true, checking real state every few milliseconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def test_basic(make_queue: MakeQueue) -> None:
    q = await make_queue(max_bytes_per_file=1024, min_msg_size=4, max_msg_size=1 << 10)
    assert q.qsize() == 0
    await q.put(b"test")
    assert q.qsize() == 1
    assert await q.get() == b"test"
    assert q.qsize() == 0


async def test_roll_at_exactly_140_bytes(make_queue: MakeQueue, tmp_path: Path) -> None:
    # max_bytes_per_file = 10 * (10 + 4): ten records fill file 0 to exactly 140 bytes,
    # the eleventh rolls to file 1.
    q = await make_queue(max_bytes_per_file=10 * 14, min_msg_size=10, max_msg_size=1 << 10)
    for i in range(11):
        await q.put(TEN)
        assert q.qsize() == i + 1
    st = q.statistics()
    assert (st.write_file_num, st.write_pos) == (1, 14)
    assert (tmp_path / seg_name("q", 0)).stat().st_size == 140
    assert (tmp_path / seg_name("q", 1)).stat().st_size == 14
    for i in range(11, 0, -1):
        assert await q.get() == TEN
        assert q.qsize() == i - 1


async def test_purge(make_queue: MakeQueue, tmp_path: Path) -> None:
    # go-diskqueue's Empty(): 10-byte messages, 100-byte files (7 records = 98 bytes each).
    msg = bytes(10)
    q = await make_queue(max_bytes_per_file=100, max_msg_size=1 << 10)
    for i in range(100):
        await q.put(msg)
        assert q.qsize() == i + 1
    for _ in range(3):
        assert await q.get() == msg
    assert q.qsize() == 97
    num_files = q.statistics().write_file_num
    assert num_files == 100 // 7  # files 0..14
    await q.purge()
    for n in range(num_files + 1):
        assert not (tmp_path / seg_name("q", n)).exists()
    st = q.statistics()
    assert st.depth == 0 and q.qsize() == 0
    end = (num_files + 1, 0)
    assert (st.read_file_num, st.read_pos) == (st.write_file_num, st.write_pos) == end
    assert read_meta(tmp_path, "q").encode() == b"0\n15,0\n15,0\n"
    assert st.bytes_on_disk == 0
    for i in range(100):
        await q.put(msg)
        assert q.qsize() == i + 1
    for _ in range(100):
        assert await q.get() == msg
    st = q.statistics()
    assert st.depth == 0
    assert (st.read_file_num, st.read_pos) == (st.write_file_num, st.write_pos)


async def test_purge_drops_pending_and_keeps_later_puts(make_queue: MakeQueue,
                                                         tmp_path: Path) -> None:
    q = await make_queue(max_bytes_per_file=100)
    for i in range(20):
        q.put_nowait(b"old-%02d" % i)
    await q.purge()
    assert q.qsize() == 0
    await q.put(b"new")
    assert await q.get() == b"new"
    await q.sync()
    assert read_queue(tmp_path, "q") == []


def _corruption_msgs(n: int) -> list[bytes]:
    # 120 bytes each (a 124-byte record): 8 records = 992 bytes per 1000-byte file.
    return [(b"%03d" % i) * 40 for i in range(n)]


CORRUPT_OPTS: dict[str, Any] = {"max_bytes_per_file": 1000, "min_msg_size": 10,
                                "max_msg_size": 1 << 10, "sync_every": 5}


async def test_corruption_truncated_completed_file(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    msgs = _corruption_msgs(25)  # files 0, 1, 2 hold 8 each, file 3 holds 1
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        await q.put_many(msgs)
        assert q.qsize() == 25
    assert segment_numbers(tmp_path, "q") == [0, 1, 2, 3]
    # File 1: 400 bytes left = 3 whole records (372 bytes) + 28 bytes of the fourth.
    os.truncate(tmp_path / seg_name("q", 1), 400)
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
            got = [await q.get() for _ in range(8 + 3 + 8 + 1)]
            assert got == msgs[:11] + msgs[16:]
            st = q.statistics()
            assert st.depth == 0 == q.qsize()  # corrected, not left to drift
            assert st.bad_files == 1
            with pytest.raises(asyncio.QueueEmpty):
                q.get_nowait()
    assert bad_files(tmp_path) == [seg_name("q", 1) + ".bad"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(seg_name("q", 1) in w and "372" in w for w in warned), warned
    assert read_queue(tmp_path, "q") == []


async def test_corruption_zero_length_record_with_min_size(tmp_path: Path) -> None:
    msgs = _corruption_msgs(25)
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        await q.put_many(msgs)
    # Record 2 of file 2 starts at byte 248: its length becomes 0, below min_msg_size=10.
    patch_bytes(tmp_path / seg_name("q", 2), 248, b"\0\0\0\0")
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        got = [await q.get() for _ in range(8 + 8 + 2 + 1)]
        assert got == msgs[:18] + msgs[24:]
        assert q.qsize() == 0 and q.statistics().bad_files == 1
    assert bad_files(tmp_path) == [seg_name("q", 2) + ".bad"]


async def test_corruption_in_current_write_file(tmp_path: Path) -> None:
    # go-diskqueue: a corrupt record in the file being written moves the writer on.
    msgs = _corruption_msgs(27)  # file 3 holds msgs 24, 25, 26
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        await q.put_many(msgs)
        assert [await q.get() for _ in range(24)] == msgs[:24]
    patch_bytes(tmp_path / seg_name("q", 3), 124, b"\0\0\0\0")  # msg 25's length field
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        assert q.qsize() == 3
        assert await q.get() == msgs[24]
        extra = b"e" * 120
        await q.put(extra)
        assert await q.get() == extra
        st = q.statistics()
        assert st.bad_files == 1 and st.depth == 0
        assert st.write_file_num == 4  # the writer left the damaged file
    assert bad_files(tmp_path) == [seg_name("q", 3) + ".bad"]


async def test_corruption_truncated_last_file(tmp_path: Path) -> None:
    msgs = _corruption_msgs(2)
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        await q.put_many(msgs)
    os.truncate(tmp_path / seg_name("q", 0), 100)  # not even one whole 124-byte record
    async with DiskQueue(tmp_path, "q", **CORRUPT_OPTS) as q:
        assert q.qsize() == 0
        await q.put(b"n" * 10)
        assert await q.get() == b"n" * 10
    assert read_queue(tmp_path, "q") == []


async def test_sync_after_read_by_timer(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(max_bytes_per_file=1 << 11, max_msg_size=1 << 10, sync_every=2500,
                         sync_interval=0.05)
    meta = tmp_path / meta_name("q")

    def meta_is(expected: bytes) -> bool:
        return meta.exists() and meta.read_bytes() == expected

    msg = bytes(1000)
    await q.put(msg)
    await poll(lambda: meta_is(b"1\n0,0\n0,1004\n"), "meta after the first put")
    await q.put(msg)
    assert await q.get() == msg
    await poll(lambda: meta_is(b"1\n0,1004\n0,2008\n"), "meta after a read")


async def test_torture_many_producers_consumers_close_reopen(tmp_path: Path) -> None:
    msg = b"aaaaaaaaaabbbbbbbbbbccccccccccddddddddddeeeeeeeeeeffffffffff"
    opts: dict[str, Any] = {"max_bytes_per_file": 262144, "max_msg_size": 1 << 10}
    stored: dict[int, list[int]] = {w: [] for w in range(4)}
    enough = asyncio.Event()

    q = await DiskQueue.open(tmp_path, "q", **opts)

    async def producer(w: int) -> None:
        i = 0
        while True:
            try:
                await q.put(msg + b"%d:%d" % (w, i))
            except QueueClosed:
                return
            stored[w].append(i)
            i += 1
            if sum(map(len, stored.values())) >= 6000:
                enough.set()
            await asyncio.sleep(0)

    producers = [asyncio.create_task(producer(w)) for w in range(4)]
    await asyncio.wait_for(enough.wait(), 60)
    await q.aclose()  # while the producers are still putting
    await asyncio.wait_for(asyncio.gather(*producers), 30)
    depth = sum(map(len, stored.values()))

    q = await DiskQueue.open(tmp_path, "q", **opts)
    try:
        assert q.qsize() == depth
        seen: dict[int, list[int]] = {w: [] for w in range(4)}

        async def consumer() -> None:
            while True:
                try:
                    m = await q.get()
                except QueueClosed:
                    return
                assert m.startswith(msg)
                w, i = m[len(msg):].split(b":")
                seen[int(w)].append(int(i))
                if q.qsize() == 0:
                    q.shutdown()
                await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(*(consumer() for _ in range(4))), 60)
        assert q.qsize() == 0
        assert seen == stored  # every producer's messages, in its order, no loss, no dup
    finally:
        await q.aclose()


async def test_resize_between_runs(tmp_path: Path) -> None:
    def msg(i: int) -> bytes:
        return bytes([i]) + bytes(range(1, 10))

    opts: dict[str, Any] = {"min_msg_size": 10, "max_msg_size": 1 << 10}
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=8 * 14, **opts) as q:
        for i in range(9):
            await q.put(msg(i))
        st = q.statistics()
        assert (st.write_file_num, st.write_pos, st.depth) == (1, 14, 9)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=10 * 14, **opts) as q:
        for i in range(10):
            await q.put(msg(20 + i))
        st = q.statistics()
        assert (st.write_file_num, st.write_pos, st.depth) == (2, 14, 19)
        assert [(tmp_path / seg_name("q", n)).stat().st_size for n in range(3)] == [112, 140, 14]
        for i in range(9):
            assert await q.get() == msg(i)
        for i in range(10):
            assert await q.get() == msg(20 + i)
        assert q.qsize() == 0
    assert bad_files(tmp_path) == []


@pytest.mark.parametrize(
    ("size", "burst", "read_buffer"),
    [(20, 1, 4 << 20), (20, 3, 4 << 20), (1000, 10, 4096), (50, 7, 4096)],
    ids=["20B-x1", "20B-x3", "1000B-x10-from-disk", "50B-x7-small-buffer"],
)
async def test_roll_while_reader_keeps_up(make_queue: MakeQueue, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture, size: int,
                                          burst: int, read_buffer: int) -> None:
    # go-diskqueue issue #42: the reader at the writer's position when the writer rolls
    # must move on, never rename the finished file .bad.
    max_bytes = 3 * (size + 4) + 1
    q = await make_queue(max_bytes_per_file=max_bytes, read_buffer_bytes=read_buffer,
                         sync_every=7)
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        n = 0
        for _ in range(150):
            batch = [(b"%08d" % (n + k)) * (size // 8) + b"." * (size % 8)
                     for k in range(burst)]
            n += burst
            for m in batch:
                await q.put(m)
            assert [await q.get() for _ in batch] == batch
    st = q.statistics()
    assert st.write_file_num >= n // 3 - 1  # it really rolled, many times
    assert st.bad_files == 0 and st.depth == 0
    assert bad_files(tmp_path) == []
    assert [r.getMessage() for r in caplog.records] == []
    await q.sync()
    # Consumed files are deleted once the meta has moved past them.
    assert segment_numbers(tmp_path, "q") == [st.write_file_num]
