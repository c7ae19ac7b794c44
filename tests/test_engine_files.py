"""File life cycle claims of the README: deletion only after a durable meta, hand-over."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import parse_meta, read_meta, seg_name, segment_numbers

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


@pytest.fixture
def held_removals(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Removals of consumed segments block until the event is set; their paths, in order,
    and the thread each ran on."""
    import aiodiskqueue._core.remover as remover_mod

    release = threading.Event()
    started: list[str] = []
    real = remover_mod._remove

    def held(path: str, steps: bool) -> None:
        started.append(f"{threading.current_thread().name}:{os.path.basename(path)}")
        assert release.wait(30), "removal never released"
        real(path, steps)

    monkeypatch.setattr(remover_mod, "_remove", held)
    yield release, started
    release.set()


async def test_sync_rounds_do_not_wait_for_the_removal_of_consumed_segments(
    tmp_path: Path, make_queue: MakeQueue, held_removals: tuple[threading.Event, list[str]]
) -> None:
    # Freeing a large segment takes the kernel tens of milliseconds; the periodic sync
    # rounds, and the consumer bounded by them, go on meanwhile.
    release, started = held_removals
    q = await make_queue(tmp_path, max_bytes_per_file=100, sync_every=5, sync_interval=3600)
    await q.put_many([b"%06d" % i for i in range(40)])  # 10 per file: files 0..3

    async def stored_past(file_num: int) -> None:
        for _ in range(500):  # the rounds run on the I/O thread
            if read_meta(tmp_path, "q").read_file >= file_num:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no meta stored past file {file_num - 1}")

    got = [await asyncio.wait_for(q.get(), 10) for _ in range(15)]
    await stored_past(1)
    for _ in range(500):  # queued once the meta is stored
        if started:
            break
        await asyncio.sleep(0.01)
    assert started == ["aiodiskqueue-rm-q:" + seg_name("q", 0)]  # held from here on
    got += [await asyncio.wait_for(q.get(), 10) for _ in range(20)]
    assert got == [b"%06d" % i for i in range(35)]
    await stored_past(3)  # later rounds stored the meta while the removal was held
    assert started == ["aiodiskqueue-rm-q:" + seg_name("q", 0)]
    assert (tmp_path / seg_name("q", 0)).exists()
    release.set()
    await q.sync()  # an explicit sync returns with the consumed segments gone
    assert segment_numbers(tmp_path, "q") == [3]
    assert q.statistics().bytes_on_disk == 100  # counted as the remover freed them
    assert [s.split(":")[1] for s in started] == [seg_name("q", n) for n in range(3)]


async def test_close_and_purge_wait_for_the_removals(
    tmp_path: Path, make_queue: MakeQueue, held_removals: tuple[threading.Event, list[str]]
) -> None:
    release, started = held_removals
    q = await make_queue(tmp_path, max_bytes_per_file=100, sync_every=5, sync_interval=3600)
    await q.put_many([b"%06d" % i for i in range(30)])
    for _ in range(15):
        await q.get()
    for _ in range(200):
        if started:
            break
        await asyncio.sleep(0.01)
    assert started
    purge = asyncio.ensure_future(q.purge())
    await asyncio.sleep(0.2)
    assert not purge.done()  # held by the removal of file 0
    release.set()
    await asyncio.wait_for(purge, 10)
    assert segment_numbers(tmp_path, "q") == []
    await q.put_many([b"%06d" % i for i in range(30)])
    for _ in range(15):
        await q.get()
    await q.aclose()
    meta = read_meta(tmp_path, "q")
    assert meta.read_file == meta.write_file - 1  # the purge began a new file; one consumed
    assert segment_numbers(tmp_path, "q") == [meta.read_file, meta.write_file]
    assert not [t for t in threading.enumerate() if t.name.startswith("aiodiskqueue-rm-q")]


async def test_a_removal_that_fails_leaves_a_leftover_the_next_open_removes(
    tmp_path: Path, make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:

    def refuse(path: str) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "remove", refuse)  # the call the remover thread makes
    q = await make_queue(tmp_path, max_bytes_per_file=100, sync_every=5, sync_interval=3600)
    await q.put_many([b"%06d" % i for i in range(30)])
    with caplog.at_level(logging.WARNING, logger="aiodiskqueue"):
        assert [await q.get() for _ in range(15)] == [b"%06d" % i for i in range(15)]
        await q.sync()
    assert "could not remove the consumed segment" in caplog.text
    assert segment_numbers(tmp_path, "q") == [0, 1, 2]  # nothing lost, nothing broken
    await q.put(b"after")
    await q.aclose()
    monkeypatch.undo()
    q = await make_queue(tmp_path)
    assert segment_numbers(tmp_path, "q") == [1, 2, 3]  # the leftover (file 0) is gone
    assert [await q.get() for _ in range(16)] == [b"%06d" % i for i in range(15, 30)] + [b"after"]


