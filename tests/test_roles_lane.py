"""A producer role's appends through the native write lane: the role record is published
by the writer thread after the batch's records, before ``put()`` returns, and a batch
that fails is neither published nor left in the segment."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers_format import records, seg_name

from aiodiskqueue import DiskQueue, DiskQueueError
from aiodiskqueue._core import lane as _lane
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.roles import read_record_at


@pytest.fixture(autouse=True)
def _native(monkeypatch: pytest.MonkeyPatch) -> None:
    # About the lane: run with it even in the pure-Python pass.
    monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)


def _published(tmp_path: Path) -> tuple[tuple[int, int], int]:
    rec = read_record_at(Layout(str(tmp_path), "q").role_path("producer"))
    assert rec is not None
    return rec.at, rec.seq


def _count_polled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each lane write that publishes a role record: its number of payloads."""
    calls: list[int] = []
    orig = _lane.WriteLane.write_polled

    def polled(self: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int,
               pub_fd: int = -1, pub: bytes = b"") -> Any:
        if pub_fd >= 0:
            calls.append(len(payloads))
        return orig(self, fd, payloads, offset, pub_fd, pub)

    monkeypatch.setattr(_lane.WriteLane, "write_polled", polled)
    return calls


def test_the_writer_publishes_after_the_records(tmp_path: Path) -> None:
    assert _lane.Writer is not None
    w = _lane.Writer(0, _lane.SMALL_MAX)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT)
    pfd = os.open(tmp_path / "pub", os.O_RDWR | os.O_CREAT)
    null = os.open("/dev/null", os.O_WRONLY)
    try:
        assert w.write_polled(fd, [b"ab", b"c"], 0, 10**9, pfd, b"P" * 84) == (11, 0, 0)
        assert (tmp_path / "pub").read_bytes() == b"P" * 84
        # A failed record write publishes nothing.
        w.submit_records(null, [b"x"], 0, True, pfd, b"Q" * 84)  # fdatasync: EINVAL
        r, wp = os.pipe()
        try:
            w.submit_records(wp, [b"y"], 0, False, pfd, b"R" * 84)  # pwritev: ESPIPE
            # Records written, the publish fails: a write errno with every byte written.
            w.submit_records(fd, [b"z"], 11, False, r, b"S" * 84)
            got: list[tuple[int, int, int]] = []
            while len(got) < 3:
                got += w.reap()
        finally:
            os.close(r)
            os.close(wp)
        assert got == [(5, 0, errno.EINVAL), (0, errno.ESPIPE, 0), (5, errno.ESPIPE, 0)]
        assert (tmp_path / "pub").read_bytes() == b"P" * 84
        assert records((tmp_path / "seg").read_bytes()) == [b"ab", b"c", b"z"]
        for bad in (b"", b"T" * 129):
            with pytest.raises(ValueError, match="published record needs 1 to 128 bytes"):
                w.submit_records(fd, [b"x"], 0, False, pfd, bad)
        assert w.inflight() == 0
    finally:
        w.close()
        for f in (fd, pfd, null):
            os.close(f)


