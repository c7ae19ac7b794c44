"""Polled writes, the default write path with the native writer: a small batch is handed
to the writer thread and the loop waits briefly for it (``WriteLane.poll``) instead of
sleeping until the eventfd wakes it. A write that takes longer than the wait completes
through the eventfd as any lane write; nothing is lost or reordered either way."""

from __future__ import annotations

import asyncio
import os
import random
import select
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import read_meta, read_queue, records, seg_name

from aiodiskqueue import DiskQueue
from aiodiskqueue._core import lane as _lane


@pytest.fixture(autouse=True)
def _native(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests are about the native writer: run them with it in the pure-Python pass too.
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_poll_with_nothing_in_flight_says_so(tmp_path: Path) -> None:
    assert _lane.Writer is not None
    w = _lane.Writer(100, _lane.SMALL_MAX)
    try:
        assert w.poll(1_000_000) == -1
    finally:
        w.close()


def test_every_job_is_either_collected_by_poll_or_signalled(tmp_path: Path) -> None:
    # The writer skips the eventfd for a job that a poll collects; a poll that gives up
    # hands the signal back. Whatever the timing, no job may end neither polled nor
    # signalled: the loop would never learn of it and its puts would hang.
    assert _lane.Writer is not None
    rnd = random.Random(7)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    w = _lane.Writer(rnd.choice([0, 20, 100]), _lane.SMALL_MAX)
    efd = w.fileno()
    polled = signalled = spurious = 0
    offset = 0
    written: list[bytes] = []
    try:
        for i in range(400):
            payloads = [b"%04d" % i * rnd.randint(1, 300)] * rnd.randint(1, 8)
            total = w.submit_records(fd, payloads, offset, False)
            written += payloads
            offset += total
            hit = w.poll(rnd.choice([0, 1_000, 5_000, 50_000]))
            assert hit in (0, 1)
            if hit:
                polled += 1
                assert w.reap() == [(total, 0, 0)]
                # Collected here, so the writer skips the eventfd, unless the poll saw the
                # job done between the writer publishing it and looking at the signal (the
                # thread preempted there): then a signal comes that carries no job.
                if _readable(efd, 0):
                    spurious += 1
                    assert w.reap() == []
            else:
                signalled += 1
                got: list[tuple[int, int, int]] = []
                while not got:  # each look needs a signal: a stale one does not count
                    assert _readable(efd, 10), f"job {i} finished but was never signalled"
                    got = w.reap()
                assert got == [(total, 0, 0)]
            assert w.inflight() == 0
    finally:
        w.close()
        os.close(fd)
    assert polled + signalled == 400
    # The skip works: a writer that signalled every job would make every hit spurious.
    assert polled < 20 or spurious < polled, (polled, spurious)
    assert records((tmp_path / "f").read_bytes()) == written


def test_write_polled_answers_or_leaves_the_job_to_the_eventfd(tmp_path: Path) -> None:
    # Submit, poll and reap in one call: a job done within the wait comes back as its
    # result (nothing left to reap, no signal that carries a job); one that is not stays
    # in flight and is signalled like any job. Every record lands, in order.
    assert _lane.Writer is not None
    rnd = random.Random(11)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    w = _lane.Writer(100, _lane.SMALL_MAX)
    efd = w.fileno()
    answered = left = 0
    offset = 0
    written: list[bytes] = []
    try:
        for i in range(300):
            payloads = [b"%04d" % i * rnd.randint(1, 300)] * rnd.randint(1, 8)
            total = 4 * len(payloads) + sum(map(len, payloads))
            got = w.write_polled(fd, payloads, offset, rnd.choice([0, 0, 5_000, 5_000_000]))
            written += payloads
            offset += total
            if got is not None:
                answered += 1
                assert got == (total, 0, 0)
                assert w.inflight() == 0
                if _readable(efd, 0):  # see test_every_job_is_either_collected_...
                    assert w.reap() == []
            else:
                left += 1
                reaped: list[tuple[int, int, int]] = []
                while not reaped:
                    assert _readable(efd, 10), f"job {i} finished but was never signalled"
                    reaped = w.reap()
                assert reaped == [(total, 0, 0)]
            assert w.inflight() == 0
        # Not while another job is queued: the caller would lose the order of results.
        w.submit_records(fd, [b"queued"], offset, False)
        with pytest.raises(RuntimeError, match="queued"):
            w.write_polled(fd, [b"not written"], offset + 10, 50_000)
        assert w.inflight() == 1
        written.append(b"queued")
    finally:
        w.close()
        os.close(fd)
    assert answered and left  # a timeout of 0 never waits: both ways were taken
    assert records((tmp_path / "f").read_bytes()) == written


async def test_the_lane_answers_a_polled_write_only_once_it_is_on_disk(tmp_path: Path) -> None:
    # WriteLane.write_polled gives a result only for a write the writer has done; else
    # the future of the job in flight, done once it is written.
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    lane = _lane.WriteLane(asyncio.get_running_loop(), 100)
    rnd = random.Random(5)
    offset = answered = 0
    try:
        for i in range(300):
            payloads = [b"%04d" % i * rnd.randint(1, 400)] * rnd.randint(1, 6)
            size = 4 * len(payloads) + sum(map(len, payloads))
            got = lane.write_polled(fd, payloads, offset)
            if isinstance(got, tuple):
                answered += 1
            else:
                got = await asyncio.wait_for(got, 10)
            assert got == (size, 0, 0)
            assert records(os.pread(fd, size, offset)) == payloads  # on disk by now
            offset += size
    finally:
        lane.close()
        os.close(fd)
    assert answered  # the writer spins: most writes are done within the poll


@pytest.mark.parametrize("method", ["submit", "write_polled"])
async def test_a_job_is_never_queued_without_its_future(tmp_path: Path, method: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # If making the future fails (no memory), nothing may be queued: a job without a
    # future would take the result of the next one.
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    lane = _lane.WriteLane(asyncio.get_running_loop(), 100)
    real = _lane.Hop  # type: ignore[attr-defined]  # the name the lane makes its futures with

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    try:
        monkeypatch.setattr(_lane, "Hop", no_memory)
        args = (fd, [b"lost"], 0, False) if method == "submit" else (fd, [b"lost"], 0)
        with pytest.raises(MemoryError):
            getattr(lane, method)(*args)
        assert lane._w.inflight() == 0
        monkeypatch.setattr(_lane, "Hop", real)
        fut = lane.submit(fd, [b"kept"], 0, False)
        assert await asyncio.wait_for(fut, 10) == (8, 0, 0)
    finally:
        lane.close()
        os.close(fd)
    assert records((tmp_path / "f").read_bytes()) == [b"kept"]


def _polls(monkeypatch: pytest.MonkeyPatch, wait_ns: int, give_up: bool = False) -> list[int]:
    """Set the lane's poll window; the outcomes of the writer's polls go into the list.

    With ``give_up`` every poll gives up without looking (outcome 0), so that every write
    completes through the eventfd whatever the machine's speed: a real poll of even 1 ns
    collects a write the writer thread finished before the poll began.
    """
    monkeypatch.setattr(_lane, "POLL_WAIT_NS", wait_ns)
    outcomes: list[int] = []
    real = _lane.WriteLane.__init__

    def init(lane: _lane.WriteLane, *args: Any) -> None:
        real(lane, *args)
        w = lane._w

        class Spy:
            def __getattr__(self, name: str) -> Any:
                return getattr(w, name)

            def poll(self, timeout_ns: int) -> int:
                hit = 0 if give_up else w.poll(timeout_ns)
                outcomes.append(hit)
                return hit

            def write_polled(self, fd: int, payloads: list[bytes], offset: int,
                             timeout_ns: int) -> Any:
                # Submit, poll and reap in one call; a timeout of 0 gives up at once.
                got = w.write_polled(fd, payloads, offset, 0 if give_up else timeout_ns)
                if timeout_ns:
                    outcomes.append(0 if got is None else 1)
                return got

        lane._w = Spy()  # type: ignore[assignment]

    monkeypatch.setattr(_lane.WriteLane, "__init__", init)
    return outcomes


async def test_a_single_awaiting_producer_is_answered_by_the_poll(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A poll window far longer than any write: every put is collected by the loop's poll,
    # and its record is on disk when put() returns, as on every write path.
    outcomes = _polls(monkeypatch, 5_000_000_000)
    q = await make_queue(sync_interval=3600.0)
    path = tmp_path / seg_name("q", 0)
    await q.put(b"first")  # creates the segment, on the I/O thread
    for i in range(200):
        await q.put(b"m%03d" % i)
        assert records(path.read_bytes())[-1] == b"m%03d" % i
    assert outcomes.count(1) >= 200 and 0 not in outcomes
    assert [await q.get() for _ in range(201)] == [b"first"] + [b"m%03d" % i for i in range(200)]


@pytest.mark.parametrize("sync_every", [20, 2500])
async def test_polls_that_give_up_lose_and_reorder_nothing(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        sync_every: int) -> None:
    # A window of 1 ns: nearly every write outlasts the poll and completes through the
    # eventfd as a lane flight the ioLoop applies, beside sync rounds (sync_every=20)
    # started by the loop's own writes, across segment rolls.
    outcomes = _polls(monkeypatch, 1)
    q = await make_queue(max_bytes_per_file=20_000, sync_every=sync_every)

    async def producer(p: int) -> None:
        for i in range(150):
            await q.put(b"p%02d-%04d-" % (p, i) + bytes([65 + p]) * (i % 50))

    await asyncio.gather(*(producer(p) for p in range(8)))
    for i in range(300):
        await q.put(b"s%04d" % i)
    await q.sync()
    assert 0 in outcomes
    stored = read_queue(tmp_path, "q")
    assert len(stored) == 8 * 150 + 300
    for p in range(8):
        mine = [m for m in stored if m.startswith(b"p%02d-" % p)]
        assert mine == [b"p%02d-%04d-" % (p, i) + bytes([65 + p]) * (i % 50) for i in range(150)]
    assert stored[-300:] == [b"s%04d" % i for i in range(300)]
    if sync_every == 20:
        assert q.statistics().syncs >= (8 * 150 + 300) // 20 // 2
    got = [await q.get() for _ in range(len(stored))]
    assert got == stored
    await q.aclose()
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=20_000) as again:
        assert again.qsize() == 0


async def test_a_poll_that_gives_up_beside_a_held_sync_round_keeps_the_meta_consistent(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_engine_lane import _HeldSync
    outcomes = _polls(monkeypatch, 1, give_up=True)  # every write completes through the eventfd
    q = await make_queue(sync_every=10, sync_interval=3600.0)
    await q.put(b"first")
    await q.get()  # the read position moves: the next sync round stores a meta
    held = _HeldSync(monkeypatch)

    async def release_soon() -> None:
        await asyncio.to_thread(held.started.wait, 10)
        await asyncio.sleep(0.3)
        held.release.set()

    releaser = asyncio.create_task(release_soon())
    for i in range(15):
        await asyncio.wait_for(q.put(b"m%02d" % i), 10)
    await releaser
    await q.sync()
    meta = read_meta(tmp_path, "q")
    data = (tmp_path / seg_name("q", 0)).read_bytes()
    assert records(data) == [b"first"] + [b"m%02d" % i for i in range(15)]
    assert len(records(data[meta.read_pos:meta.write_pos])) == meta.depth == 15
    assert [await q.get() for _ in range(15)] == [b"m%02d" % i for i in range(15)]
    assert outcomes and set(outcomes) == {0}


def _backlog(n: int) -> list[bytes]:
    return [b"old%05d" % i + b"x" * 200 for i in range(n)]


async def _reopen_with_backlog(tmp_path: Path, old: list[bytes], read_buffer_bytes: int
                               ) -> DiskQueue:
    """The queue with ``old`` stored, reopened, its first message taken (the first
    read after an open is the I/O thread's; the next may go to the lane) and the meta
    stored once after open (it follows that read)."""
    opts: dict[str, Any] = {"sync_every": 400, "sync_interval": 3600.0,
                            "read_buffer_bytes": read_buffer_bytes}
    async with DiskQueue(tmp_path, "q", **opts) as q:
        await q.put_many(old)
    q = await DiskQueue.open(tmp_path, "q", **opts)
    assert await q.get() == old[0]
    await q.sync()
    return q


async def test_a_consumer_reads_beside_the_sync_round_that_the_loop_writes_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A producer's puts start the sync round at half of sync_every; while it is held on
    # the I/O thread, the consumer still gets its reads ahead (on the lane, beside the
    # round) for up to sync_every takes, and the producer goes on for the other half.
    from test_engine_lane import _HeldSync
    old = _backlog(3000)
    async with await _reopen_with_backlog(tmp_path, old, 8192) as q:
        held = _HeldSync(monkeypatch)
        before = q.statistics().syncs
        for i in range(250):
            await asyncio.wait_for(q.put(b"new%03d" % i), 5)
        assert await asyncio.to_thread(held.started.wait, 5)
        # 150 messages of 208 bytes: several 8 KiB reads, all while the round is held.
        got = [await asyncio.wait_for(q.get(), 5) for _ in range(150)]
        assert got == old[1:151]
        assert q.statistics().syncs == before
        held.release.set()
        rest = [await q.get() for _ in range(3000 - 151 + 250)]
        assert rest[-250:] == [b"new%03d" % i for i in range(250)]


async def test_reads_beside_the_round_keep_the_write_position_of_the_writes_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # While the round is held, puts (written beside it, not yet told to the store) and
    # reads ahead (beside it too) alternate: a read that finishes must not move the write
    # position back to the store's, or later puts would overwrite records written beside
    # the round and the consumer would get some twice.
    from test_engine_lane import _HeldSync
    old = _backlog(600)
    async with await _reopen_with_backlog(tmp_path, old, 4096) as q:
        held = _HeldSync(monkeypatch)
        for i in range(200):
            await asyncio.wait_for(q.put(b"new%03d" % i), 5)
        assert await asyncio.to_thread(held.started.wait, 5)
        got = []
        for i in range(200, 280):  # 160 more puts and takes: under half of sync_every
            await asyncio.wait_for(q.put(b"new%03d" % i), 5)
            got.append(await asyncio.wait_for(q.get(), 5))
        held.release.set()
        while q.qsize():
            got.append(await asyncio.wait_for(q.get(), 5))
        assert got == old[1:] + [b"new%03d" % i for i in range(280)]
        st = q.statistics()
        size = (tmp_path / seg_name("q", st.write_file_num)).stat().st_size
        assert st.write_pos == size
    assert read_queue(tmp_path, "q") == []
