"""The read-ahead on the native lane: plain reads go there, and a damaged record deep in
a segment (met by a lane read) ends exactly as on the Python I/O thread."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers_format import seg_name

from aiodiskqueue import CorruptionError, DiskQueue, QueueEmpty
from aiodiskqueue._core import lane as _lane
from aiodiskqueue._core.flight import round_only
from aiodiskqueue._core.schedule import Scheduler
from aiodiskqueue._format.meta import Meta, store_meta

SIZE = 1000  # payload bytes; a record is 1,004
PER_FILE = 99  # records of a 100,000-byte segment


def payload(i: int) -> bytes:
    return b"%06d" % i + b"x" * (SIZE - 6)


@pytest.fixture
def lane_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reads sent to the native lane (their sizes)."""
    calls: list[int] = []
    real = _lane.WriteLane.submit_read

    def spy(self: _lane.WriteLane, fd: int, buf: Any, offset: int, nbytes: int) -> Any:
        calls.append(nbytes)
        return real(self, fd, buf, offset, nbytes)

    monkeypatch.setattr(_lane.WriteLane, "submit_read", spy)
    return calls


async def fill(d: Path, n: int) -> None:
    async with DiskQueue(d, "q", max_bytes_per_file=100_000) as q:
        await q.put_many([payload(i) for i in range(n)])


async def drain(d: Path, **opts: Any) -> tuple[list[bytes], int, CorruptionError | None]:
    """Everything a shut-down queue gives, its bad file count, and the error that
    stopped the drain (strict mode), if any."""
    got: list[bytes] = []
    err: CorruptionError | None = None
    async with DiskQueue(d, "q", max_bytes_per_file=100_000, read_buffer_bytes=8192,
                         **opts) as q:
        q.shutdown()
        try:
            async for m in q:
                got.append(m)
        except CorruptionError as exc:
            err = exc
        bad = q.statistics().bad_files
    return got, bad, err


async def test_a_drain_reads_ahead_on_the_lane(tmp_path: Path, lane_reads: list[int],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
    await fill(tmp_path, 3 * PER_FILE + 10)
    got, bad, err = await drain(tmp_path)
    assert got == [payload(i) for i in range(3 * PER_FILE + 10)]
    assert (bad, err) == (0, None)
    # 4 segments of up to 99,396 bytes in reads of at most 8 KiB: most go to the lane
    # (the first read of each segment opens it on the I/O thread).
    assert len(lane_reads) > 30
    assert max(lane_reads) <= 8192


async def test_a_reopened_queue_reads_ahead_on_the_lane_once_its_position_is_checked(
        tmp_path: Path, lane_reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # The meta's read position inside a segment is checked by the I/O thread's first
    # read (a record boundary?); the segment's later reads go to the lane.
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
    await fill(tmp_path, PER_FILE)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=100_000) as q:
        assert [await q.get() for _ in range(5)] == [payload(i) for i in range(5)]
    got, bad, err = await drain(tmp_path)
    assert got == [payload(i) for i in range(5, PER_FILE)]
    assert (bad, err) == (0, None)
    assert len(lane_reads) >= 8  # 8 KiB reads of a segment of about 97 KiB


async def test_a_read_position_inside_a_record_is_found_when_the_first_read_parses_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Payloads with a length-like field at a fixed offset: parsed from inside a record
    # they look clean for a whole read; the position is checked all the same, and the
    # segment is read again from the record holding it (nothing quarantined).
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
    size, at = 100, 10

    def good(i: int) -> bytes:
        return b"%010d" % i + struct.pack(">I", size) + b"g" * (size - at - 4)

    def other(i: int) -> bytes:
        return b"%010d" % i + b"\xff\xff\xff\xff" + b"o" * (size - at - 4)

    msgs = [good(i) for i in range(200)] + [other(i) for i in range(200, 260)]
    per_file = len(msgs) * (size + 4)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=per_file) as q:
        await q.put_many(msgs)
        await q.put(b"tail")  # rolls to segment 1
    store_meta(str(tmp_path / "q.diskqueue.meta.dat"),
               Meta(len(msgs) + 1 - 5, 0, 5 * (size + 4) + 4 + at, 1, 8))  # inside record 5
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=per_file,
                         read_buffer_bytes=8192) as q:
        q.shutdown()
        got = [m async for m in q]
        assert q.statistics().bad_files == 0
    assert got == [*msgs[5:], b"tail"]


