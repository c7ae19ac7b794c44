"""A consumer role that keeps up with its producer reads what was just published on the
event loop, at the watch's call (``ConsumerEngine._look``): what that read must still get
right (a torn or damaged record inside the published span, a segment roll, a missing
segment, a span too large for the loop, a failing read), and that it is the path taken."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from helpers_format import patch_bytes, seg_name
from test_roles import _get, _pair

from aiodiskqueue import CorruptionError, DiskQueue, DiskQueueError
from aiodiskqueue._core import lane, notify
from aiodiskqueue._core.consumer import INLINE_READ_MAX, ConsumerEngine
from aiodiskqueue._core.iothread import Hop
from aiodiskqueue._format.roles import read_record_at

NATIVE = lane.available()


def _engine(q: DiskQueue) -> ConsumerEngine:
    return cast(ConsumerEngine, q._e)


def _count_reads(q: DiskQueue) -> list[str]:
    """The names of the reads the consumer sends to its I/O thread from now on."""
    e = _engine(q)
    io = e.io
    assert io is not None
    real = io.run
    calls: list[str] = []

    def run(fn: Callable[..., Any], *args: Any) -> Hop[Any]:
        if fn.__name__ in ("_read", "_step"):
            calls.append(fn.__name__)
        return real(fn, *args)

    io.run = run  # type: ignore[method-assign]
    return calls


def _publish(tmp_path: Path, fnum: int, pos: int, more: int) -> None:
    """Rewrite the producer's record as a producer does that has written ``more`` records
    up to ``(fnum, pos)`` (the bytes are the test's to put there first)."""
    path = tmp_path / "q.diskqueue.producer"
    rec = read_record_at(str(path))
    assert rec is not None
    patch_bytes(path, 0, dataclasses.replace(rec, file_num=fnum, pos=pos,
                                             seq=rec.seq + more).encode())


async def _chasing(tmp_path: Path, **opts: object) -> tuple[DiskQueue, int]:
    """A consumer that has taken the producer's first message (its segment is open for
    reading); then the producer is closed, and the test plays it. Returns the position
    past that message."""
    p, c = await _pair(tmp_path, **opts)
    await p.put(b"first")
    assert await _get(c) == b"first"
    await p.aclose()
    return c, 9


async def test_a_consumer_that_keeps_up_reads_on_the_loop(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    await p.put(b"opens the segment")
    assert await _get(c) == b"opens the segment"
    calls = _count_reads(c)
    for i in range(50):
        await p.put(b"m%d" % i)
        assert await _get(c) == b"m%d" % i
    # Natively, no read after the first goes to the I/O thread; in pure-Python mode
    # every one does.
    assert calls == [] if NATIVE else len(calls) >= 50
    await c.aclose()
    await p.aclose()


async def test_off_a_local_filesystem_every_read_goes_to_the_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A network or FUSE filesystem (here: one said to be): a read may wait on a server,
    # so none is done on the loop.
    from aiodiskqueue._core import consumer
    monkeypatch.setattr(consumer, "local_fs", lambda path: False)
    p, c = await _pair(tmp_path)
    await p.put(b"opens the segment")
    assert await _get(c) == b"opens the segment"
    calls = _count_reads(c)
    for i in range(20):
        await p.put(b"m%d" % i)
        assert await _get(c) == b"m%d" % i
    assert len(calls) >= 20
    await c.aclose()
    await p.aclose()


def test_local_filesystems_are_told_apart() -> None:
    assert notify.local_fs("/proc") is False  # procfs: not a filesystem of files we write
    assert notify.local_fs("/no/such/dir") is False
    if os.path.ismount("/dev/shm"):  # tmpfs on Linux
        assert notify.local_fs("/dev/shm") is True


async def test_a_torn_record_inside_the_published_span_is_damage(tmp_path: Path) -> None:
    c, end = await _chasing(tmp_path)
    seg = tmp_path / seg_name("q", 0)
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x05whole" + b"\x00\x00\x00\x10half")
    late = asyncio.ensure_future(c.get())
    # Published up to the end of the half record: the producer says it is whole.
    _publish(tmp_path, 0, end + 9 + 8, 2)
    assert await asyncio.wait_for(late, 10) == b"whole"
    with pytest.raises(CorruptionError) as ei:
        await _get(c)
    assert ei.value.path == str(seg)
    assert ei.value.offset == end + 9
    await c.aclose()


async def test_a_bad_length_inside_the_published_span_is_damage(tmp_path: Path) -> None:
    c, end = await _chasing(tmp_path)
    seg = tmp_path / seg_name("q", 0)
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x02ok" + b"\x7f\xff\xff\xff" + b"x" * 8)
    _publish(tmp_path, 0, end + 6 + 12, 2)
    assert await _get(c) == b"ok"
    with pytest.raises(CorruptionError) as ei:
        await _get(c)
    assert ei.value.offset == end + 6
    await c.aclose()


async def test_a_torn_tail_past_the_published_span_is_not_read(tmp_path: Path) -> None:
    c, end = await _chasing(tmp_path)
    seg = tmp_path / seg_name("q", 0)
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x03one" + b"\x00\x00\x00\x03tw")  # the second half written
    _publish(tmp_path, 0, end + 7, 1)
    assert await _get(c) == b"one"
    late = asyncio.ensure_future(c.get())
    await asyncio.sleep(0.1)
    assert not late.done()  # not yet, not damage
    with open(seg, "ab") as f:
        f.write(b"o")
    _publish(tmp_path, 0, end + 14, 1)
    assert await asyncio.wait_for(late, 10) == b"two"
    assert c.statistics().bad_files == 0
    await c.aclose()


async def test_the_consumer_follows_rolls_while_it_keeps_up(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, max_bytes_per_file=256, sync_every=10)
    msgs = [b"%03d" % i * 20 for i in range(60)]
    for m in msgs:
        await p.put(m)
        assert await _get(c) == m
    await c.sync()
    segs = sorted(e.name for e in tmp_path.iterdir() if e.name.endswith(".dat")
                  and "meta" not in e.name)
    assert len(segs) <= 2  # the read file and the write file
    await c.aclose()
    await p.aclose()


async def test_a_missing_segment_after_a_roll_is_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c, _ = await _chasing(tmp_path)
    (tmp_path / seg_name("q", 2)).write_bytes(b"\x00\x00\x00\x05later")
    with caplog.at_level(logging.WARNING, "aiodiskqueue"):
        _publish(tmp_path, 2, 9, 1)
        assert await _get(c) == b"later"
    assert any("segment missing" in r.getMessage() for r in caplog.records)
    await c.aclose()


async def test_a_published_span_too_large_for_the_loop_goes_to_the_thread(
        tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    await p.put(b"opens the segment")
    assert await _get(c) == b"opens the segment"
    calls = _count_reads(c)
    msgs = [os.urandom(1000) for _ in range(2 * INLINE_READ_MAX // 1000)]
    await p.put_many(msgs)  # one batch, one publish
    assert [await _get(c) for _ in msgs] == msgs
    assert calls  # read on the I/O thread (at least its start)
    await c.aclose()
    await p.aclose()


async def test_a_span_past_a_small_read_ahead_is_read_in_budgets(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, read_buffer_bytes=4096)
    await p.put(b"opens the segment")
    assert await _get(c) == b"opens the segment"
    msgs = [b"%02d" % i * 500 for i in range(30)]  # 30 KiB: more than the read-ahead
    await p.put_many(msgs)
    assert [await _get(c) for _ in msgs] == msgs
    await c.aclose()
    await p.aclose()


async def test_a_failing_look_breaks_the_consumer_with_its_error(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    await p.put(b"first")
    assert await _get(c) == b"first"
    e = _engine(c)

    def fail(budget: int) -> int:
        raise OSError(5, "Input/output error")

    e._look = fail  # type: ignore[method-assign]
    e._step = fail  # type: ignore[assignment,method-assign]
    await p.put(b"second")
    with pytest.raises(DiskQueueError) as ei:
        await _get(c)
    assert "Input/output error" in str(ei.value)
    await c.aclose()
    await p.aclose()


async def test_a_watch_with_a_callback_calls_it_at_changes_and_looks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "_WATCHED_CHECK", 0.05)
    path = tmp_path / "f"
    path.write_bytes(b"")
    calls: list[float] = []
    loop = asyncio.get_running_loop()
    watch = notify.FileWatch(loop, str(path), on_change=lambda: calls.append(loop.time()))
    try:
        if not watch.inotify:
            pytest.skip("no inotify here: the polling watch has its own test")
        await asyncio.sleep(0.3)
        assert 2 <= len(calls) <= 8  # the look every 0.05 s, with nothing written
        monkeypatch.setattr(notify, "_WATCHED_CHECK", 3600.0)
        await asyncio.sleep(0.1)  # the look armed before has come
        calls.clear()
        path.write_bytes(b"x")
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert calls
    finally:
        watch.close()
    n = len(calls)
    path.write_bytes(b"y")
    await asyncio.sleep(0.1)
    assert len(calls) == n  # closed: no more calls


async def test_a_held_watch_calls_at_the_end_of_the_hold_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "_WATCHED_CHECK", 0.02)  # no look while held either
    path = tmp_path / "f"
    path.write_bytes(b"")
    calls: list[float] = []
    loop = asyncio.get_running_loop()
    watch = notify.FileWatch(loop, str(path), on_change=lambda: calls.append(loop.time()))
    try:
        if not watch.inotify:
            assert not watch.hold(0.1)  # polling: nothing to hold
            return
        t0 = loop.time()
        assert watch.hold(0.5)
        assert not watch.hold(0.5)  # one at a time
        calls.clear()
        for i in range(20):
            if loop.time() - t0 > 0.3:
                break  # a loaded machine: every write inside the hold
            path.write_bytes(b"%d" % i)
            await asyncio.sleep(0.002)
        while not calls and loop.time() - t0 < 10:
            await asyncio.sleep(0.01)
        assert calls and calls[0] - t0 >= 0.45  # nothing before the hold's end
        assert watch.hold(0.05)
        t1 = loop.time()
        calls.clear()
        await asyncio.sleep(0.2)
        assert calls and calls[0] - t1 >= 0.04  # ends with a call though nothing changed
    finally:
        watch.close()


async def test_a_fast_producer_is_read_per_hold_and_a_slow_one_per_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import consumer

    p, c = await _pair(tmp_path)
    await p.put(b"opens the segment")
    assert await _get(c) == b"opens the segment"
    watch = _engine(c).watch()
    holds: list[float] = []
    real = watch.hold

    def hold(delay: float) -> bool:
        held = real(delay)
        if held:
            holds.append(delay)
        return held

    monkeypatch.setattr(watch, "hold", hold)
    monkeypatch.setattr(consumer, "HOLD_GAP", 3600.0)  # every read counts as quick
    for i in range(20):
        await p.put(b"f%d" % i)
        assert await _get(c) == b"f%d" % i
    if not NATIVE or not watch.inotify:
        # The pure-Python consumer reads on the I/O thread; polling has nothing to hold.
        assert holds == []
        await c.aclose()
        await p.aclose()
        return
    assert holds  # after HOLD_AFTER quick reads
    monkeypatch.setattr(consumer, "HOLD_GAP", 0.0)  # from now on, no read is quick
    await asyncio.sleep(0.05)  # the last hold ends with nothing new
    n = len(holds)
    loop = asyncio.get_running_loop()
    for i in range(5):
        await asyncio.sleep(0.01)
        t0 = loop.time()
        await p.put(b"s%d" % i)
        assert await _get(c) == b"s%d" % i
        assert loop.time() - t0 < 5
    assert len(holds) == n  # a slow producer wakes the consumer per change again
    await c.aclose()
    await p.aclose()
