"""The Spark source's file layer beside a live producer (no SparkSession needed): a view
reads what the producer published and no further; consuming takes the consumer role
only, stores the read half of the meta, and deletes only consumed segments."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import load_meta
from aiodiskqueue.spark._consume import QueueBusy, consume_blocker, release
from aiodiskqueue.spark._files import view_queue
from aiodiskqueue.spark._ranges import advance

pytestmark = pytest.mark.spark

MAX = 1 << 20


async def _producer(tmp_path: Path) -> DiskQueue:
    # sync_every high: the meta lags far behind what the producer has published.
    return await DiskQueue.open(tmp_path, "q", role="producer", max_bytes_per_file=80,
                                sync_every=10_000, sync_interval=3600)


async def test_view_reads_what_a_live_producer_published_and_no_torn_tail(
        tmp_path: Path) -> None:
    p = await _producer(tmp_path)
    lay = Layout(str(tmp_path), "q")
    try:
        await p.put_many([b"r%03d" % i for i in range(25)])  # 8 bytes a record
        view = view_queue(lay, 0, MAX)
        assert view.published == (2, 40)
        assert view.end == (2, 40)
        assert view.holder == os.getpid()
        # The producer is writing its next record: a length and part of the body.
        with open(lay.segment_path(2), "ab") as f:
            f.write(b"\0\0\0\x04r0")
        view = view_queue(lay, 0, MAX)
        assert view.end == (2, 40)
        assert view.missing == ()
        assert sum(s.size for s in view.spans) == 25 * 8
        assert consume_blocker(lay) is None  # a producer alone does not stop consuming
    finally:
        await p.aclose()


async def test_release_beside_a_live_producer_keeps_its_half_and_its_segment(
        tmp_path: Path) -> None:
    p = await _producer(tmp_path)
    lay = Layout(str(tmp_path), "q")
    items = [b"r%03d" % i for i in range(60)]
    try:
        await p.put_many(items[:35])
        view = view_queue(lay, 0, MAX)
        pos, rows, _ = advance(view, view.spans, 25, None, 0, MAX)
        assert (pos, rows) == ((2, 40), 25)
        assert pos is not None
        assert release(lay, pos, 0, MAX, lock_wait=0.0) is True
        assert release(lay, pos, 0, MAX, lock_wait=0.0) is False  # idempotent
        assert min(lay.segments()) == 2  # consumed files gone; the producer's stays
        meta = load_meta(lay.meta_path)
        assert meta is not None and meta.read == (2, 40)
        # The meta named no position past (0, 0) before; the read half cannot pass the
        # write half, so the producer's published position went in with it.
        assert (meta.write, meta.depth) == ((3, 40), 10)
        # The producer goes on putting; everything up to its published end is read.
        await p.put_many(items[35:])
        view = view_queue(lay, 0, MAX)
        pos, rows, _ = advance(view, view.spans, None, None, 0, MAX)
        assert rows == 35
        assert pos is not None
        assert release(lay, pos, 0, MAX, lock_wait=0.0) is True
        # A consumer role held elsewhere is what stops a stream from consuming.
        c = await DiskQueue.open(tmp_path, "q", role="consumer", max_bytes_per_file=80)
        try:
            assert consume_blocker(lay) == (os.getpid(), lay.role_path("consumer"))
            with pytest.raises(QueueBusy, match="consumer role"):
                release(lay, (pos[0] + 5, 0), 0, MAX, lock_wait=0.1)
            await p.put(b"last")
            assert await asyncio.wait_for(c.get(), 10) == b"last"  # nothing else left
        finally:
            await c.aclose()
    finally:
        await p.aclose()
    # Closed by everyone: go-diskqueue's meta is consistent, nothing unread.
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=80) as q:
        assert q.qsize() == 0


async def test_consume_is_refused_beside_a_queue_opened_whole(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", max_bytes_per_file=80) as q:
        await q.put(b"x")
        lay = Layout(str(tmp_path), "q")
        assert consume_blocker(lay) == (os.getpid(), lay.lock_path)
