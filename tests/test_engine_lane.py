"""The native write lane: built here, used for appends, exact on disk, and safe when a
write fails for real (a file size limit makes the kernel cut writes short)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import read_queue, records, seg_name

from aiodiskqueue import DiskQueue
from aiodiskqueue._core import lane as _lane

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _native(monkeypatch: pytest.MonkeyPatch) -> None:
    # These tests are about the lane: run them with it even in the pure-Python pass.
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)


def test_the_native_writer_is_built() -> None:
    # setup.py builds it wherever a C compiler is present, as on CI; a silent fallback
    # to the I/O thread would hide a build break behind slower numbers.
    assert _lane.Writer is not None
    assert _lane.available()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_the_writer_thread_carries_its_name_while_it_runs() -> None:
    # So that top -H, ps -L and the per-thread CPU of bench_put_threads.py can tell it.
    from aiodiskqueue._core import _writer

    def named() -> set[str]:
        """Ids of this process's threads that carry the writer's name (an older writer
        that the garbage collector closes meanwhile only leaves the set)."""
        tasks = Path("/proc/self/task")
        out = set()
        for t in tasks.iterdir():
            try:
                if (t / "comm").read_text().strip() == _writer.THREAD_NAME:
                    out.add(t.name)
            except OSError:  # the thread ended meanwhile
                pass
        return out

    before = named()
    w = _writer.Writer(0, _lane.SMALL_MAX)
    try:
        (tid,) = named() - before
    finally:
        w.close()
    deadline = time.monotonic() + 5  # a joined thread leaves /proc a moment later
    while tid in named() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tid not in named()


def test_writer_reports_write_and_fdatasync_results(tmp_path: Path) -> None:
    assert _lane.Writer is not None
    w = _lane.Writer(0, _lane.SMALL_MAX)
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    null = os.open("/dev/null", os.O_WRONLY)
    r, wp = os.pipe()
    try:
        w.submit_records(fd, [b"hello"], 0, True)
        w.submit_records(fd, [b"world"], 9, False)
        w.submit_records(null, [b"x" * 10], 0, True)  # /dev/null cannot be fdatasynced: EINVAL
        w.submit_records(wp, [b"y"], 0, False)  # a pipe has no offsets: ESPIPE
        got: list[tuple[int, int, int]] = []
        while len(got) < 4:
            got += w.reap()
        assert got == [(9, 0, 0), (9, 0, 0), (14, 0, errno.EINVAL), (0, errno.ESPIPE, 0)]
        assert records(path.read_bytes()) == [b"hello", b"world"]
        assert w.inflight() == 0
        # More payloads than one pwritev takes (IOV_MAX 1024), empty ones included.
        payloads = [b"r%d" % i * (i % 5) for i in range(3000)]
        total = w.submit_records(fd, payloads, 18, True)
        assert total == sum(4 + len(p) for p in payloads)
        while not (done := w.reap()):
            pass
        assert done == [(total, 0, 0)]
        assert records(path.read_bytes()) == [b"hello", b"world", *payloads]
        bad_batches: list[list[Any]] = [[], ["text"], [b"ok", bytearray(b"no")]]
        for bad in bad_batches:
            with pytest.raises((TypeError, ValueError)):
                w.submit_records(fd, bad, 0, False)
        assert w.inflight() == 0
    finally:
        w.close()
        for f in (fd, null, r, wp):
            os.close(f)
    with pytest.raises(RuntimeError):
        w.submit_records(0, [b""], 0, False)


def _count_lane(monkeypatch: pytest.MonkeyPatch, inline: list[int] | None = None) -> list[int]:
    """Batch sizes sent to the writer thread; with ``inline``, batch sizes written on the
    loop's thread go there (else into the same list). A loaded machine may preempt an
    inline write past the stall limit: the limit is raised so that counts are exact."""
    from aiodiskqueue._core import inline as _inline
    monkeypatch.setattr(_inline, "INLINE_STALL", 3600.0)
    sizes: list[int] = []
    inline_sizes = sizes if inline is None else inline
    submit = _lane.WriteLane.submit
    write_polled = _lane.WriteLane.write_polled
    write_now = _lane.WriteLane.write_now

    def counting(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int,
                 sync: bool) -> Any:
        sizes.append(len(payloads))
        return submit(lane, fd, payloads, offset, sync)

    def counting_polled(lane: _lane.WriteLane, fd: int, payloads: list[bytes],
                        offset: int) -> Any:
        sizes.append(len(payloads))
        return write_polled(lane, fd, payloads, offset)

    def counting_now(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int) -> Any:
        inline_sizes.append(len(payloads))
        return write_now(lane, fd, payloads, offset)

    monkeypatch.setattr(_lane.WriteLane, "submit", counting)
    monkeypatch.setattr(_lane.WriteLane, "write_polled", counting_polled)
    monkeypatch.setattr(_lane.WriteLane, "write_now", counting_now)
    return sizes


async def test_concurrent_puts_go_through_the_lane_exactly(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _count_lane(monkeypatch)
    q = await make_queue(max_bytes_per_file=50_000)

    async def producer(p: int) -> None:
        for i in range(300):
            await q.put(b"p%02d-%04d-" % (p, i) + bytes([p]) * (i % 97))

    await asyncio.gather(*(producer(p) for p in range(16)))
    await q.sync()
    assert len(sizes) > 10  # most batches went to the lane ...
    stored = read_queue(tmp_path, "q")
    assert len(stored) == 16 * 300  # ... and the files hold every record, nothing else
    for p in range(16):
        mine = [m for m in stored if m.startswith(b"p%02d-" % p)]
        assert mine == [b"p%02d-%04d-" % (p, i) + bytes([p]) * (i % 97) for i in range(300)]
    assert len(list((tmp_path).glob("q.diskqueue.*.dat"))) > 2  # rolled several times
    got = [await q.get() for _ in range(16 * 300)]
    assert got == stored


async def test_a_caught_up_reader_is_handed_lane_writes(make_queue: MakeQueue,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _count_lane(monkeypatch)
    q = await make_queue()
    reads: list[int] = []
    from aiodiskqueue._core import store as _store
    real_read = _store.SegmentStore.read

    def read(self: Any, *a: Any) -> Any:
        reads.append(1)
        return real_read(self, *a)

    monkeypatch.setattr(_store.SegmentStore, "read", read)

    async def consume() -> list[bytes]:
        return [await q.get() for _ in range(500)]

    consumer = asyncio.create_task(consume())
    for i in range(500):
        await q.put(b"m%d" % i)
    assert await consumer == [b"m%d" % i for i in range(500)]
    assert len(sizes) >= 100
    assert len(reads) < 10  # handed over from the batches, not read back from disk


async def test_durable_lane_puts_are_fdatasynced_before_they_return(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[bool] = []
    submit = _lane.WriteLane.submit

    def recording(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int,
                  sync: bool) -> Any:
        syncs.append(sync)
        return submit(lane, fd, payloads, offset, sync)

    monkeypatch.setattr(_lane.WriteLane, "submit", recording)
    q = await make_queue(sync_every=1)
    await q.put(b"first")  # creates the segment: directory fsync on the I/O thread
    await asyncio.gather(*(q.put(b"m%d" % i) for i in range(200)))
    assert syncs and all(syncs)


_CHILD = textwrap.dedent("""
    import asyncio, json, os, resource, signal, sys
    sys.path.insert(0, sys.argv[1])
    from aiodiskqueue import DiskQueue, DiskQueueError
    from aiodiskqueue._core import lane as _lane

    async def main(directory, sync_every):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of dying
        out = {"lane": _lane.available(), "ok": [], "failed": [], "errnos": []}
        async with DiskQueue(directory, "q", sync_every=sync_every) as q:
            await q.put_many([b"before-%d" % i for i in range(10)])
            await q.sync()
            size = os.path.getsize(os.path.join(directory, "q.diskqueue.000000.dat"))
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1500, hard))

            async def put(i):
                m = b"during-%02d-" % i + b"x" * 1000
                try:
                    await q.put(m)
                    out["ok"].append(m.decode()[:9])
                except DiskQueueError as exc:
                    out["failed"].append(i)
                    out["errnos"].append(getattr(exc.__cause__, "errno", None))

            await asyncio.gather(*(put(i) for i in range(16)))
            out["qsize_full"] = q.qsize()
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            await q.put(b"after")
            out["qsize"] = q.qsize()
        print(json.dumps(out))

    asyncio.run(main(sys.argv[2], int(sys.argv[3])))
