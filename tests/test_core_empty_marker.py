"""Acknowledged empty messages survive a kill: the empty-message marker.

Recovery cuts a run of zero-length records that ends the last segment past the
meta's write position (a zero-filled tail, what a power cut can leave) unless the
queue's marker ``NAME.diskqueue.empty`` exists. A queue makes it durable before it
reports an empty message durable, so an acknowledged empty message is never cut.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue, DiskQueueError
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import load_meta

CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from aiodiskqueue import DiskQueue

    async def main(directory, how):
        q = await DiskQueue.open(directory, "q", **({"sync_every": 1} if how.startswith("sync1")
                                                    else {}))
        if how == "sync1-put":
            await q.put(b"a")
            await q.put(b"")
        elif how == "sync1-many":
            await q.put(b"a")
            await q.put_many([b"", b"b", b""])
        elif how == "default-nowait":
            q.put_nowait(b"a")
            q.put_nowait(b"")
            await q.sync()
        elif how == "default-put":
            await q.put(b"a")
            await q.put(b"")
            await q.sync()
        print("acked", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")

ACKED = {
    "sync1-put": [b"a", b""],
    "sync1-many": [b"a", b"", b"b", b""],
    "default-nowait": [b"a", b""],
    "default-put": [b"a", b""],
}


async def put_and_kill(directory: Path, how: str) -> None:
    """Run the child until it reports its puts acknowledged, then SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(directory), how, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"acked\n"
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("how", list(ACKED))
async def test_an_acknowledged_empty_message_survives_a_kill(tmp_path: Path, how: str) -> None:
    await put_and_kill(tmp_path, how)
    lay = Layout(str(tmp_path), "q")
    meta = load_meta(lay.meta_path)
    size = os.stat(lay.segment_path(0)).st_size
    if how.startswith("sync1"):
        # What makes this a test of the rule: the empty records lie past the meta's write
        # position (with sync_every=1 the meta is stored by the first sync, then only
        # when the read position moves or a file rolls), as the last records of the
        # segment, with no other empty record before them.
        assert meta is not None and meta.write == (0, 5), (meta, size)
    # With the default settings sync() stores the meta: it covers the records, which
    # are then never questioned (the marker is made all the same).
    async with DiskQueue(tmp_path, "q") as q:
        assert [await q.get() for _ in range(q.qsize())] == ACKED[how]
    assert os.path.exists(lay.empty_marker_path)


async def test_no_marker_without_empty_messages(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", sync_every=1) as q:
        await q.put(b"x")
        await q.put_many([b"y", b"z"])
        q.put_nowait(b"w")
        await q.sync()
    assert not os.path.exists(Layout(str(tmp_path), "q").empty_marker_path)


async def test_put_nowait_starts_the_marker_and_aclose_waits_for_it(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q") as q:
        q.put_nowait(b"")
    assert os.path.exists(Layout(str(tmp_path), "q").empty_marker_path)


async def test_purge_keeps_the_marker(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q") as q:
        await q.put(b"")
        await q.purge()
        assert os.path.exists(Layout(str(tmp_path), "q").empty_marker_path)


async def test_an_empty_put_fails_if_the_marker_cannot_be_made(tmp_path: Path) -> None:
    # A directory where the marker's name should be: it cannot be opened for writing.
    os.mkdir(Layout(str(tmp_path), "q").empty_marker_path)
    async with DiskQueue(tmp_path, "q", sync_every=1) as q:
        with pytest.raises(DiskQueueError, match="an empty message cannot be stored"):
            await q.put(b"")
        with pytest.raises(DiskQueueError, match="an empty message cannot be stored"):
            await q.put_many([b"x", b""])
        assert q.qsize() == 0  # nothing of either was accepted
        q.put_nowait(b"")
        with pytest.raises(DiskQueueError, match="an empty message cannot be stored"):
            await q.sync()
        with pytest.raises(DiskQueueError):
            await q.sync()  # reported until the marker is made, never just once
        await q.put(b"x")
        assert [await q.get() for _ in range(q.qsize())] == [b"", b"x"]


async def test_ack_queue_empty_bodies_make_the_marker_of_its_queues(tmp_path: Path) -> None:
    # The AckQueue puts into its data queue and dead-letter queue through put and
    # put_many, and commits through sync(): an empty body makes the marker there.
    from aiodiskqueue import AckQueue
    from aiodiskqueue._format.layout import dead_letter_layout

    async with AckQueue(tmp_path, "q", sync_every=1, max_attempts=1) as q:
        await q.put(b"")
        await q.put_many([b"x", b""])
        assert os.path.exists(Layout(str(tmp_path), "q").empty_marker_path)
        msg = await q.get()
        assert msg.body == b""
        await msg.requeue()  # its last attempt: into the dead-letter queue
        assert [(await q.get()).body for _ in range(2)] == [b"x", b""]
    assert os.path.exists(dead_letter_layout(str(tmp_path), "q").empty_marker_path)
    async with DiskQueue(dead_letter_layout(str(tmp_path), "q").directory, "q") as dead:
        assert [await dead.get() for _ in range(dead.qsize())] == [b""]