@pytest.mark.parametrize("strict", [False, True], ids=["quarantine", "strict"])
@pytest.mark.parametrize("damage", ["oversize", "negative", "truncated"])
async def test_damage_met_by_a_lane_read_ends_as_on_the_io_thread(
        tmp_path: Path, lane_reads: list[int], monkeypatch: pytest.MonkeyPatch,
        damage: str, strict: bool) -> None:
    outcomes = []
    for native in (True, False):
        if native:
            monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
        else:
            monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1")
        d = tmp_path / ("native" if native else "python")
        await fill(d, 2 * PER_FILE + 5)
        seg0 = d / seg_name("q", 0)
        at = 70 * (4 + SIZE)  # record 70 of segment 0: far past the first 8 KiB read
        data = bytearray(seg0.read_bytes())
        if damage == "truncated":
            del data[at + 100:]  # segment 0 ends 100 bytes into record 70
        else:
            data[at:at + 4] = struct.pack(">i", 1 << 24 if damage == "oversize" else -5)
        seg0.write_bytes(bytes(data))
        before = len(lane_reads)
        got, bad, err = await drain(d, strict=strict)
        if native:
            assert len(lane_reads) - before > 3, "the damage was not met by a lane read"
        outcomes.append((got, bad, None if err is None else (Path(err.path).name, err.offset)))
    assert outcomes[0] == outcomes[1]
    got, bad, err_at = outcomes[0]
    assert got[:70] == [payload(i) for i in range(70)]
    if strict:
        assert (len(got), bad) == (70, 0)
        assert err_at is not None and err_at[1] == 70 * (4 + SIZE)
    else:
        # Segment 0 is quarantined at record 70; segments 1 and 2 are read in full.
        assert got[70:] == [payload(i) for i in range(PER_FILE, 2 * PER_FILE + 5)]
        assert bad == 1


async def test_reads_go_beside_sync_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
    beside: list[int] = []
    real = Scheduler.dispatch_read

    def spy(s: Scheduler, *args: Any) -> Any:
        beside.append(len(s._e.flights))  # 1: a sync round is in flight
        return real(s, *args)

    monkeypatch.setattr(Scheduler, "dispatch_read", spy)
    await fill(tmp_path, 3 * PER_FILE)
    got: list[bytes] = []
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=100_000, read_buffer_bytes=8192,
                         sync_every=20) as q:
        for _ in range(3 * PER_FILE):
            got.append(await q.get())
            if len(got) % 7 == 0:
                await asyncio.sleep(0)  # let the ioLoop start sync rounds meanwhile
        syncs = q.statistics().syncs
    assert got == [payload(i) for i in range(3 * PER_FILE)]
    assert syncs >= 3 * PER_FILE // 20 - 2
    assert 1 in beside, beside
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=100_000) as q:
        assert q.qsize() == 0  # the last meta stored the consumer's final position


async def test_a_failing_sync_round_does_not_starve_the_consumer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The meta cannot be stored (EIO) while appends still succeed: the failed round waits
    # for its retry time (doubling up to a minute), and meanwhile busy producers keep the
    # pending batch full. The consumer's reads must go on beside them: it takes its share
    # while the producers put, not only once they stop. (Its fair share is about one step
    # in 17, some 18,800 of the 320,000 puts' time; starved, it took 546.)
    import errno

    from aiodiskqueue._core import store as _store
    opts: dict[str, Any] = {"sync_every": 100, "sync_interval": 0.2, "read_buffer_bytes": 8192}
    async with DiskQueue(tmp_path, "q", **opts) as q:
        await q.put_many([b"x" * 100] * 20_000)
    async with DiskQueue(tmp_path, "q", **opts) as q:
        assert await q.get() == b"x" * 100

        def no_meta(path: str, meta: object, swap: object = None, *, mode: int = 0o600) -> None:
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(_store, "store_meta", no_meta)
        puts = [0]
        budget = 16 * 20_000

        async def produce() -> None:
            while puts[0] < budget:
                puts[0] += 1
                await q.put(b"y" * 100)

        producers = [asyncio.create_task(produce()) for _ in range(16)]
        taken = 0
        try:
            while puts[0] < budget and taken < 10_000:
                await asyncio.wait_for(q.get(), 30)
                taken += 1
            puts_then = puts[0]
        finally:
            await asyncio.gather(*producers, return_exceptions=True)
            monkeypatch.undo()
        assert taken == 10_000, f"the consumer took {taken} while {puts_then} were put"


@pytest.mark.parametrize("pure", [False, True])
async def test_the_first_read_after_open_is_short_where_the_lane_reads_what_follows(
        tmp_path: Path, lane_reads: list[int], monkeypatch: pytest.MonkeyPatch,
        pure: bool) -> None:
    # The I/O thread's first read (it opens the segment and checks the meta's read
    # position) takes only OPENING_READ_BYTES: the consumer's first messages do not wait
    # for the whole read-ahead to be parsed. Without the native thread it reads it all.
    from aiodiskqueue._core import store as _store
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1" if pure else "0")
    if not pure and not _lane.available():
        pytest.skip("the native module is not built")
    budgets: list[int] = []
    real = _store.SegmentStore.read

    def spy(self: Any, at: tuple[int, int], budget: int, res: Any) -> None:
        budgets.append(budget)
        real(self, at, budget, res)

    monkeypatch.setattr(_store.SegmentStore, "read", spy)
    n = 1200  # 1.2 MB of records: more than the opening read, less than the read-ahead
    async with DiskQueue(tmp_path, "q") as q:
        await q.put_many([payload(i) for i in range(n)])
    async with DiskQueue(tmp_path, "q") as q:
        got = [await q.get() for _ in range(n)]
    assert got == [payload(i) for i in range(n)]
    if pure:
        assert budgets[0] == 4 * 1024 * 1024
        assert lane_reads == []
    else:
        assert budgets[0] == _lane.OPENING_READ_BYTES
        assert len(budgets) == 1  # the rest on the native thread
        # The opening read ends with a whole record: the one its budget cut into.
        assert sum(lane_reads) >= n * (SIZE + 4) - _lane.OPENING_READ_BYTES - (SIZE + 4)