""")


@pytest.mark.parametrize("sync_every", [2500, 1])
@pytest.mark.parametrize("path", ["native", "pure"])
def test_a_short_write_fails_its_batch_and_leaves_no_bytes_behind(
        tmp_path: Path, path: str, sync_every: int) -> None:
    env = dict(os.environ)
    env.pop("AIODISKQUEUE_PURE_PYTHON", None)
    if path == "pure":
        env["AIODISKQUEUE_PURE_PYTHON"] = "1"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), str(tmp_path), str(sync_every)],
                          check=False, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["lane"] is (path == "native")
    assert out["failed"], out  # the limit leaves room for one 1 KiB record at most
    assert set(out["errnos"]) == {errno.EFBIG}
    assert len(out["ok"]) + len(out["failed"]) == 16
    assert len(out["ok"]) <= 1
    stored = read_queue(tmp_path, "q")
    before = [b"before-%d" % i for i in range(10)]
    during = [m for m in stored if m.startswith(b"during-")]
    assert stored == before + during + [b"after"]
    assert len(during) == len(out["ok"])
    assert out["qsize_full"] == 10 + len(out["ok"])
    assert out["qsize"] == out["qsize_full"] + 1
    # No torn record or stray bytes: the segment is exactly the records it holds.
    data = (tmp_path / seg_name("q", 0)).read_bytes()
    assert records(data) == stored


async def test_reopened_queue_after_lane_writes_has_everything(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=10_000) as q:
        await asyncio.gather(*(q.put(b"%05d" % i) for i in range(3000)))
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=10_000) as q:
        assert q.qsize() == 3000
        got = sorted([await q.get() for _ in range(3000)])
        assert got == [b"%05d" % i for i in range(3000)]


@pytest.mark.parametrize("method", ["submit", "write_polled", "write_now"])
async def test_an_unexpected_lane_error_breaks_the_queue_instead_of_hanging_puts(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    from aiodiskqueue import DiskQueueError
    q = await make_queue(inline_writes=(method == "write_now"))
    await q.put(b"ok")

    def broken(*args: Any) -> Any:
        raise RuntimeError("writer ring is full")

    monkeypatch.setattr(_lane.WriteLane, method, broken)
    # Four puts land in one batch: small, it is written from the loop (inline, or polled
    # for on the writer thread); large, by the writer thread.
    size = 60_000 if method == "submit" else 10
    results = await asyncio.wait_for(
        asyncio.gather(*(q.put(b"%d" % i * size) for i in range(4)), return_exceptions=True), 5)
    assert all(isinstance(r, DiskQueueError) for r in results), results
    assert "broken" in str(results[0])


async def test_busy_producers_do_not_starve_sync_rounds_or_a_consumer(
        make_queue: MakeQueue) -> None:
    # Chained lane writes must give way to the hops that sync and read ahead.
    q = await make_queue(sync_every=100, read_buffer_bytes=16 * 1024)
    before = q.statistics().syncs
    got: list[bytes] = []
    done = False

    async def producer(p: int) -> None:
        for i in range(500):
            await q.put(b"%02d-%04d-" % (p, i) + b"x" * 200)

    async def consumer() -> None:
        while not done or q.qsize():
            try:
                got.append(await asyncio.wait_for(q.get(), 0.2))
            except TimeoutError:
                continue

    reader = asyncio.create_task(consumer())
    await asyncio.gather(*(producer(p) for p in range(16)))
    taken_while_producing = len(got)
    syncs = q.statistics().syncs - before
    done = True
    await reader
    assert len(got) == 16 * 500
    # 8,000 puts plus the gets, one round per 100: far more than a handful.
    assert syncs >= 8000 // 100 // 2, syncs
    assert taken_while_producing >= 8000 // 20, taken_while_producing


async def test_spin_us_0_still_writes_through_the_lane(make_queue: MakeQueue,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _count_lane(monkeypatch)
    q = await make_queue(spin_us=0)  # the writer sleeps between batches
    await asyncio.gather(*(q.put(b"%03d" % i) for i in range(300)))
    for i in range(300):
        await q.put(b"s%03d" % i)
    assert sizes
    got = [await q.get() for _ in range(600)]
    assert sorted(got[:300]) == [b"%03d" % i for i in range(300)]
    assert got[300:] == [b"s%03d" % i for i in range(300)]


async def test_a_single_awaiting_producer_writes_inline_each_put_on_disk_when_it_returns(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    q = await make_queue(inline_writes=True, sync_interval=3600.0)
    path = tmp_path / seg_name("q", 0)
    await q.put(b"first")  # creates the segment, on the I/O thread
    del inline[:], sizes[:]
    for i in range(200):
        await q.put(b"m%03d" % i)
        assert records(path.read_bytes())[-1] == b"m%03d" % i  # written when put() returns
    assert sum(inline) == 200 and sizes == []  # no batch went to the writer thread
    assert [await q.get() for _ in range(201)] == [b"first"] + [b"m%03d" % i for i in range(200)]


async def test_concurrent_small_puts_share_one_inline_write(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    q = await make_queue(inline_writes=True)
    await q.put(b"first")  # creates the segment, on the I/O thread
    del inline[:], sizes[:]
    await asyncio.gather(*(q.put(b"%02d" % i) for i in range(16)))
    assert inline == [16] and sizes == []


async def test_a_batch_above_the_inline_limit_goes_to_the_writer_thread(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import inline as _inline
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    q = await make_queue(inline_writes=True)
    await q.put(b"first")  # creates the segment, on the I/O thread
    del inline[:], sizes[:]
    big = [b"%d" % i * (_inline.INLINE_MAX // 4) for i in range(5)]
    await q.put_many(big)
    assert sizes == [5] and inline == []
    assert [await q.get() for _ in range(6)] == [b"first", *big]


async def test_a_slow_inline_write_sends_the_next_batches_to_the_writer_thread(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import inline as _inline
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    counting_now = _lane.WriteLane.write_now

    def slow(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int) -> Any:
        import time
        time.sleep(0.004)  # as if the kernel throttled the write
        return counting_now(lane, fd, payloads, offset)

    monkeypatch.setattr(_lane.WriteLane, "write_now", slow)
    monkeypatch.setattr(_inline, "INLINE_STALL", 0.002)
    monkeypatch.setattr(_inline, "INLINE_BACKOFF", 3600.0)
    q = await make_queue(inline_writes=True, sync_interval=3600.0)
    await q.put(b"first")  # creates the segment, on the I/O thread
    for i in range(20):
        await q.put(b"m%02d" % i)
    assert inline == [1] * _inline.INLINE_SLOW and sum(sizes) == 20 - _inline.INLINE_SLOW
    assert [await q.get() for _ in range(21)] == [b"first"] + [b"m%02d" % i for i in range(20)]


async def test_inline_writes_alone_still_get_the_periodic_sync(make_queue: MakeQueue,
                                                                tmp_path: Path) -> None:
    from helpers_format import read_meta
    q = await make_queue(inline_writes=True, sync_interval=0.05)
    await q.put(b"one")  # creates the segment and stores the first meta, on the I/O thread
    await asyncio.sleep(0.2)  # the ioLoop sleeps, no sync pending
    assert read_meta(tmp_path, "q").depth == 1
    await q.put(b"two")  # written inline: nothing else wakes the ioLoop
    for _ in range(100):
        if read_meta(tmp_path, "q").depth == 2:
            break
        await asyncio.sleep(0.02)
    meta, st = read_meta(tmp_path, "q"), q.statistics()
    assert (meta.depth, meta.write_file, meta.write_pos) == (2, st.write_file_num, st.write_pos)


class _HeldSync:
    """Hold the store's sync (fdatasync and meta) of the I/O thread until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        from aiodiskqueue._core import store as _store
        self.release = threading.Event()
        self.started = threading.Event()
        real = _store.SegmentStore.sync

        def sync(store: Any, meta: Any) -> None:
            self.started.set()
            self.release.wait(10)
            real(store, meta)

        monkeypatch.setattr(_store.SegmentStore, "sync", sync)


