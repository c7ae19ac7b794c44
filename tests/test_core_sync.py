"""The sync policy: what a returned put() guarantees, group commit, count and timer syncs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import meta_name, records, seg_name

from aiodiskqueue._core import lane as _lane


async def test_default_put_is_in_the_os_when_it_returns(make_queue: MakeQueue,
                                                        tmp_path: Path) -> None:
    q = await make_queue(sync_interval=3600.0)  # no timer sync during the test
    msgs = [b"p%d" % i for i in range(50)]
    for i, m in enumerate(msgs):
        await q.put(m)
        # Visible to another reader of the file at once, without any sync().
        assert records((tmp_path / seg_name("q", 0)).read_bytes()) == msgs[: i + 1]


@pytest.fixture(params=["native", "pure"])
def write_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the native write lane (where built) and with the I/O thread only."""
    if request.param == "native":
        monkeypatch.delenv("AIODISKQUEUE_PURE_PYTHON", raising=False)
        if not _lane.available():
            pytest.fail("the native write lane is not built")
    else:
        monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "1")
    return str(request.param)


class _IOLog:
    """Record the store's pwrite and fdatasync/fsync calls, and the write lane's batches,
    inline ones too (a batch sent with ``sync`` counts as synced once the lane reports it
    done), in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []
        self.pwrite = os.pwrite
        self.fdatasync = os.fdatasync
        self.fsync = os.fsync

    def install(self, mp: pytest.MonkeyPatch) -> None:
        def pwrite(fd: int, data: Any, offset: int) -> int:
            self.events.append(("write", bytes(data)))
            return self.pwrite(fd, data, offset)

        def fdatasync(fd: int) -> None:
            self.fdatasync(fd)
            self.events.append(("sync", b""))

        def fsync(fd: int) -> None:
            self.fsync(fd)
            self.events.append(("sync", b""))

        mp.setattr("aiodiskqueue._core.store.os.pwrite", pwrite)
        mp.setattr("aiodiskqueue._core.store.os.fdatasync", fdatasync)
        mp.setattr("aiodiskqueue._core.store.os.fsync", fsync)
        submit = _lane.WriteLane.submit

        def lane_submit(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int,
                        sync: bool) -> Any:
            self.events.append(("write", b"".join(payloads)))
            fut = submit(lane, fd, payloads, offset, sync)
            if sync:
                # Registered before anyone awaits the future, so it runs first.
                fut.add_done_callback(
                    lambda f: self.events.append(("sync", b"")) if f.result()[2] == 0 else None)
            return fut

        mp.setattr(_lane.WriteLane, "submit", lane_submit)
        # The writes from the loop: on its own thread, or polled for on the writer's.
        for name in ("write_now", "write_polled"):
            mp.setattr(_lane.WriteLane, name, self._recording(getattr(_lane.WriteLane, name)))

    def _recording(self, write: Any) -> Any:
        """``write`` (a WriteLane method without a sync) that records its batch first."""
        def recorded(lane: _lane.WriteLane, fd: int, payloads: list[bytes], offset: int) -> Any:
            self.events.append(("write", b"".join(payloads)))
            return write(lane, fd, payloads, offset)

        return recorded

    def synced(self, payload: bytes) -> bool:
        """Whether a write holding ``payload`` was followed by an fsync."""
        for i, (kind, data) in enumerate(self.events):
            if kind == "write" and payload in data:
                return any(k == "sync" for k, _ in self.events[i + 1:])
        return False


async def test_sync_every_1_put_returns_after_fsync_with_group_commit(
        make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch, write_path: str) -> None:
    io = _IOLog()
    io.install(monkeypatch)
    q = await make_queue(sync_every=1, max_bytes_per_file=4096)
    violations: list[bytes] = []

    async def producer(p: int) -> None:
        for i in range(10):
            m = b"<p%02d-%02d>" % (p, i)
            await q.put(m)
            if not io.synced(m):
                violations.append(m)

    before = q.statistics().syncs
    await asyncio.gather(*(producer(p) for p in range(64)))
    assert violations == []
    rounds = q.statistics().syncs - before
    # 640 puts from 64 concurrent producers: far fewer sync rounds than puts.
    assert 1 <= rounds <= 640 // 4, rounds
    assert q.qsize() == 640


async def test_sync_every_n_fsyncs_by_count(make_queue: MakeQueue,
                                            monkeypatch: pytest.MonkeyPatch,
                                            write_path: str) -> None:
    io = _IOLog()
    io.install(monkeypatch)
    q = await make_queue(sync_every=10, sync_interval=3600.0)
    for i in range(100):
        await q.put(b"%02d" % i)
    # One round per 10 puts (plus the first round after open); none by the timer. With
    # inline writes a round starts after 5 puts, beside the next ones: up to one per 5.
    rounds = q.statistics().syncs
    assert 10 <= rounds <= (22 if write_path == "native" else 12), rounds
    assert sum(k == "sync" for k, _ in io.events) >= rounds
    assert io.synced(b"89")  # covered by the round at the 90th put at the latest


async def test_sync_writes_exact_meta_now(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(sync_every=10**6, sync_interval=3600.0)
    await q.put_many([b"abc", b"defg"])
    assert await q.get() == b"abc"
    await q.sync()
    assert (tmp_path / meta_name("q")).read_bytes() == b"1\n0,7\n0,15\n"
