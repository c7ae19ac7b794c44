"""The depth floor: never a depth below what is known to be unread, and never above it
once every record was taken. Found by the power cuts (tests/test_powercut.py): a
reader crossing from a completed segment into an empty last one."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta


def records(n: int) -> bytes:
    """``n`` records of 9 bytes: ``m0000``, ``m0001``, ..."""
    return b"".join(struct.pack(">I", 5) + b"m%04d" % i for i in range(n))


@pytest.mark.parametrize("last", [b"", bytes(4096)], ids=["created-by-a-roll", "zeros-cut"])
async def test_depth_after_draining_into_an_empty_last_segment(tmp_path: Path,
                                                               last: bytes) -> None:
    # Segment 0: 2,000 records past the meta (18,000 bytes); segment 1 is empty, or a
    # zero-filled tail that recovery cuts to 0 bytes. The reader ends at (0, 18000) with
    # the write position at (1, 0): nothing lies between them.
    lay = Layout(str(tmp_path), "q")
    Path(lay.segment_path(0)).write_bytes(records(2000))
    Path(lay.segment_path(1)).write_bytes(last)
    Path(lay.meta_path).write_bytes(Meta(0, 0, 0, 0, 0).encode())
    async with DiskQueue(tmp_path, "q", read_buffer_bytes=4096) as q:
        assert q.qsize() == 2000
        got = [await q.get() for _ in range(2000)]
        assert got[-1] == b"m1999"
        assert q.qsize() == 0, repr(q)
        await q.put(b"next")
        assert await asyncio.wait_for(q.get(), 5) == b"next"
    assert Path(lay.segment_path(1)).read_bytes() == struct.pack(">I", 4) + b"next"


@pytest.mark.parametrize("roll", [False, True], ids=["meta-in-segment", "meta-after-roll"])
async def test_drain_ends_where_synced_bytes_came_back_as_zeros(tmp_path: Path,
                                                                roll: bool) -> None:
    # A disk that acknowledged an fsync without writing: bytes 4096..8192 of a segment
    # the meta covers are zeros. Whatever is read of them, a full drain ends with
    # qsize() 0 and a get() that does not hang once a new message is put.
    lay = Layout(str(tmp_path), "q")
    data = bytearray(records(1000))
    data[4096:8192] = bytes(4096)
    Path(lay.segment_path(0)).write_bytes(data)
    if roll:
        Path(lay.segment_path(1)).write_bytes(b"")
    meta = Meta(1000, 0, 0, 1, 0) if roll else Meta(1000, 0, 0, 0, len(data))
    Path(lay.meta_path).write_bytes(meta.encode())
    async with DiskQueue(tmp_path, "q", read_buffer_bytes=4096) as q:
        while q.qsize():
            try:
                await asyncio.wait_for(q.get(), 2)
            except TimeoutError:
                # A get() that began while the depth still counted the damaged bytes waits,
                # as any get() on an empty queue does, once they are quarantined: right only
                # if the depth now says nothing is left.
                assert q.qsize() == 0, repr(q)
                break
        await q.put(b"next")
        assert await asyncio.wait_for(q.get(), 5) == b"next"
        assert q.qsize() == 0, repr(q)
