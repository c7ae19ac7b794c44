"""One open queue object per queue: QueueLocked for a second open in this or
another process; the lock goes away on close and when the holder dies."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import MakeQueue
from helpers_proc import Child

from aiodiskqueue import DiskQueue, DiskQueueError, QueueLocked
from aiodiskqueue._format.lock import lock_holder


async def test_second_object_in_same_process(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue()
    await q.put(b"first")
    with pytest.raises(QueueLocked) as ei:
        await DiskQueue.open(tmp_path, "q")
    assert ei.value.pid == os.getpid()
    assert f"process {os.getpid()}" in str(ei.value)
    assert ei.value.path == str(tmp_path / "q.diskqueue.lock")
    with pytest.raises(QueueLocked):
        async with DiskQueue(tmp_path, "q"):
            pass
    # The failed opens changed nothing: the first object still works.
    assert q.qsize() == 1 and await q.get() == b"first"
    assert lock_holder(str(tmp_path / "q.diskqueue.lock")) == os.getpid()
    await q.aclose()
    assert lock_holder(str(tmp_path / "q.diskqueue.lock")) is None
    q2 = await make_queue()  # released on close
    assert q2.qsize() == 0


async def test_other_names_and_directories_do_not_conflict(make_queue: MakeQueue,
                                                           tmp_path: Path) -> None:
    a = await make_queue(name="a")
    b = await make_queue(name="b")
    c = await make_queue(directory=tmp_path / "other", name="a")
    for q in (a, b, c):
        await q.put(q.name.encode())
    assert [await a.get(), await b.get(), await c.get()] == [b"a", b"b", b"a"]


async def test_lock_released_when_open_fails_after_locking(tmp_path: Path) -> None:
    # The meta path is a directory: recovery fails after the lock was taken.
    (tmp_path / "q.diskqueue.meta.dat").mkdir()
    with pytest.raises(DiskQueueError, match="cannot open queue 'q'") as ei:
        await DiskQueue.open(tmp_path, "q")
    assert isinstance(ei.value.__cause__, OSError)
    assert lock_holder(str(tmp_path / "q.diskqueue.lock")) is None
    (tmp_path / "q.diskqueue.meta.dat").rmdir()
    async with DiskQueue(tmp_path, "q") as q:
        await q.put(b"ok")
        assert await q.get() == b"ok"


async def test_held_by_other_process_then_released_on_kill(tmp_path: Path) -> None:
    child = await Child.spawn(tmp_path / "stderr.txt", "hold", str(tmp_path), "q")
    try:
        line = await child.line()
        assert line == f"OPEN {child.proc.pid}", child.stderr()
        with pytest.raises(QueueLocked) as ei:
            await DiskQueue.open(tmp_path, "q")
        assert ei.value.pid == child.proc.pid
        assert lock_holder(str(tmp_path / "q.diskqueue.lock")) == child.proc.pid
    finally:
        child.kill()
    assert await child.wait() == -signal.SIGKILL
    assert lock_holder(str(tmp_path / "q.diskqueue.lock")) is None
    async with DiskQueue(tmp_path, "q") as q:  # the kernel dropped the dead holder's lock
        await q.put(b"mine")
        assert await q.get() == b"mine"


async def test_held_by_other_process_released_on_close(tmp_path: Path) -> None:
    child = await Child.spawn(tmp_path / "stderr.txt", "hold", str(tmp_path), "q")
    try:
        assert (await child.line() or "").startswith("OPEN "), child.stderr()
        assert child.proc.stdin is not None
        child.proc.stdin.close()  # the child closes its queue and exits
        assert await child.rest() == []
        assert await child.wait() == 0, child.stderr()
    finally:
        child.kill()
    async with DiskQueue(tmp_path, "q"):
        pass


async def test_other_process_sees_our_lock(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue()
    child = await Child.spawn(tmp_path / "stderr.txt", "try", str(tmp_path), "q")
    assert await child.rest() == [f"LOCKED {os.getpid()}"], child.stderr()
    assert await child.wait() == 0
    await q.aclose()
    child = await Child.spawn(tmp_path / "stderr.txt", "try", str(tmp_path), "q")
    assert await child.rest() == ["OPENED"], child.stderr()
    assert await child.wait() == 0
