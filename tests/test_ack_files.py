"""AckQueue's files: names that no other queue can have, and the earlier layout's dead letters.

The dead-letter queue of ``X`` lives in ``X.dead-letters/``; earlier versions
used the sibling queue ``X.dead``, also the valid name of an unrelated queue.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aiodiskqueue import AckQueue, DiskQueue, QueueLocked
from aiodiskqueue._format.layout import dead_letter_layout, legacy_dead_letter_layout, queue_files
from aiodiskqueue.ack.files import (
    ack_queue_files,
    migrate_dead_letters,
    remove_ack_queue_files,
)

WAIT = 10.0


async def _dead_letter(q: AckQueue, body: bytes) -> None:
    """Put ``body`` and drive it into the dead-letter queue (max_attempts=1)."""
    await q.put(body)
    m = await asyncio.wait_for(q.get(), WAIT)
    assert m.body == body
    await m.requeue()
    await q.sync()


async def _drain(q: DiskQueue) -> list[bytes]:
    out = []
    while q.qsize():
        out.append(await asyncio.wait_for(q.get(), WAIT))
    return out


def _tree(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


async def test_dead_letters_do_not_touch_a_queue_named_x_dead(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "x.dead") as other:
        await other.put(b"mine")
    async with AckQueue(tmp_path, "x", max_attempts=1) as q:
        await _dead_letter(q, b"poison")
        assert await asyncio.wait_for(q.dead_letters.get(), WAIT) == b"poison"
        assert q.dead_letters.qsize() == 0
    async with DiskQueue(tmp_path, "x.dead") as other:
        assert await _drain(other) == [b"mine"]


async def test_ack_queues_x_and_x_dead_side_by_side(tmp_path: Path) -> None:
    async with AckQueue(tmp_path, "x", max_attempts=1) as x, \
            AckQueue(tmp_path, "x.dead", max_attempts=1) as xd:
        await _dead_letter(x, b"x poison")
        await _dead_letter(xd, b"x.dead poison")
        await xd.put(b"x.dead ready")
    files_x = set(ack_queue_files(str(tmp_path), "x"))
    files_xd = set(ack_queue_files(str(tmp_path), "x.dead"))
    assert files_x and files_xd and not files_x & files_xd
    assert {os.path.relpath(p, tmp_path) for p in files_x | files_xd} == _tree(tmp_path)
    async with AckQueue(tmp_path, "x", max_attempts=1) as x, \
            AckQueue(tmp_path, "x.dead", max_attempts=1) as xd:
        assert await _drain(x.dead_letters) == [b"x poison"]
        assert await _drain(xd.dead_letters) == [b"x.dead poison"]
        assert (await asyncio.wait_for(xd.get(), WAIT)).body == b"x.dead ready"
        assert x.qsize() == 0


@pytest.mark.parametrize("other", ["x.ack", "x.ack.000001", "x.ack.000001.log", "x.dead-letters"])
async def test_no_file_shared_with_a_neighbour(tmp_path: Path, other: str) -> None:
    def open_queue(name: str) -> AckQueue:
        return AckQueue(tmp_path, name, max_attempts=1, log_segment_bytes=4096,
                        max_bytes_per_file=256)

    for name in ("x", other):
        async with open_queue(name) as q:
            await _dead_letter(q, name.encode() + b" dead")
            for i in range(20):
                await q.put(b"%s %d" % (name.encode(), i))
    mine = set(ack_queue_files(str(tmp_path), "x"))
    theirs = set(ack_queue_files(str(tmp_path), other))
    assert not mine & theirs
    remove_ack_queue_files(str(tmp_path), "x")
    assert ack_queue_files(str(tmp_path), "x") == []
    assert set(ack_queue_files(str(tmp_path), other)) == theirs
    async with open_queue(other) as q:
        assert (await asyncio.wait_for(q.get(), WAIT)).body == other.encode() + b" 0"
        assert await _drain(q.dead_letters) == [other.encode() + b" dead"]


async def _old_layout(tmp_path: Path) -> None:
    """What an earlier version left: AckQueue x with dead letters in the sibling queue x.dead."""
    async with AckQueue(tmp_path, "x") as q:
        await q.put(b"ready")
    async with DiskQueue(tmp_path, "x.dead", max_bytes_per_file=64) as old:
        for i in range(5):
            await old.put(b"dead letter %d" % i)
        await old.get()  # one was taken already: the position moves with the files


async def test_dead_letters_of_the_earlier_layout_are_moved_on_open(tmp_path: Path) -> None:
    await _old_layout(tmp_path)
    assert len(legacy_dead_letter_layout(str(tmp_path), "x").segments()) > 1
    async with AckQueue(tmp_path, "x", max_attempts=3, max_bytes_per_file=64) as q:
        assert await _drain(q.dead_letters) == [b"dead letter %d" % i for i in range(1, 5)]
        assert (await asyncio.wait_for(q.get(), WAIT)).body == b"ready"
    assert queue_files(legacy_dead_letter_layout(str(tmp_path), "x")) == []
    assert not any(f.startswith("x.dead.") for f in os.listdir(tmp_path))


async def test_interrupted_move_is_finished_by_the_next_open(tmp_path: Path) -> None:
    await _old_layout(tmp_path)
    old = legacy_dead_letter_layout(str(tmp_path), "x")
    new = dead_letter_layout(str(tmp_path), "x")
    # A crash after the first segment was moved, before the meta file.
    os.makedirs(new.directory)
    num, path = min(old.segments().items())
    os.rename(path, new.segment_path(num))
    async with AckQueue(tmp_path, "x", max_attempts=3) as q:
        assert await _drain(q.dead_letters) == [b"dead letter %d" % i for i in range(1, 5)]


async def test_x_dead_with_an_ack_log_of_its_own_is_not_moved(tmp_path: Path) -> None:
    async with AckQueue(tmp_path, "x.dead") as other:
        await other.put(b"an ack queue of its own")
    assert migrate_dead_letters(str(tmp_path), "x") is False
    async with AckQueue(tmp_path, "x", max_attempts=1) as q:
        assert q.dead_letters.qsize() == 0
    async with AckQueue(tmp_path, "x.dead") as other:
        assert (await asyncio.wait_for(other.get(), WAIT)).body == b"an ack queue of its own"


async def test_earlier_layout_open_elsewhere_is_not_moved(tmp_path: Path) -> None:
    await _old_layout(tmp_path)
    async with DiskQueue(tmp_path, "x.dead"):
        with pytest.raises(QueueLocked):
            await AckQueue.open(tmp_path, "x", max_attempts=1)
    async with AckQueue(tmp_path, "x", max_attempts=1) as q:
        assert q.dead_letters.qsize() == 4
