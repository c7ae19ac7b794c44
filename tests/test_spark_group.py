"""The Spark source on a queue group: ``name`` naming ``NAME.group/`` reads and consumes
its shards as one source (rows and offsets keyed ``NAME/SHARD``), picks up shards that
appear between micro-batches, consumes a shard beside its live producer, skips a shard
another consumer holds; a name that is both a plain queue and a group, a write to a
group and a damaged shard are clear errors that change nothing.

The planning tests drive the source's reader objects directly (no SparkSession); the
few ``spark`` tests run queries in the session's local Spark."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from aiodiskqueue import DiskQueue, QueueGroup
from aiodiskqueue._format.group import GroupMeta, create_group_meta, group_layout
from aiodiskqueue._format.meta import load_meta
from aiodiskqueue.errors import ShardDamaged
from aiodiskqueue.spark import DiskQueueDataSource, GroupBusy, OptionError
from aiodiskqueue.spark._reader import DiskQueueReader, QueuePartition
from aiodiskqueue.spark._stream import DiskQueueStreamReader

pytestmark = pytest.mark.spark

MAX = 1 << 20


async def add_shard(directory: Path, name: str, num: int, items: list[bytes],
                    **options: Any) -> None:
    """Shard ``num`` of group ``name`` holding ``items`` (written by a producer that closed)."""
    lay = group_layout(directory, name)
    create_group_meta(lay, GroupMeta(max_bytes_per_file=options.get("max_bytes_per_file",
                                                                    100 * MAX),
                                     min_msg_size=0, max_msg_size=MAX))
    os.makedirs(lay.shard_path(num), exist_ok=True)
    async with DiskQueue(lay.shard_path(num), name, role="producer", **options) as q:
        await q.put_many(items)


def source(path: Path, name: str, **extra: str) -> DiskQueueDataSource:
    return DiskQueueDataSource({"path": str(path), "name": name, **extra})


def batch_rows(reader: DiskQueueReader | DiskQueueStreamReader,
               parts: Any) -> list[tuple[str, bytes]]:
    out = []
    for part in parts:
        assert isinstance(part, QueuePartition)
        for batch in reader.read(part):
            d = batch.to_pydict()
            out += list(zip(d["name"], d["payload"], strict=True))
    return out


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


async def test_batch_read_of_a_group_reads_every_shard_in_order(tmp_path: Path) -> None:
    for num in range(3):
        await add_shard(tmp_path, "ev", num, [b"s%d-%03d" % (num, i) for i in range(50 + num)],
                        max_bytes_per_file=200)
    before = snapshot(tmp_path)
    reader = source(tmp_path, "ev").reader(None)  # type: ignore[arg-type]
    rows = batch_rows(reader, reader.partitions())
    for num in range(3):
        # FIFO per shard: rows of one shard come in put order.
        assert [p for n, p in rows if n == f"ev/{num:06d}"] == [
            b"s%d-%03d" % (num, i) for i in range(50 + num)]
    assert len(rows) == 153
    assert snapshot(tmp_path) == before


async def test_an_empty_group_reads_as_empty_and_a_missing_name_still_fails(
        tmp_path: Path) -> None:
    create_group_meta(group_layout(tmp_path, "ev"), GroupMeta(100 * MAX, 0, MAX))
    reader = source(tmp_path, "ev").reader(None)  # type: ignore[arg-type]
    assert reader.partitions() == []
    stream = source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    assert stream.initialOffset() == {}
    with pytest.raises(FileNotFoundError, match="holds no queue matching 'other'"):
        source(tmp_path, "other").reader(None)  # type: ignore[arg-type]


async def test_stream_picks_up_new_shards_and_consumes_each(tmp_path: Path) -> None:
    await add_shard(tmp_path, "ev", 0, [b"a%02d" % i for i in range(30)])
    stream = source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    start = stream.initialOffset()
    assert start == {"ev/000000": [0, 0]}
    end = stream.latestOffset(start, ReadAllAvailable())
    got = batch_rows(stream, stream.partitions(start, end))
    assert [p for _, p in got] == [b"a%02d" % i for i in range(30)]
    stream.commit(end)
    # A shard created between micro-batches is read from the next one on.
    await add_shard(tmp_path, "ev", 1, [b"b%02d" % i for i in range(20)])
    nxt = stream.latestOffset(end, ReadAllAvailable())
    assert set(nxt) == {"ev/000001"} or nxt.keys() >= {"ev/000001"}
    got = batch_rows(stream, stream.partitions(end, nxt))
    assert got == [("ev/000001", b"b%02d" % i) for i in range(20)]
    stream.commit(nxt)
    for num in range(2):
        meta = load_meta(group_layout(tmp_path, "ev").shard_layout(num).meta_path)
        assert meta is not None and meta.depth == 0 and meta.read == meta.write


async def test_stream_limits_share_the_trigger_across_shards(tmp_path: Path) -> None:
    for num in range(3):
        await add_shard(tmp_path, "ev", num, [b"%d-%02d" % (num, i) for i in range(10)])
    stream = source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    offsets = stream.initialOffset()
    seen: list[tuple[str, bytes]] = []
    for _ in range(20):
        end = stream.latestOffset(offsets, ReadMaxRows(7))
        if end == offsets:
            break
        batch = batch_rows(stream, stream.partitions(offsets, end))
        assert len(batch) <= 7
        seen += batch
        stream.commit(end)
        offsets = end
    assert sorted(seen) == sorted((f"ev/{n:06d}", b"%d-%02d" % (n, i))
                                  for n in range(3) for i in range(10))


async def test_consume_beside_a_live_producer_and_skip_a_held_shard(tmp_path: Path) -> None:
    await add_shard(tmp_path, "ev", 0, [])
    await add_shard(tmp_path, "ev", 1, [b"held-%d" % i for i in range(5)])
    lay = group_layout(tmp_path, "ev")
    # A group producer claims the first shard without a producer: shard 0.
    prod = await QueueGroup.open(tmp_path, "ev", "producer", sync_every=10_000)
    assert prod.shard == "000000"
    holder = await DiskQueue.open(lay.shard_path(1), "ev", role="consumer")
    try:
        await prod.put_many([b"live-%d" % i for i in range(40)])
        stream = source(tmp_path, "ev", consume="true",
                        lockWait="0.2").streamReader(None)  # type: ignore[arg-type]
        start = stream.initialOffset()
        end = stream.latestOffset(start, ReadAllAvailable())
        got = batch_rows(stream, stream.partitions(start, end))
        # The live producer's shard is read up to what it published; the shard another
        # consumer holds is skipped (not waited for, not failed), as a glob's queue is.
        assert got == [("ev/000000", b"live-%d" % i) for i in range(40)]
        stream.commit(end)
        meta = load_meta(lay.shard_layout(0).meta_path)
        assert meta is not None and list(meta.read) == end["ev/000000"] and meta.depth == 0
        await prod.put(b"after")
        nxt = stream.latestOffset(end, ReadAllAvailable())
        assert batch_rows(stream, stream.partitions(end, nxt)) == [("ev/000000", b"after")]
        assert holder.qsize() == 5
    finally:
        await prod.aclose()
        await holder.aclose()


async def test_a_name_both_queue_and_group_is_an_option_error(tmp_path: Path) -> None:
    # Made by hand: the queue first, then the group's files (each refuses the other).
    async with DiskQueue(tmp_path, "ev") as q:
        await q.put(b"q")
    await add_shard(tmp_path, "ev", 0, [b"g"])
    before = snapshot(tmp_path)
    want = (r"option 'name' names both a plain queue \(ev.diskqueue.\* files\) and a queue "
            r"group")
    with pytest.raises(OptionError, match=want):
        source(tmp_path, "ev").reader(None)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=want):
        source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    # A glob selects plain queues only.
    reader = source(tmp_path, "e*").reader(None)  # type: ignore[arg-type]
    assert batch_rows(reader, reader.partitions()) == [("ev", b"q")]
    assert snapshot(tmp_path) == before


async def test_writing_to_a_group_and_options_that_do_not_apply(tmp_path: Path) -> None:
    await add_shard(tmp_path, "ev", 0, [b"g"])
    with pytest.raises(OptionError, match=r"option 'name' names the queue group .*the sink "
                                          "appends to one plain queue"):
        source(tmp_path, "ev").writer(None, False)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="option 'removeDrainedAfter' does not apply to a "
                                          "queue group"):
        source(tmp_path, "ev", consume="true",
               removeDrainedAfter="5").streamReader(None)  # type: ignore[arg-type]


async def test_a_shard_that_is_no_directory_is_shard_damaged(tmp_path: Path) -> None:
    await add_shard(tmp_path, "ev", 0, [b"x"])
    Path(group_layout(tmp_path, "ev").shard_path(1)).write_bytes(b"not a shard")
    before = snapshot(tmp_path)
    with pytest.raises(ShardDamaged, match="000001: not a directory"):
        source(tmp_path, "ev").reader(None)  # type: ignore[arg-type]
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ queries in Spark


def test_query_reads_and_consumes_a_group(spark: SparkSession, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    want = []
    for num in range(3):
        items = [b"s%d-%04d" % (num, i) for i in range(100 * (num + 1))]
        asyncio.run(add_shard(qdir, "ev", num, items, max_bytes_per_file=1000))
        want += items
    df = spark.read.format("diskqueue").option("path", str(qdir)).option("name", "ev").load()
    assert sorted(r.name for r in df.select("name").distinct().collect()) == [
        "ev/000000", "ev/000001", "ev/000002"]
    assert df.count() == 600

    def consume() -> None:
        query = (spark.readStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "ev").option("consume", "true")
                 .option("maxRecordsPerTrigger", "250").load()
                 .writeStream.format("parquet").option("path", str(out / "data"))
                 .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True)
                 .start())
        query.awaitTermination()
        assert query.exception() is None

    consume()
    got = [bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect()]
    assert sorted(got) == sorted(want)
    # A shard added after the first run is consumed by the next one.
    asyncio.run(add_shard(qdir, "ev", 3, [b"late-%d" % i for i in range(7)]))
    consume()
    got = [bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect()]
    assert sorted(got) == sorted(want + [b"late-%d" % i for i in range(7)])
    for num in range(4):
        meta = load_meta(group_layout(qdir, "ev").shard_layout(num).meta_path)
        assert meta is not None and meta.depth == 0


async def test_consuming_a_group_its_group_consumers_read_is_group_busy(
        tmp_path: Path) -> None:
    await add_shard(tmp_path, "ev", 0, [b"x"] * 3)
    stream = source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    start = stream.initialOffset()
    member = await QueueGroup.open(tmp_path, "ev", "consumer")
    try:
        want = (rf"cannot consume queue group 'ev' in {tmp_path}: group consumer process\(es\) "
                rf"{os.getpid()} read it")
        # A group consumer that joins a running stream fails its next trigger ...
        with pytest.raises(GroupBusy, match=want):
            stream.latestOffset(start, ReadAllAvailable())
        # ... and one that is there already, the stream's start.
        with pytest.raises(GroupBusy, match=want):
            source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
        # Reading without consuming takes nothing from them.
        reader = source(tmp_path, "ev").reader(None)  # type: ignore[arg-type]
        assert len(batch_rows(reader, reader.partitions())) == 3
    finally:
        await member.aclose()
    stream = source(tmp_path, "ev", consume="true").streamReader(None)  # type: ignore[arg-type]
    assert stream.initialOffset() == {"ev/000000": [0, 0]}
