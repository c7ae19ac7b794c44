"""Bad input, bad options and I/O errors (ENOSPC) on write."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeQueue
from helpers_format import read_meta, read_queue, segment_numbers

from aiodiskqueue import DiskQueue, DiskQueueError, MessageSizeError, QueueClosed


@pytest.mark.parametrize("item", ["text", 42, None, [b"a"], 3.5], ids=repr)
async def test_wrong_payload_type(make_queue: MakeQueue, tmp_path: Path, item: Any) -> None:
    q = await make_queue()
    with pytest.raises(TypeError, match=f"got {type(item).__name__}"):
        await q.put(item)
    with pytest.raises(TypeError, match=f"got {type(item).__name__}"):
        await q.put_many([b"ok", item])  # checked first: b"ok" is not put either
    with pytest.raises(TypeError, match=f"got {type(item).__name__}"):
        q.put_nowait(item)
    assert q.qsize() == 0
    await q.sync()
    assert read_queue(tmp_path, "q") == []


@pytest.mark.parametrize("size", [0, 3, 11, 100], ids=lambda s: f"{s}B")
async def test_size_out_of_bounds_writes_nothing(make_queue: MakeQueue, tmp_path: Path,
                                                 size: int) -> None:
    q = await make_queue(min_msg_size=4, max_msg_size=10)
    bad = b"x" * size
    with pytest.raises(MessageSizeError, match=rf"{size} bytes is outside \[4, 10\]") as ei:
        await q.put(bad)
    assert isinstance(ei.value, ValueError) and ei.value.size == size
    with pytest.raises(MessageSizeError):
        q.put_nowait(bad)
    with pytest.raises(MessageSizeError):
        await q.put_many([b"good", bad])  # checked first: the good one is not put either
    assert q.qsize() == 0
    await q.sync()
    assert read_queue(tmp_path, "q") == []
    assert q.statistics().bytes_on_disk == 0
    await q.put(b"four")  # the bounds themselves are allowed
    await q.put(b"0123456789")
    assert [await q.get(), await q.get()] == [b"four", b"0123456789"]


@pytest.mark.parametrize(
    ("options", "exc", "message"),
    [
        ({"max_bytes_per_file": 0}, ValueError, "max_bytes_per_file must be >= 1, got 0"),
        ({"max_bytes_per_file": "big"}, TypeError, "max_bytes_per_file must be an int, got str"),
        ({"min_msg_size": -1}, ValueError, "min_msg_size must be in [0, 2147483647], got -1"),
        ({"max_msg_size": 2**31}, ValueError, "got 2147483648"),
        ({"min_msg_size": 10, "max_msg_size": 5}, ValueError, "got 10 > 5"),
        ({"sync_every": 0}, ValueError, "sync_every must be >= 1, got 0"),
        ({"sync_every": True}, TypeError, "sync_every must be an int, got bool"),
        ({"sync_interval": 0}, ValueError, "sync_interval must be a finite number > 0, got 0"),
        ({"sync_interval": -1.5}, ValueError, "got -1.5"),
        ({"sync_interval": float("nan")}, ValueError, "got nan"),
        ({"sync_interval": float("inf")}, ValueError, "got inf"),
        ({"sync_interval": "2"}, TypeError, "sync_interval must be a number, got str"),
        ({"maxsize": -1}, ValueError, "maxsize must be >= 0, got -1"),
        ({"maxsize": 1.0}, TypeError, "maxsize must be an int, got float"),
        ({"read_buffer_bytes": 100}, ValueError, "read_buffer_bytes must be >= 4096, got 100"),
        ({"write_buffer_bytes": 0}, ValueError, "write_buffer_bytes must be >= 4096, got 0"),
        ({"spin_us": -1}, ValueError, "spin_us must be in [0, 1000000], got -1"),
        ({"spin_us": 1.5}, TypeError, "spin_us must be an int, got float"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]!r}" for k in v) if isinstance(v, dict) else "",
)
def test_bad_options(tmp_path: Path, options: dict[str, Any], exc: type[Exception],
                     message: str) -> None:
    with pytest.raises(exc) as ei:
        DiskQueue(tmp_path, "q", **options)
    assert message in str(ei.value)
    assert list(tmp_path.iterdir()) == []  # validated before touching the disk


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "nul\0"], ids=repr)
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="name must be a plain file name prefix"):
        DiskQueue(tmp_path, name)


def test_name_type(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="name must be a str, got int"):
        DiskQueue(tmp_path, 5)  # type: ignore[arg-type]


def test_options_are_keyword_only(tmp_path: Path) -> None:
    # The third positional parameter is the role: an option given there is refused.
    with pytest.raises(TypeError):
        DiskQueue(tmp_path, "q", 1024)  # type: ignore[arg-type]


async def test_calls_after_close_raise_queue_closed(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.aclose()
    with pytest.raises(QueueClosed):
        await q.put(b"x")
    with pytest.raises(QueueClosed):
        q.put_nowait(b"x")
    with pytest.raises(QueueClosed):
        await q.put_many([b"x"])
    with pytest.raises(QueueClosed):
        await q.get()
    with pytest.raises(QueueClosed):
        q.get_nowait()
    with pytest.raises(QueueClosed):
        await q.sync()
    with pytest.raises(QueueClosed):
        await q.purge()


class _DiskFull:
    """Make ``os.pwrite`` in the store fail with ENOSPC while ``on`` is set."""

    def __init__(self) -> None:
        self.on = False
        self.failures = 0
        self.real = os.pwrite

    def __call__(self, fd: int, data: Any, offset: int) -> int:
        if self.on:
            self.failures += 1
            # Half the bytes reach the file first, as a real short write on a full disk.
            self.real(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data, offset)


@pytest.mark.usefixtures("pure_python")
async def test_disk_full_put_fails_then_recovers(make_queue: MakeQueue, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    full = _DiskFull()
    monkeypatch.setattr("aiodiskqueue._core.store.os.pwrite", full)
    q = await make_queue(max_bytes_per_file=64)
    before = [b"before-%d" % i for i in range(6)]  # 12-byte records: 5 per 64-byte file
    for m in before:
        await q.put(m)
    full.on = True
    with caplog.at_level(logging.ERROR, logger="aiodiskqueue"), \
            pytest.raises(DiskQueueError) as ei:
        await q.put(b"lost-on-full")
    assert any("No space left" in r.getMessage() for r in caplog.records)
    assert full.failures >= 1
    assert isinstance(ei.value.__cause__, OSError)
    assert ei.value.__cause__.errno == errno.ENOSPC
    # A batch that rolls to a new file fails as a whole, too.
    with pytest.raises(DiskQueueError):
        await q.put_many([b"x" * 40, b"y" * 40])
    # Readable and consistent while the disk is full.
    assert q.qsize() == len(before)
    assert await q.get() == before[0]
    await q.sync()  # the meta still goes through (it does not use pwrite)
    assert read_queue(tmp_path, "q") == before[1:]
    # Space is back: later puts succeed and land right after the last good record.
    full.on = False
    await q.put(b"after")
    got = [await q.get() for _ in range(len(before))]
    assert got == [*before[1:], b"after"]
    await q.sync()
    assert read_queue(tmp_path, "q") == []
    st = q.statistics()
    assert st.depth == 0 and st.bad_files == 0


@pytest.mark.usefixtures("pure_python")
async def test_disk_full_state_survives_reopen(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    full = _DiskFull()
    monkeypatch.setattr("aiodiskqueue._core.store.os.pwrite", full)
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        await q.put_many([b"a" * 10, b"b" * 10])
        full.on = True
        with pytest.raises(DiskQueueError):
            await q.put(b"c" * 50)  # would roll to file 1
        full.on = False
    assert segment_numbers(tmp_path, "q") == [0]
    assert read_meta(tmp_path, "q").write_pos == 28
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=64) as q:
        assert q.qsize() == 2
        assert [await q.get(), await q.get()] == [b"a" * 10, b"b" * 10]


# ---------------------------------------------------------------------- the ioLoop's error paths


async def test_any_exception_in_a_hop_fails_every_waiter(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from aiodiskqueue._core.store import SegmentStore

    q = await DiskQueue.open(tmp_path, "q")
    try:
        await q.put(b"first")
        assert await q.get() == b"first"
        getter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)

        def boom(self: SegmentStore, job: object) -> None:
            raise OverflowError("Python int too large to convert to C long")

        monkeypatch.setattr(SegmentStore, "run", boom)
        monkeypatch.setattr("aiodiskqueue._core.engine._lane.available", lambda: False)
        q._e.lane = None  # every hop goes to the patched store
        puts = [asyncio.ensure_future(q.put(b"x%d" % i)) for i in range(3)]
        syncer = asyncio.ensure_future(q.sync())
        done, pending = await asyncio.wait([*puts, syncer, getter], timeout=10)
        assert not pending
        for t in done:
            assert isinstance(t.exception(), DiskQueueError), t
        with pytest.raises(DiskQueueError, match="is broken: OverflowError") as ei:
            await q.put(b"later")
        assert "open the queue again" in str(ei.value)
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)


class _MetaStoreFails:
    """``store_meta`` in the store fails with ENOSPC while ``on`` is set, counting calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from aiodiskqueue._core import store

        self.on = False
        self.calls = 0
        real = store.store_meta  # type: ignore[attr-defined]  # the name the store calls

        def fake(path: str, meta: Any, swap: Any = None, *, mode: int = 0o600) -> None:
            if self.on:
                self.calls += 1
                raise OSError(errno.ENOSPC, "No space left on device", path)
            real(path, meta, swap, mode=mode)

        monkeypatch.setattr(store, "store_meta", fake)