@pytest.mark.parametrize("pure", [False, True])
async def test_sync_rounds_store_the_meta_in_one_native_call(
    tmp_path: Path, make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    # Each system call of a Python thread takes the GIL back afterwards, which a busy
    # consumer holds for up to the switch interval: the common case is one native call.
    if store_mod._swap_file is None:
        pytest.skip("the native module is not built here")
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1" if pure else "0")
    results: list[int] = []
    real = store_mod._swap_file

    def spy(directory: bytes, spare: bytes, name: bytes, data: bytes) -> int:
        results.append(real(directory, spare, name, data))
        return results[-1]

    monkeypatch.setattr(store_mod, "_swap_file", spy)
    q = await make_queue(tmp_path)
    await q.put_many([b"a", b"b", b"c"])
    await q.sync()
    assert await q.get() == b"a"
    await q.sync()
    meta = read_meta(tmp_path, "q")
    assert (meta.depth, meta.read_pos) == (2, 5)
    # The first store makes the spare (the portable steps), the next one swaps natively.
    assert results == ([] if pure else [errno.ENOENT, 0])


async def _meta_reaches(tmp_path: Path, pos: tuple[int, int]) -> None:
    for _ in range(500):  # the rounds run beside the consumer
        meta = read_meta(tmp_path, "q")
        if (meta.read_file, meta.read_pos) >= pos:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the meta never reached {pos}: {read_meta(tmp_path, 'q')}")


async def test_a_consumers_sync_rounds_store_the_meta_on_a_native_thread(
    tmp_path: Path, make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A consumer taking ready messages holds the GIL; a round on the Python I/O thread
    # waited for it after every system call, and the consumer for the round.
    if store_mod._swap_file is None:
        pytest.skip("the native module is not built here")
    import aiodiskqueue._core.lane as lane_mod

    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "0")  # whatever the suite runs with
    swaps: list[bytes] = []
    real = lane_mod.WriteLane.submit_swap

    def spy(lane: lane_mod.WriteLane, args: tuple[bytes, bytes, bytes, bytes]) -> Any:
        swaps.append(args[3])
        return real(lane, args)

    monkeypatch.setattr(lane_mod.WriteLane, "submit_swap", spy)
    redone: list[int] = []
    from aiodiskqueue._core.schedule import Scheduler

    real_result = Scheduler.meta_result

    def result(s: Scheduler, flight: Any) -> Any:
        res = real_result(s, flight)
        if res is None:
            redone.append(flight.fut.result()[2])
        return res

    monkeypatch.setattr(Scheduler, "meta_result", result)
    q = await make_queue(tmp_path, sync_every=10, sync_interval=3600)
    await q.put_many([b"%06d" % i for i in range(200)])
    await q.sync()  # the first store makes the spare
    assert await q.get() == b"000000"
    await q.sync()  # the next one swaps natively
    assert swaps == []  # an explicit sync goes to the I/O thread (it waits for removals)
    for i in range(1, 100):
        assert await q.get() == b"%06d" % i
        if i % 20 == 0:
            await _meta_reaches(tmp_path, (0, 10 * i))  # a round per 10 gets
    await _meta_reaches(tmp_path, (0, 900))
    assert len(swaps) >= 4
    metas = [parse_meta(m) for m in swaps]
    assert [(m.read_file, m.write_pos) for m in metas] == [(0, 2000)] * len(metas)
    assert [m.read_pos for m in metas] == sorted(m.read_pos for m in metas)
    assert all(m.depth == 200 - m.read_pos // 10 for m in metas)
    # A store that fails there (the spare is gone) is redone by the portable steps.
    os.remove(tmp_path / "q.diskqueue.meta.dat.0.tmp")
    before = len(swaps)
    for i in range(100, 180):
        assert await q.get() == b"%06d" % i
        if i % 20 == 0:
            await _meta_reaches(tmp_path, (0, 10 * i))
    await _meta_reaches(tmp_path, (0, 1700))
    assert redone == [errno.ENOENT]
    assert (tmp_path / "q.diskqueue.meta.dat.0.tmp").exists()  # made again
    # The I/O thread's next store swapped natively again, and the lane took over.
    assert parse_meta(swaps[-1]).read_pos >= 1600 and len(swaps) >= before + 2
    await q.aclose()
    q = await make_queue(tmp_path)
    assert [await q.get() for _ in range(20)] == [b"%06d" % i for i in range(180, 200)]


def test_a_removal_where_no_thread_can_start_is_done_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No thread left, or the interpreter shutting down (a worker thread still using the
    # queue): the removal must not raise, or the sync round after a stored meta would fail.
    import aiodiskqueue._core.remover as remover_mod

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    path = tmp_path / "consumed"
    path.write_bytes(b"x")
    r = remover_mod.SegmentRemover("q")
    r.remove(str(path))
    assert not path.exists()
    r.close()


async def test_bytes_on_disk_follow_removals_of_an_idle_queue(
    tmp_path: Path, make_queue: MakeQueue
) -> None:
    q = await make_queue(tmp_path, max_bytes_per_file=1000, sync_every=50, sync_interval=0.05)
    await q.put_many([b"x" * 96] * 100)  # 10 segments of 1,000 bytes
    for _ in range(100):
        await q.get()
    await _meta_reaches(tmp_path, (9, 1000))  # by the periodic rounds; then nothing runs
    for _ in range(300):
        if segment_numbers(tmp_path, "q") == [9]:  # the write segment alone is left
            break
        await asyncio.sleep(0.01)
    assert segment_numbers(tmp_path, "q") == [9]
    assert q.statistics().bytes_on_disk == (tmp_path / seg_name("q", 9)).stat().st_size == 1000


async def test_a_native_swap_that_cannot_work_here_is_not_tried_again(
    tmp_path: Path, make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store_mod._swap_file is None:
        pytest.skip("the native module is not built here")
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "0")
    calls: list[bytes] = []

    def no_exchange(directory: bytes, spare: bytes, name: bytes, data: bytes) -> int:
        calls.append(data)
        return errno.EINVAL  # a filesystem without RENAME_EXCHANGE

    monkeypatch.setattr(store_mod, "_swap_file", no_exchange)
    q = await make_queue(tmp_path)
    await q.put_many([b"%06d" % i for i in range(20)])
    for i in range(5):
        assert await q.get() == b"%06d" % i
        await q.sync()
        assert read_meta(tmp_path, "q").read_pos == 10 * (i + 1)  # the portable steps
    assert len(calls) == 1