@pytest.mark.parametrize("mode", ["inline", "polled", "poll gives up"])
async def test_producers_do_not_wait_for_the_sync_round(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        mode: str) -> None:
    outcomes: list[int] = []
    if mode == "poll gives up":  # every poll gives up: each write completes through the eventfd
        from test_engine_polled import _polls
        outcomes = _polls(monkeypatch, 1, give_up=True)
    q = await make_queue(inline_writes=mode == "inline", sync_every=20, sync_interval=3600.0)
    await q.put(b"first")  # creates the segment and stores the first meta
    held = _HeldSync(monkeypatch)
    before = q.statistics().syncs
    # At 10 puts (half of sync_every) a sync round starts on the I/O thread, held there;
    # 9 more puts are written beside it (inline, or polled on the writer thread), each
    # on disk when its put() returns ...
    for i in range(19):
        await asyncio.wait_for(q.put(b"m%02d" % i), 5)
        assert records((tmp_path / seg_name("q", 0)).read_bytes())[-1] == b"m%02d" % i
    assert await asyncio.to_thread(held.started.wait, 5)  # the round did start ...
    assert q.statistics().syncs == before  # ... and is still held
    # ... but no more: the next one would leave sync_every messages not fsynced.
    last = asyncio.create_task(q.put(b"m19"))
    await asyncio.sleep(0.2)
    assert not last.done()
    held.release.set()
    await asyncio.wait_for(last, 5)
    await q.sync()
    assert q.statistics().syncs > before
    assert [await q.get() for _ in range(21)] == [b"first"] + [b"m%02d" % i for i in range(20)]
    # (after POLL_MISSES misses in a row the lane stops polling for a while)
    assert (bool(outcomes) and set(outcomes) == {0}) == (mode == "poll gives up")