async def test_each_put_is_published_when_it_returns(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_polled(monkeypatch)
    async with DiskQueue(tmp_path, "q", role="producer") as p:
        await p.put(b"first")  # opens the segment (I/O thread)
        for i in range(50):
            await p.put(b"m%d" % i)
            at, seq = _published(tmp_path)
            size = os.path.getsize(tmp_path / seg_name("q", 0))
            assert at == (0, size) and seq == i + 2
        tasks = [asyncio.ensure_future(p.put(b"t%d" % i)) for i in range(20)]
        await asyncio.gather(*tasks)
        assert _published(tmp_path)[1] == 71
        await p.put_many([b"b%d" % i for i in range(30)])
        assert _published(tmp_path)[1] == 101
    assert sum(calls) >= 90  # all but the first and the periodic rounds went to the lane
    async with DiskQueue(tmp_path, "q", role="consumer") as c:
        got = [await c.get() for _ in range(101)]
    assert got == ([b"first"] + [b"m%d" % i for i in range(50)]
                   + [b"t%d" % i for i in range(20)] + [b"b%d" % i for i in range(30)])


@pytest.mark.parametrize("written", ["nothing", "records"])
async def test_a_failed_lane_batch_is_not_published_and_is_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str) -> None:
    orig = _lane.WriteLane.write_polled
    fail = [False]

    def polled(self: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int,
               pub_fd: int = -1, pub: bytes = b"") -> Any:
        if not fail[0]:
            return orig(self, fd, payloads, offset, pub_fd, pub)
        fail[0] = False
        if written == "nothing":
            return (0, errno.ENOSPC, 0)
        # The records are written, the role record is not (its write "failed").
        res = orig(self, fd, payloads, offset)
        if not isinstance(res, tuple):
            raise AssertionError("the test's write outlasted the poll")
        return (res[0], errno.EIO, 0)

    monkeypatch.setattr(_lane.WriteLane, "write_polled", polled)
    seg = tmp_path / seg_name("q", 0)
    async with DiskQueue(tmp_path, "q", role="producer") as p, \
            DiskQueue(tmp_path, "q", role="consumer") as c:
        await p.put(b"a")
        await p.put(b"b")
        before = _published(tmp_path)
        fail[0] = True
        with pytest.raises(DiskQueueError, match="write to queue 'q' failed"):
            await p.put(b"lost")
        assert _published(tmp_path) == before  # never visible to the consumer
        assert await asyncio.wait_for(c.get(), 10) == b"a"
        assert await asyncio.wait_for(c.get(), 10) == b"b"
        await p.put(b"c")  # through the I/O thread, which first cuts the failed batch off
        assert records(seg.read_bytes()) == [b"a", b"b", b"c"]
        assert await asyncio.wait_for(c.get(), 10) == b"c"
        await p.put(b"d")  # the lane again
        assert await asyncio.wait_for(c.get(), 10) == b"d"
        assert c.empty()
    assert records(seg.read_bytes()) == [b"a", b"b", b"c", b"d"]


async def test_a_lane_write_that_outlasts_the_poll_is_applied_by_the_ioloop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Poll for no time at all: every lane write is a job in flight the ioLoop awaits.
    monkeypatch.setattr(_lane, "POLL_WAIT_NS", 0)
    async with DiskQueue(tmp_path, "q", role="producer") as p, \
            DiskQueue(tmp_path, "q", role="consumer") as c:
        for i in range(30):
            await p.put(b"%d" % i)
            assert _published(tmp_path)[1] == i + 1
        await asyncio.gather(*(p.put(b"x%d" % i) for i in range(10)))
        got = [await asyncio.wait_for(c.get(), 10) for _ in range(40)]
        assert got[:30] == [b"%d" % i for i in range(30)]
        assert sorted(got[30:]) == sorted(b"x%d" % i for i in range(10))


async def test_lane_batches_stop_at_the_segment_end(tmp_path: Path) -> None:
    # 10 records of 100 + 4 bytes per segment; each batch that would cross it rolls on
    # the I/O thread; every one before it went through the lane.
    opts: dict[str, Any] = {"max_bytes_per_file": 1040}
    async with DiskQueue(tmp_path, "q", role="producer", **opts) as p, \
            DiskQueue(tmp_path, "q", role="consumer", **opts) as c:
        for i in range(45):
            await p.put(b"%03d" % i + b"." * 97)
        got = [await asyncio.wait_for(c.get(), 10) for _ in range(45)]
    assert [g[:3] for g in got] == [b"%03d" % i for i in range(45)]
    lay = Layout(str(tmp_path), "q")
    assert sorted(lay.segments()) == [4]  # the consumer deleted the ones it read past


_IDLE_PRODUCER = """
import asyncio, resource, sys
from aiodiskqueue import DiskQueue

async def main(directory):
    async with DiskQueue(directory, "q", "producer") as p:
        for i in range(2000):
            await p.put(b"x" * 100)
        await asyncio.sleep(0.5)  # the writer thread's spin and the first timer settle
        before = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(3)
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"IDLE {used:.6f}", flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def test_an_idle_producer_costs_next_to_nothing(tmp_path: Path) -> None:
    # A process of its own, so that only its own threads count. It has a live consumer
    # beside it (this process), whose stores it hears by inotify, not by looking.
    async with DiskQueue(tmp_path, "q"):
        pass
    async with DiskQueue(tmp_path, "q", role="consumer") as c:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _IDLE_PRODUCER, str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        got = [await asyncio.wait_for(c.get(), 30) for _ in range(2000)]
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert len(got) == 2000
    used = float(out.decode().split()[1])
    # Measured here: about 0.01 s in 3 s (the periodic meta store, the consumer's stores).
    # The bound is generous for a shared, noisy machine; a writer thread that kept
    # spinning, or a loop that looked at the roles file every millisecond, costs far more.
    assert used < 0.1, f"{used:.3f} s of CPU in 3 s idle"