async def test_close_gives_up_after_bounded_retries(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    fails = _MetaStoreFails(monkeypatch)
    q = await DiskQueue.open(tmp_path, "q")
    await q.put_many([b"a", b"b", b"c"])
    await q.sync()
    assert await q.get() == b"a"
    fails.on = True
    with caplog.at_level(logging.ERROR, logger="aiodiskqueue"):
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
    assert 1 <= fails.calls <= 3
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("closed without storing" in m for m in errors) == 1
    assert len(errors) <= 2  # the first failure, then the give-up line
    fails.on = False
    async with DiskQueue(tmp_path, "q") as q:  # the last stored meta: a comes again
        assert [await q.get() for _ in range(3)] == [b"a", b"b", b"c"]


async def test_failing_sync_rounds_back_off_and_log_once(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    fails = _MetaStoreFails(monkeypatch)
    q = await DiskQueue.open(tmp_path, "q", sync_every=1, sync_interval=0.01)
    try:
        await q.put_many([b"m%d" % i for i in range(200)])
        fails.on = True
        with caplog.at_level(logging.ERROR, logger="aiodiskqueue"):
            for _ in range(200):  # each take asks for a sync round (sync_every=1)
                await q.get()
                await asyncio.sleep(0.002)  # lets the ioLoop run its hops
        # Without backoff every take stores the meta; with it, a handful of attempts.
        assert 1 <= fails.calls <= 20
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        fails.on = False
        await q.sync()  # an explicit sync() always tries, and now succeeds
    finally:
        await asyncio.wait_for(asyncio.shield(q.aclose()), 10)