@pytest.mark.parametrize("inline_writes", [True, False], ids=["inline", "polled"])
async def test_a_sync_round_beside_inline_writes_stores_a_consistent_meta(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        inline_writes: bool) -> None:
    from helpers_format import read_meta
    q = await make_queue(inline_writes=inline_writes, sync_every=10, sync_interval=3600.0)
    await q.put(b"first")
    await q.get()  # the read position moves: the next sync round stores a meta
    held = _HeldSync(monkeypatch)

    def release_soon() -> None:
        # The round starts at half of sync_every and is held; the puts after it run
        # beside it until sync_every is reached, where a put must wait for the round.
        held.started.wait(10)
        time.sleep(0.3)
        held.release.set()

    releaser = asyncio.create_task(asyncio.to_thread(release_soon))
    for i in range(15):
        await q.put(b"m%02d" % i)
    await releaser
    for _ in range(250):
        if q.statistics().syncs and read_meta(tmp_path, "q").read_pos > 0:
            break
        await asyncio.sleep(0.02)
    meta = read_meta(tmp_path, "q")
    data = (tmp_path / seg_name("q", 0)).read_bytes()
    # The meta stored is one snapshot: its depth is exactly the records between its
    # read and write positions, though more records were written while it was stored.
    assert meta.read_pos == 4 + len(b"first")
    assert len(records(data[meta.read_pos:meta.write_pos])) == meta.depth
    assert meta.write_pos < len(data)
    assert q.qsize() == 15


