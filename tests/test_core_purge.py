"""purge() (go-diskqueue's Empty()) with readers, writers and reopen around it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import MakeQueue
from helpers_format import read_meta, read_queue, segment_numbers

from aiodiskqueue import DiskQueue


async def test_purge_with_a_blocked_getter(make_queue: MakeQueue) -> None:
    q = await make_queue(max_bytes_per_file=64)
    await q.put_many([b"old-%d" % i for i in range(20)])
    assert await q.get() == b"old-0"
    await q.purge()
    getter = asyncio.create_task(q.get())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not getter.done()  # nothing left to get
    await q.put(b"new")
    assert await asyncio.wait_for(getter, 10) == b"new"
    assert q.qsize() == 0


async def test_purge_drops_read_ahead_messages(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(max_bytes_per_file=64)
    await q.put_many([b"m%02d" % i for i in range(30)])
    assert await q.get() == b"m00"
    assert q.statistics().ready > 0  # the rest was read ahead into memory
    await q.purge()
    assert q.qsize() == 0 and q.statistics().ready == 0
    await q.put(b"after")
    assert await q.get() == b"after"
    await q.sync()
    assert read_queue(tmp_path, "q") == []


async def test_purge_concurrent_with_puts(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(max_bytes_per_file=100)
    before = [asyncio.create_task(q.put(b"b%03d" % i)) for i in range(50)]
    await asyncio.sleep(0)
    purge = asyncio.create_task(q.purge())
    await asyncio.gather(*before)  # accepted before the purge: they return normally
    await purge
    after = [b"a%03d" % i for i in range(10)]
    for m in after:
        await q.put(m)
    assert [await q.get() for _ in range(q.qsize())] == after
    await q.sync()
    assert read_queue(tmp_path, "q") == []


async def test_purge_survives_reopen(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        await q.put_many([b"x" * 20] * 10)  # 24-byte records: 2 per file, files 0..4
        write_file = q.statistics().write_file_num
        await q.purge()
        assert segment_numbers(tmp_path, "q") == []
    m = read_meta(tmp_path, "q")
    assert (m.depth, m.read_file, m.read_pos, m.write_file, m.write_pos) == \
        (0, write_file + 1, 0, write_file + 1, 0)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        assert q.qsize() == 0
        await q.put(b"next")
        assert q.statistics().write_file_num == write_file + 1
    assert segment_numbers(tmp_path, "q") == [write_file + 1]
    assert read_queue(tmp_path, "q") == [b"next"]
