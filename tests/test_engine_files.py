"""File life cycle claims of the README: deletion only after a durable meta, hand-over."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from conftest import MakeQueue
from helpers_format import read_meta, seg_name, segment_numbers

import aiodiskqueue._core.store as store_mod
from aiodiskqueue import DiskQueueError


async def test_read_segment_is_deleted_only_after_the_meta_moved_past_it(
    tmp_path: Path, make_queue: MakeQueue
) -> None:
    q = await make_queue(tmp_path, max_bytes_per_file=100, sync_every=10_000,
                         sync_interval=3600)
    await q.put_many([b"%06d" % i for i in range(30)])  # 10-byte records: 10 per file
    await q.sync()
    assert segment_numbers(tmp_path, "q") == [0, 1, 2]
    for _ in range(15):
        await q.get()
    # File 0 is read through, but the meta on disk still points into it.
    assert read_meta(tmp_path, "q").read_file == 0
    assert (tmp_path / seg_name("q", 0)).exists()
    await q.sync()
    meta = read_meta(tmp_path, "q")
    assert (meta.read_file, meta.read_pos) == (1, 50)
    assert segment_numbers(tmp_path, "q") == [1, 2]
    assert q.statistics().bytes_on_disk == 200


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Where every read-ahead from disk started, in order."""
    starts: list[tuple[int, int]] = []
    original = store_mod.SegmentStore.read

    def counting_read(self: store_mod.SegmentStore, at: tuple[int, int], budget: int,
                      res: store_mod.JobResult) -> None:
        starts.append(at)
        original(self, at, budget, res)

    monkeypatch.setattr(store_mod.SegmentStore, "read", counting_read)
    return starts


async def test_a_reader_that_caught_up_gets_new_records_without_reading_them_back(
    make_queue: MakeQueue, reads: list[tuple[int, int]]
) -> None:
    q = await make_queue()
    for i in range(200):
        await q.put(b"%03d" % i)
        assert await q.get() == b"%03d" % i
    assert reads == []


async def test_a_reader_that_fell_behind_reads_from_disk(
    make_queue: MakeQueue, reads: list[tuple[int, int]]
) -> None:
    q = await make_queue(read_buffer_bytes=4096)
    await q.put_many([b"x" * 100 for _ in range(200)])  # 20 KB: more than the buffer
    got = [await q.get() for _ in range(200)]
    assert got == [b"x" * 100] * 200
    assert reads  # the rest came from disk, in read-ahead chunks
    assert len(reads) < 200


@pytest.mark.usefixtures("pure_python")
async def test_a_failed_put_nowait_batch_is_raised_by_the_next_sync(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    failing = {"on": False}

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if failing["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr("aiodiskqueue._core.store.os.pwrite", pwrite)
    q = await make_queue()
    q.put_nowait(b"kept")
    await q.sync()
    failing["on"] = True
    q.put_nowait(b"lost")  # accepted now; its write fails in the next hop
    assert q.qsize() == 2
    with pytest.raises(DiskQueueError) as info:
        await q.sync()
    assert isinstance(info.value.__cause__, OSError)
    assert q.qsize() == 1  # the failed message is no longer counted
    failing["on"] = False
    await q.sync()  # reported once
    assert await q.get() == b"kept"