async def test_by_default_the_event_loop_never_writes(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    # inline_writes is off by default: every append goes to the writer thread (or, without
    # the native writer, to the I/O thread), never to a pwritev on the loop's own thread.
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    q = await make_queue()
    await q.put(b"first")
    del inline[:], sizes[:]
    for i in range(50):
        await q.put(b"m%02d" % i)
    assert inline == []
    assert sum(sizes) == (50 if q.statistics().write_path == "native" else 0)
    assert [await q.get() for _ in range(51)] == [b"first"] + [b"m%02d" % i for i in range(50)]


async def _lone_producer(q: DiskQueue, path: Path, n: int) -> list[int]:
    """Put ``n`` messages one by one, each on disk when its put() returns; return, for
    each put, how many times a ticker task on the same loop had run before it."""
    ticks = 0
    seen: list[int] = []

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    t = asyncio.create_task(ticker())
    try:
        for i in range(n):
            seen.append(ticks)
            await q.put(b"m%03d" % i)
            assert records(path.read_bytes())[-1] == b"m%03d" % i  # on disk when put returns
    finally:
        t.cancel()
    return seen


@pytest.mark.parametrize("inline_writes", [True, False], ids=["inline", "polled"])
async def test_a_lone_producer_yields_to_the_other_tasks_every_few_puts(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        inline_writes: bool) -> None:
    from aiodiskqueue._core import inline as _inline
    _count_lane(monkeypatch)
    q = await make_queue(inline_writes=inline_writes, sync_interval=3600.0)
    await q.put(b"first")  # creates the segment, on the I/O thread
    seen = await _lone_producer(q, tmp_path / seg_name("q", 0), 300)
    # Puts written from put() itself go on without suspending, but never more than
    # DIRECT_RUN in a row: then one takes the usual way and the ticker gets its turn.
    longest = max(seen.count(t) for t in set(seen))
    assert longest <= _inline.DIRECT_RUN + 1, longest
    assert [await q.get() for _ in range(301)] == [b"first"] + [b"m%03d" % i for i in range(300)]


async def test_a_lone_producer_s_puts_are_written_without_suspending(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import inline as _inline
    inline: list[int] = []
    sizes = _count_lane(monkeypatch, inline)
    q = await make_queue(inline_writes=True, sync_interval=3600.0)
    await q.put(b"first")
    del inline[:], sizes[:]
    seen = await _lone_producer(q, tmp_path / seg_name("q", 0), 330)
    # One put in DIRECT_RUN + 1 suspends (the first, and each that ends a run); the
    # others finish in put() itself: the ticker had its turns about 10 times, not 330.
    suspended = len(set(seen)) - 1
    assert suspended <= 330 // (_inline.DIRECT_RUN + 1), suspended
    assert inline == [1] * 330 and sizes == []
    assert q.statistics().puts == 331 and q.qsize() == 331


async def test_producers_that_put_at_the_same_time_still_share_writes(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import inline as _inline
    inline: list[int] = []
    _count_lane(monkeypatch, inline)
    q = await make_queue(inline_writes=True, sync_interval=3600.0)
    await q.put(b"first")
    for i in range(10):  # alone: its puts are written from put() itself
        await q.put(b"alone%d" % i)
    del inline[:]

    async def producer(p: int) -> None:
        for i in range(20):
            await q.put(b"%02d-%02d" % (p, i))

    await asyncio.gather(*(producer(p) for p in range(16)))
    # The lone producer's run may still write a few puts one by one; after that, the
    # puts of one loop iteration share a write again.
    assert sum(inline) == 320
    assert len(inline) <= _inline.DIRECT_RUN + 320 // 8, inline
    got = [await q.get() for _ in range(331)][11:]
    for p in range(16):
        assert [m for m in got if m.startswith(b"%02d-" % p)] == [b"%02d-%02d" % (p, i)
                                                                  for i in range(20)]


@pytest.mark.parametrize("inline_writes", [True, False], ids=["inline", "polled"])
async def test_a_failed_write_of_a_lone_producer_fails_its_put_and_keeps_the_rest(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        inline_writes: bool) -> None:
    from aiodiskqueue import DiskQueueError
    _count_lane(monkeypatch)  # a slow write on a busy machine must not turn inline writes off
    q = await make_queue(inline_writes=inline_writes, sync_interval=3600.0)
    for i in range(5):
        await q.put(b"ok%d" % i)
    assert q._e._direct_left > 0  # the next put is written from put() itself
    # The disk fills up under the next write: the writer reports ENOSPC for it (written
    # by the loop, or polled for and done within the poll).
    method = "write_now" if inline_writes else "write_polled"
    real = getattr(_lane.WriteLane, method)
    failed: list[list[bytes]] = []

    def full(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int) -> Any:
        failed.append(payloads)
        return (0, errno.ENOSPC, 0)

    monkeypatch.setattr(_lane.WriteLane, method, full)
    with pytest.raises(DiskQueueError) as ei:
        await asyncio.wait_for(q.put(b"lost"), 5)
    cause = ei.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, ei.value
    assert failed == [[b"lost"]]  # written from put() itself, alone
    monkeypatch.setattr(_lane.WriteLane, method, real)
    for i in range(5):
        await q.put(b"more%d" % i)
    want = [b"ok%d" % i for i in range(5)] + [b"more%d" % i for i in range(5)]
    assert [await q.get() for _ in range(10)] == want
    assert records((tmp_path / seg_name("q", 0)).read_bytes()) == want


@pytest.mark.parametrize("inline_writes", [True, False], ids=["inline", "polled"])
@pytest.mark.parametrize("case", ["read-ahead full", "larger than the read-ahead"])
async def test_a_waiting_consumer_gets_what_a_loop_write_left_on_disk(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch, inline_writes: bool,
        case: str) -> None:
    # A write from the loop hands its records to a caught-up consumer when they fit the
    # read-ahead; when they do not, they stay on disk, and the consumer must get them by a
    # read then, not when the periodic sync timer (an hour here) next wakes the ioLoop.
    _count_lane(monkeypatch)
    q = await make_queue(inline_writes=inline_writes, read_buffer_bytes=4096,
                         sync_interval=3600.0)
    await q.put(b"first")
    assert await q.get() == b"first"
    if case == "read-ahead full":
        sent = [bytes([65 + i]) * 1000 for i in range(10)]
        for m in sent:  # the first four fill the read-ahead; the rest stay on disk
            await q.put(m)
        got = [await asyncio.wait_for(q.get(), 5) for _ in range(10)]
    else:
        sent = [b"x" * 5000]
        getter = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)  # the consumer waits, caught up
        await q.put(sent[0])
        got = [await asyncio.wait_for(getter, 5)]
    assert got == sent


async def test_a_purge_drops_a_loop_write_that_outlasted_its_poll(
        make_queue: MakeQueue) -> None:
    # spin_us=0: the loop never polls, so the write of a put is still in flight when the
    # purge is asked for. The put was accepted before the purge: no consumer may get it.
    q = await make_queue(spin_us=0)
    for i in range(3):
        await q.put(b"old%d" % i)
    assert [await q.get() for _ in range(3)] == [b"old%d" % i for i in range(3)]
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)  # the consumer is caught up and waits
    put = asyncio.create_task(q.put(b"before-purge"))
    await asyncio.sleep(0)  # the put runs: its write is sent and not yet done
    assert any(f.lane is not None and f.lane.from_loop for f in q._e.flights)
    await q.purge()
    await put
    await q.put(b"after-purge")
    assert await asyncio.wait_for(getter, 5) == b"after-purge"
    assert q.qsize() == 0


@pytest.mark.parametrize("inline_writes", [True, False], ids=["inline", "polled"])
async def test_writes_beside_a_sync_round_never_leave_more_than_sync_every_unsynced(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        inline_writes: bool) -> None:
    # 7 producers put together: batches of 7. The second batch takes since_sync to 14,
    # past half of sync_every (16), and the round that then starts covers 14 messages;
    # beside it, only one more may be written, so a third batch of 7 must wait for it.
    _count_lane(monkeypatch)
    q = await make_queue(inline_writes=inline_writes, sync_every=16, sync_interval=3600.0)
    await q.put(b"first")
    await q.sync()  # everything so far is fsynced
    held = _HeldSync(monkeypatch)

    async def producer(p: int) -> None:
        for i in range(6):
            await q.put(b"%d-%d" % (p, i))

    producers = asyncio.gather(*(producer(p) for p in range(7)))
    assert await asyncio.to_thread(held.started.wait, 5)  # the round started, held
    await asyncio.sleep(0.3)  # whatever may be written beside it is written by now
    unsynced = len(records((tmp_path / seg_name("q", 0)).read_bytes())) - 1
    assert 14 <= unsynced < 16, unsynced
    held.release.set()
    await asyncio.wait_for(producers, 10)
    got = [await q.get() for _ in range(43)]
    assert got[0] == b"first"
    for p in range(7):
        assert [m for m in got if m.startswith(b"%d-" % p)] == [b"%d-%d" % (p, i)
                                                              for i in range(6)]


async def test_a_lone_producer_s_write_that_outlasts_its_poll_returns_once_written(
        make_queue: MakeQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spin_us=0: the loop never polls, so each write a lone producer's put() sends itself
    # is still running when put() looks: the ioLoop applies it, and only then may the put
    # return, with its record on disk. sync_every=8 puts rounds beside these writes.
    from aiodiskqueue._core.engine import Engine
    outlasted: list[bool] = []
    from aiodiskqueue._core.inline import write_one as real

    def watching(e: Any, data: bytes, size: int, waiter: asyncio.Future[None]) -> bool:
        sent = real(e, data, size, waiter)
        if sent:
            outlasted.append(not waiter.done())
        return sent

    monkeypatch.setattr(Engine, "write_one", watching)
    q = await make_queue(spin_us=0, sync_every=8, sync_interval=0.01)
    path = tmp_path / seg_name("q", 0)
    for i in range(300):
        await asyncio.wait_for(q.put(b"m%03d" % i), 5)
        assert records(path.read_bytes())[-1] == b"m%03d" % i
    assert len(outlasted) >= 100 and all(outlasted), (len(outlasted), outlasted.count(False))
    st = q.statistics()
    assert (q.qsize(), st.puts, st.pending_writes) == (300, 300, 0)
    assert [await q.get() for _ in range(300)] == [b"m%03d" % i for i in range(300)]
