"""The take quota: the takes a checked take lets skip every check (``buffers.take``)
leave the counters, the consumer position and every wake-up exactly as checked takes
would, and anything that changes what the quota assumed ends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue import DiskQueue, QueueClosed, QueueEmpty
from aiodiskqueue._core.buffers import QueueBuffers
from aiodiskqueue._core.engine import Engine

SIZE = 100
RECORD = 4 + SIZE
N = 300


def payload(i: int) -> bytes:
    return b"%06d" % i + b"q" * (SIZE - 6)


async def _all_ready(q: DiskQueue, n: int) -> None:
    """Wait until ``n`` messages are ready in memory and the ioLoop is idle."""
    e = q._e
    for _ in range(500):
        if len(e.ready) >= n and e.parked and not e.flights:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(e.ready)} of {n} messages ready")


async def _open_full(tmp_path: Path, n: int = N, **opts: Any) -> AsyncIterator[DiskQueue]:
    async with DiskQueue(tmp_path, "q", sync_interval=3600.0, **opts) as q:
        await q.put_many([payload(i) for i in range(n)])
        await q.sync()
        await _all_ready(q, n)
        yield q


@pytest.fixture
async def full(tmp_path: Path) -> AsyncIterator[DiskQueue]:
    """An open queue with N messages ready in memory, and no sync round due."""
    async for q in _open_full(tmp_path):
        yield q


def test_a_take_under_a_quota_is_a_take_without_checks() -> None:
    # What the rest of this file relies on: a checked take grants a quota, and the
    # takes under it do not run the checked path.
    assert "_take_checked" in QueueBuffers.take.__code__.co_names


async def test_counters_and_position_under_a_quota_are_those_of_checked_takes(
        tmp_path: Path, full: DiskQueue) -> None:
    q, e = full, full._e
    assert q.get_nowait() == payload(0)
    assert e.quota > 10, "the checked take granted no quota"
    for i in range(1, 11):
        assert q.get_nowait() == payload(i)
    assert e.quota > 0  # still under it: the counters include what it took
    st = q.statistics()
    assert (st.gets, st.depth, q.qsize()) == (11, N - 11, N - 11)
    assert (st.read_file_num, st.read_pos) == (0, 11 * RECORD)
    assert e.since_sync == 11
    await q.aclose()
    async with DiskQueue(tmp_path, "q") as again:
        assert again.qsize() == N - 11
        assert await again.get() == payload(11)


async def test_the_take_that_makes_a_round_due_runs_the_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer that never yields does not let the ioLoop look at since_sync: the take
    # that makes it reach sync_every must ask for the round itself (_after_take), quota
    # or not.
    checked_at: list[int] = []
    real = QueueBuffers._after_take

    def spy(self: QueueBuffers) -> None:
        checked_at.append(self.since_sync)
        real(self)

    monkeypatch.setattr(QueueBuffers, "_after_take", spy)
    async for q in _open_full(tmp_path, sync_every=40):
        e = q._e
        assert e.since_sync == 0
        got = [q.get_nowait() for _ in range(3 * 40)]
        assert got == [payload(i) for i in range(3 * 40)]
        assert e.quota > 0
        assert 40 in checked_at, checked_at


async def test_the_read_goes_out_at_the_take_that_reaches_the_low_water_mark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The quota stops where the ready bytes would fall to the low-water mark (at the mean
    # size, exact for equal sizes): the take that gets there sends the next read.
    at: list[tuple[int, int]] = []
    real = Engine.refill

    def spy(self: Engine) -> None:
        at.append((self.ready_bytes, self.refill_at))
        real(self)

    async with DiskQueue(tmp_path, "q", sync_interval=3600.0) as q:
        await q.put_many([payload(i) for i in range(N)])
    monkeypatch.setattr(Engine, "refill", spy)
    async with DiskQueue(tmp_path, "q", sync_interval=3600.0, read_buffer_bytes=8192) as q:
        got = [await q.get()]
        await _all_ready(q, 1)
        while q._e.ready and q._e.refill_at >= 0:
            got.append(q.get_nowait())
        assert at, "no read was sent"
        left, mark = at[0]
        assert mark - SIZE < left <= mark, at[0]
        while len(got) < N:
            got.append(await asyncio.wait_for(q.get(), 5))
    assert got == [payload(i) for i in range(N)]


@pytest.mark.parametrize("how", ["shutdown-immediate", "close"])
async def test_a_queue_closed_under_a_quota_hands_out_nothing_more(
        full: DiskQueue, how: str) -> None:
    q, e = full, full._e
    q.get_nowait()
    assert e.quota > 0
    if how == "close":
        await q.aclose()
    else:
        q.shutdown(immediate=True)
    with pytest.raises(QueueClosed):
        q.get_nowait()


async def test_a_shut_down_queue_drains_under_quotas_then_ends(full: DiskQueue) -> None:
    q = full
    first = q.get_nowait()
    q.shutdown()
    got = [first] + [m async for m in q]
    assert got == [payload(i) for i in range(N)]
    with pytest.raises(QueueClosed):
        await q.get()


async def test_a_putter_that_parks_under_a_quota_is_woken_by_the_next_take(
        tmp_path: Path) -> None:
    async for q in _open_full(tmp_path, maxsize=N):
        e = q._e
        q.get_nowait()
        assert e.quota > 0
        q.put_nowait(b"p" * SIZE)  # the queue is full again; nothing written yet
        # A put parks, with no loop iteration between (nothing written meanwhile).
        parking = e.wait_not_full()
        waiter = parking.send(None)
        assert e.putters and not waiter.done()
        q.get_nowait()  # the take right after the putter parked wakes it
        assert waiter.done() and not e.putters
        with pytest.raises(StopIteration):
            parking.send(None)
        assert q.qsize() == N - 1


async def test_a_purge_under_a_quota_leaves_nothing_to_take(full: DiskQueue) -> None:
    q, e = full, full._e
    q.get_nowait()
    assert e.quota > 0
    purge = asyncio.ensure_future(q.purge())
    await asyncio.sleep(0)  # the purge has dropped the ready messages, not yet the files
    assert not purge.done() and not e.ready
    with pytest.raises(QueueEmpty):
        q.get_nowait()
    await purge
    with pytest.raises(QueueEmpty):
        q.get_nowait()
    assert (q.qsize(), q.statistics().gets) == (0, 1)
    await q.put(b"after")
    assert await asyncio.wait_for(q.get(), 5) == b"after"


async def test_batches_and_untakes_under_a_quota_keep_the_counts(full: DiskQueue) -> None:
    q, e = full, full._e
    taken = [q.get_nowait() for _ in range(5)]
    assert e.quota > 0
    taken += await q.get_many(20)
    assert len(taken) == 25 and q.qsize() == N - 25
    taken += [q.get_nowait() for _ in range(5)]
    e.untake(taken[-7:])  # what the AckQueue does with messages it could not deliver
    assert (q.qsize(), q.statistics().gets, e.since_sync) == (N - 23, 23, 23)
    assert q.statistics().read_pos == 23 * RECORD
    assert [q.get_nowait() for _ in range(N - 23)] == [payload(i) for i in range(23, N)]


async def test_arming_the_low_water_mark_ends_a_quota_granted_without_it(
        full: DiskQueue) -> None:
    # A quota granted while no read was due did not stop at the low-water mark: when a
    # read lands and arms it, the takes must look at the bytes again.
    q, e = full, full._e
    assert e.refill_at == -1  # everything is read: no mark
    q.get_nowait()
    granted = e.quota
    assert granted > 0
    e.refill_at = -1  # lowering (disarming) keeps it
    assert e.quota == granted
    e.refill_at = e.ready_bytes - 5 * SIZE
    assert e.quota == 0 and q.statistics().gets == 1
    assert q.get_nowait() == payload(1)
    assert 0 < e.quota <= 5


async def test_writes_that_bring_a_round_within_a_quota_end_it(tmp_path: Path) -> None:
    # A quota stops before the take that makes a sync round due; writes counted after the
    # grant move that take closer, so a quota that would now run past it must end.
    async for q in _open_full(tmp_path, sync_every=1000):
        e = q._e
        q.get_nowait()
        granted = e.quota
        assert granted > 100 and e.since_sync == 1
        e.since_sync += 10
        e.sync_counted()
        assert e.quota == granted  # still short of the round
        e.since_sync += 1000 - 11 - granted
        e.sync_counted()
        assert e.quota == 0 and q.statistics().gets == 1


async def test_a_round_that_starts_under_a_quota_granted_past_sync_every_ends_it(
        tmp_path: Path) -> None:
    # Granted while since_sync was already past sync_every (a round due, not yet run),
    # a quota has no sync bound; once a round starts and since_sync falls back, the take
    # that makes the next round due lies within it, and must run the checks.
    async for q in _open_full(tmp_path, sync_every=50):
        e = q._e
        e.since_sync = 60
        e.sync_counted()
        q.get_nowait()
        assert e.quota > 50
        e.since_sync = 0  # what a round does as it starts
        e.sync_counted()
        assert e.quota == 0 and q.statistics().gets == 1