async def test_the_meta_stored_after_open_follows_the_first_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The meta a queue stores once after open goes after the first read ahead, not in
    # its hop: the first messages of a reopened backlog do not wait for its fsyncs.
    from aiodiskqueue._core import store as _store
    jobs: list[tuple[bool, bool]] = []
    real = _store.SegmentStore.run

    def spy(self: Any, job: Any) -> Any:
        jobs.append((job.read_from is not None, job.sync))
        return real(self, job)

    await fill(tmp_path, 50)
    monkeypatch.setattr(_store.SegmentStore, "run", spy)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=100_000,
                         sync_interval=3600.0) as q:
        assert await q.get() == payload(0)
        assert jobs[0] == (True, False)  # the first hop reads and stores nothing
        for _ in range(500):  # the meta follows without any sync() or timer
            if q.statistics().syncs:
                break
            await asyncio.sleep(0.01)
        assert q.statistics().syncs == 1
        assert [await q.get() for _ in range(49)] == [payload(i) for i in range(1, 50)]


async def _take_ready_without_yielding(q: DiskQueue, got: list[bytes],
                                       before: Callable[[], None] = lambda: None) -> None:
    """Wait until the read-ahead is full and the ioLoop idle, call ``before``, then take
    every ready message with ``get_nowait()`` and no await between them."""
    e = q._e
    for _ in range(500):
        if e.parked and not e.flights and e.statistics().syncs:
            break
        await asyncio.sleep(0.01)
    before()
    with contextlib.suppress(QueueEmpty):
        while True:
            got.append(q.get_nowait())


@contextlib.asynccontextmanager
async def _consumer_on_the_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                on_read: Callable[[Any], None]
                                ) -> AsyncIterator[tuple[DiskQueue, list[bytes]]]:
    """A queue of PER_FILE messages read on the native lane, with a sync round due every 5
    takes; ``on_read(engine)`` runs as each read is sent. Yields the queue and the first
    message taken; afterwards takes the rest and checks that all came, in order."""
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "0")
    if not _lane.available():
        pytest.skip("the native module is not built")
    real = Scheduler.dispatch_read

    def spy(s: Scheduler, *args: Any) -> Any:
        on_read(s._e)
        return real(s, *args)

    monkeypatch.setattr(Scheduler, "dispatch_read", spy)
    await fill(tmp_path, PER_FILE)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=100_000, read_buffer_bytes=65536,
                         sync_every=5, sync_interval=3600.0) as q:
        got = [await q.get()]
        yield q, got
        while len(got) < PER_FILE:
            got.append(await asyncio.wait_for(q.get(), 5))
        await q.sync()
    assert got == [payload(i) for i in range(PER_FILE)]


async def test_a_consumer_that_never_yields_gets_its_read_beside_the_round_it_made_due(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer taking ready messages without a break does not let the ioLoop run. When
    # it reaches the low-water mark with a sync round due, the round goes out first and the
    # read beside it at once, from the take itself: before, the read waited until the
    # consumer ran dry and the ioLoop ran.
    beside: list[list[bool]] = []
    tight = [False]

    def on_read(e: Any) -> None:
        if tight[0]:
            beside.append([round_only(f) for f in e.flights])

    async with _consumer_on_the_lane(tmp_path, monkeypatch, on_read) as (q, got):
        await _take_ready_without_yielding(q, got, lambda: tight.__setitem__(0, True))
        tight[0] = False
        assert beside == [[True]], beside  # one read, sent beside the round


async def test_a_round_a_take_starts_leaves_the_message_in_hand_unconsumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sync round that a take makes due goes out from the take itself, to a thread
    # that stores the meta beside the caller. The message that take is handing out has
    # not reached its caller yet: the stored position must stop before it, or a kill
    # before the caller has it (or while it handles it without an await) loses it.
    seen: list[tuple[Any, Any, Any]] = []

    def on_read(e: Any) -> None:
        for f in e.flights:
            if f.job.meta_read is not None and e.handing:
                seen.append((f.job.meta_read, e.stored_at(), e.consumer_at()))

    async with _consumer_on_the_lane(tmp_path, monkeypatch, on_read) as (q, got):
        await _take_ready_without_yielding(q, got)
        assert seen, "no round was sent from a take"
        for stored, in_hand_excluded, taken in seen:
            assert stored == in_hand_excluded != taken
