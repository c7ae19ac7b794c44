"""AckQueue with ``strict=True``: damage in the data queue raises as DiskQueue raises it.

The data queue's errors other than "nothing ready yet" reach the consumer: a damaged
record ends delivery with CorruptionError instead of a ``get()`` that waits forever.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers_format import seg_name

from aiodiskqueue import AckQueue, CorruptionError, DiskQueue, QueueEmpty

BODIES = [b"m%04d" % i for i in range(5)]  # 5 bytes each: 9-byte records
THIRD = 2 * 9  # offset of the third record's length in the segment


async def _write_damaged(tmp_path: Path) -> Path:
    """Five messages through an AckQueue, then the third record's length set to 2**31-1."""
    async with AckQueue(tmp_path, "jobs") as q:
        await q.put_many(BODIES)
    seg = tmp_path / seg_name("jobs", 0)
    data = bytearray(seg.read_bytes())
    assert data[THIRD:THIRD + 4] == (5).to_bytes(4, "big")
    data[THIRD:THIRD + 4] = (0x7FFFFFFF).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
    return seg


async def test_disk_queue_strict_raises_after_the_intact_records(tmp_path: Path) -> None:
    """The reference behaviour the AckQueue must match."""
    seg = await _write_damaged(tmp_path)
    async with DiskQueue(tmp_path, "jobs", strict=True) as q:
        got = [await asyncio.wait_for(q.get(), 10) for _ in range(2)]
        assert got == BODIES[:2]
        with pytest.raises(CorruptionError) as info:
            await asyncio.wait_for(q.get(), 10)
        assert info.value.path == str(seg)


@pytest.mark.parametrize("how", ["get", "get_nowait", "get_many", "get_many_nowait"])
async def test_ack_queue_strict_raises_corruption_instead_of_waiting(
    tmp_path: Path, how: str
) -> None:
    seg = await _write_damaged(tmp_path)
    async with AckQueue(tmp_path, "jobs", strict=True) as q:
        for body in BODIES[:2]:
            m = await asyncio.wait_for(q.get(), 10)
            assert m.body == body
            await m.finish()
        with pytest.raises(CorruptionError) as info:
            await asyncio.wait_for(_take(q, how), 10)
        assert info.value.path == str(seg)
        # The queue stays usable: puts go on, as on a strict DiskQueue.
        await q.put(b"still")


async def test_ack_queue_strict_get_many_returns_the_intact_then_raises(
    tmp_path: Path,
) -> None:
    await _write_damaged(tmp_path)
    async with AckQueue(tmp_path, "jobs", strict=True) as q:
        got: list[bytes] = []
        with pytest.raises(CorruptionError):
            await _take_all(q, got)
        assert got == BODIES[:2]


async def _take(q: AckQueue, how: str) -> None:
    """Take once in the way ``how``; the nowait forms are called again while they report
    "nothing ready yet" (the read-ahead may not have reached the damage)."""
    if how == "get":
        await q.get()
        return
    if how == "get_many":
        await q.get_many(5)
        return
    while True:
        try:
            if how == "get_nowait":
                q.get_nowait()
            else:
                q.get_many_nowait(5)
        except QueueEmpty:
            await asyncio.sleep(0.001)


async def _take_all(q: AckQueue, got: list[bytes]) -> None:
    """``get_many`` and finish until it raises."""
    while True:
        for m in await asyncio.wait_for(q.get_many(5), 10):
            got.append(m.body)
            await m.finish()


async def test_a_getter_waiting_when_strict_reading_stops_raises(tmp_path: Path) -> None:
    # The read-ahead holds at most 4 KiB: the damage is found by a later read, while the
    # consumer may already wait for the next message (the pump waits on the data queue
    # for it): the waiting get() raises then.
    bodies = [b"m%04d" % i for i in range(2000)]  # 9-byte records
    async with AckQueue(tmp_path, "jobs") as q:
        await q.put_many(bodies)
    seg = tmp_path / seg_name("jobs", 0)
    data = bytearray(seg.read_bytes())
    bad = 1500 * 9
    data[bad:bad + 4] = (0x7FFFFFFF).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
    got: list[bytes] = []
    async with AckQueue(tmp_path, "jobs", strict=True, read_buffer_bytes=4096,
                        max_in_flight=10_000) as q:
        with pytest.raises(CorruptionError) as info:
            await asyncio.wait_for(_take_and_finish(q, got), 10)
        assert info.value.offset == bad
    assert got == bodies[:1500]


async def _take_and_finish(q: AckQueue, got: list[bytes]) -> None:
    while True:
        m = await q.get()
        got.append(m.body)
        await m.finish()


async def test_a_getter_waiting_for_the_read_ahead_is_woken_by_the_damage(
    tmp_path: Path,
) -> None:
    # The first take after the intact records finds nothing read ahead yet (as if the
    # read had not reached the damage): the get() waits while the pump waits on the data
    # queue for it, and that wait ends with the damage, which the getter then raises
    # (no commit wakes it meanwhile: sync_interval is far).
    seg = await _write_damaged(tmp_path)
    async with AckQueue(tmp_path, "jobs", strict=True, sync_interval=3600.0) as q:
        for _ in BODIES[:2]:
            await (await asyncio.wait_for(q.get(), 10)).finish()
        real = q._data.get_nowait
        calls = 0

        def not_read_ahead_yet() -> bytes:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise QueueEmpty()
            return real()

        q._data.get_nowait = not_read_ahead_yet  # type: ignore[method-assign]
        with pytest.raises(CorruptionError) as info:
            await asyncio.wait_for(q.get(), 10)
        assert info.value.path == str(seg)
        assert calls == 2  # woken once, then raised
