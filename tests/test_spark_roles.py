"""The Spark source's file layer beside a live producer (no SparkSession needed): a view
reads what the producer published and no further; consuming takes the consumer role
only, stores the read half of the meta, and deletes only consumed segments."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------ through Spark

_PRODUCER = """
import asyncio, sys
from aiodiskqueue import DiskQueue

async def main():
    n = int(sys.argv[2])
    async with DiskQueue(sys.argv[1], "events", "producer", max_bytes_per_file=2048) as p:
        for i in range(n):
            await p.put(b"e%05d" % i)
            if i == n // 2:
                print("HALF", flush=True)
                sys.stdin.readline()  # go on once the stream has consumed once
            if i % 100 == 99:
                await asyncio.sleep(0.05)
        print("DONE", flush=True)
        sys.stdin.read()  # the role stays held until the test is done

asyncio.run(main())
"""


def test_stream_consumes_exactly_once_while_a_producer_process_puts(
        spark: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import REPO_ROOT
    from helpers_spark import payloads, read_df
    from test_spark import consume_to_parquet, sink_payloads

    qdir, out = tmp_path / "q", tmp_path / "out"
    qdir.mkdir()
    n = 3000
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, str(qdir), str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        lay = Layout(str(qdir), "events")
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "HALF\n"
        # A batch read beside the live producer: every record it published, whole.
        seen = payloads(read_df(spark, qdir, "events"))
        assert seen == [b"e%05d" % i for i in range(n // 2 + 1)]
        consume_to_parquet(spark, qdir, out, "events",
                           maxRecordsPerTrigger="700", lockWait="5")
        assert len(sink_payloads(spark, out)) == n // 2 + 1
        meta = load_meta(lay.meta_path)
        assert meta is not None and meta.read[0] > 0
        assert min(lay.segments()) == meta.read[0]  # consumed segments deleted
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while True:
            done = proc.poll() is not None or _ready(proc)
            consume_to_parquet(spark, qdir, out, "events",
                               maxRecordsPerTrigger="700", lockWait="5")
            if done:
                break
        got = sink_payloads(spark, out)
        assert len(got) == n and sorted(got) == [b"e%05d" % i for i in range(n)]
        meta = load_meta(lay.meta_path)
        assert meta is not None and meta.read == meta.write and meta.depth == 0
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(30) == 0


def _ready(proc: object) -> bool:
    """Whether the producer child said DONE (it has put everything and published it)."""
    import select
    import subprocess

    assert isinstance(proc, subprocess.Popen) and proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], 0)
    return bool(r) and proc.stdout.readline() == "DONE\n"
