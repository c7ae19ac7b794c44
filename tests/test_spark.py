"""The ``diskqueue`` PySpark data source, run in Spark ``local[2]`` mode.

One SparkSession serves the whole test session (start-up takes several
seconds). Every test works on copies in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CopyFixture, MakeQueue
from helpers_format import fixture_msg, multi_msg, oversize_msg
from helpers_spark import payloads, read_df
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.meta import Meta, load_meta
from aiodiskqueue.spark import _nsq
from aiodiskqueue.spark._staging import committed_batch, process_start_time

pytestmark = pytest.mark.spark


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` (recursively) with its bytes."""
    out = {}
    for root, _dirs, files in os.walk(directory):
        for f in files:
            p = Path(root) / f
            out[str(p.relative_to(directory))] = p.read_bytes()
    return out


def queue_files(directory: Path, name: str) -> dict[str, bytes]:
    """The queue's segment and meta files with their bytes (lock and sidecars left out)."""
    return {p.name: p.read_bytes() for p in directory.iterdir()
            if p.name.startswith(f"{name}.diskqueue.") and p.name.endswith(".dat")}


def queue_files_of(files: dict[str, bytes], name: str) -> dict[str, bytes]:
    """The entries of a :func:`snapshot` that :func:`queue_files` would return."""
    return {k: v for k, v in files.items()
            if "/" not in k and k.startswith(f"{name}.diskqueue.") and k.endswith(".dat")}


def staged_data(directory: Path) -> list[Path]:
    """Staged segment files still waiting under ``.spark-staging``."""
    return list((directory / ".spark-staging").rglob("*.dat"))


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll real state until ``predicate`` holds (tasks of a failed job end on their own)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def fill(directory: Path, name: str, items: list[bytes], **options: Any) -> None:
    async with DiskQueue(directory, name, **options) as q:
        await q.put_many(items)


async def drain(directory: Path, name: str) -> list[bytes]:
    out: list[bytes] = []
    async with DiskQueue(directory, name) as q:
        while not q.empty():
            # A depth too high would block get() forever: fail instead of hanging.
            out.append(await asyncio.wait_for(q.get(), 30))
    return out


def digest(items: list[bytes]) -> str:
    h = hashlib.sha256()
    for p in sorted(items):
        h.update(len(p).to_bytes(4, "big") + p)
    return h.hexdigest()


# ------------------------------------------------------------------ packaging


def test_import_aiodiskqueue_does_not_import_pyspark() -> None:
    code = "import sys, aiodiskqueue; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ batch read

FIXTURE_MESSAGES = {
    "fixture": [fixture_msg(i) for i in range(137, 1000)],
    "partial": [fixture_msg(i) for i in range(150, 1000)],
    "empty": [],
    "multi": [multi_msg(i) for i in range(2002)],
    "oversize": [oversize_msg(i) for i in range(9)],
    "emptied": [],
}


@pytest.mark.parametrize("arrow", ["true", "false"], ids=["arrow", "tuples"])
@pytest.mark.parametrize("name", sorted(FIXTURE_MESSAGES))
def test_batch_read_go_fixture(spark: SparkSession, copy_fixture: CopyFixture,
                               tmp_path: Path, name: str, arrow: str) -> None:
    copy_fixture(name, tmp_path)
    before = snapshot(tmp_path)
    df = read_df(spark, tmp_path, name, arrow=arrow, maxMsgSize="1048576")
    assert df.columns == ["name", "file_num", "offset", "payload"]
    assert payloads(df) == FIXTURE_MESSAGES[name]
    assert snapshot(tmp_path) == before  # a batch read changes nothing


def test_batch_read_positions_point_at_records(spark: SparkSession, copy_fixture: CopyFixture,
                                               tmp_path: Path) -> None:
    copy_fixture("partial", tmp_path)
    rows = read_df(spark, tmp_path, "partial").orderBy("file_num", "offset").collect()
    assert (rows[0].file_num, rows[0].offset) == (5, 741)
    for row in rows[:50]:
        seg = tmp_path / f"partial.diskqueue.{row.file_num:06d}.dat"
        with open(seg, "rb") as f:
            f.seek(row.offset)
            n = int.from_bytes(f.read(4), "big")
            assert f.read(n) == bytes(row.payload)


@pytest.mark.smoke
def test_batch_read_glob_many_queues_many_partitions(spark: SparkSession,
                                                     copy_fixture: CopyFixture,
                                                     tmp_path: Path) -> None:
    for name in FIXTURE_MESSAGES:
        copy_fixture(name, tmp_path)
    df = read_df(spark, tmp_path, "*", maxBytesPerPartition="262144")
    assert df.rdd.getNumPartitions() > 10
    counts = {r["name"]: r["count"] for r in df.groupBy("name").count().collect()}
    assert counts == {k: len(v) for k, v in FIXTURE_MESSAGES.items() if v}
    only = read_df(spark, tmp_path, "[fp]*")
    assert sorted(r.name for r in only.select("name").distinct().collect()) == [
        "fixture", "partial"]


def test_batch_read_recovers_tail_without_changing_files(spark: SparkSession,
                                                         tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "q", [b"a%03d" % i for i in range(10)], max_bytes_per_file=40))
    lay = Layout(str(tmp_path), "q")
    meta = load_meta(lay.meta_path)
    assert meta is not None
    # A crashed writer: whole records after the meta's write position, then a torn one.
    with open(lay.segment_path(meta.write_file_num), "ab") as f:
        f.write(b"\x00\x00\x00\x04t001" + b"\x00\x00\x00\x09half")
    before = snapshot(tmp_path)
    got = payloads(read_df(spark, tmp_path, "q"))
    assert got == [b"a%03d" % i for i in range(10)] + [b"t001"]
    assert snapshot(tmp_path) == before


async def test_batch_read_of_live_queue_stops_at_synced_position(
        spark: SparkSession, make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(tmp_path, "live", sync_every=10**6, sync_interval=3600.0)
    await q.put_many([b"synced-%d" % i for i in range(10)])
    await q.sync()
    await q.put_many([b"unsynced-%d" % i for i in range(5)])  # in the OS, not in the meta
    got = payloads(read_df(spark, tmp_path, "live"))
    assert got == [b"synced-%d" % i for i in range(10)]
    assert q.qsize() == 15


def test_batch_read_nsq_format(spark: SparkSession, tmp_path: Path) -> None:
    msgs = [_nsq.encode(b"body-%d" % i, b"%016x" % i, 1_700_000_000_000_000_000 + i, i % 3)
            for i in range(20)]
    asyncio.run(fill(tmp_path, "nsqd", msgs))
    rows = (read_df(spark, tmp_path, "nsqd", format="nsq")
            .orderBy("offset").collect())
    assert [r.id for r in rows] == [f"{i:016x}" for i in range(20)]
    assert [r.timestamp for r in rows] == [1_700_000_000_000_000_000 + i for i in range(20)]
    assert [r.attempts for r in rows] == [i % 3 for i in range(20)]
    assert [bytes(r.body) for r in rows] == [b"body-%d" % i for i in range(20)]


def test_batch_read_of_larger_messages_than_allowed_says_which_option(
        spark: SparkSession, copy_fixture: CopyFixture, tmp_path: Path) -> None:
    copy_fixture("multi", tmp_path)  # messages up to 5000 bytes
    with pytest.raises(Exception, match=r"record length \d+ is outside \[0, 1000\] "
                                        r"\(options minMsgSize, maxMsgSize\)"):
        read_df(spark, tmp_path, "multi", maxMsgSize="1000").collect()


# ------------------------------------------------------------------ bad options


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"name": "q"}, "path"),
        ({"path": "{dir}"}, "name"),
        ({"path": "{dir}", "name": "q", "format": "json"}, "format"),
        ({"path": "{dir}", "name": "q", "maxMsgSize": "big"}, "maxMsgSize"),
        ({"path": "{dir}", "name": "q", "consume": "maybe"}, "consume"),
    ],
    ids=["missing-path", "missing-name", "unknown-format", "bad-int", "bad-bool"],
)
def test_bad_read_options_name_the_option(spark: SparkSession, tmp_path: Path,
                                          options: dict[str, str], option: str) -> None:
    reader = spark.read.format("diskqueue")
    for k, v in options.items():
        reader = reader.option(k, v.format(dir=tmp_path))
    with pytest.raises(Exception, match=rf"OptionError: diskqueue: option '{option}' "):
        reader.load().collect()


def test_bad_write_options_name_the_option(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match=r"option 'name' must name one queue"):
        (df.write.format("diskqueue").option("path", str(tmp_path)).option("name", "q-*")
         .mode("append").save())
    with pytest.raises(Exception, match=r"option 'path' is required"):
        df.write.format("diskqueue").option("name", "q").mode("append").save()
    with pytest.raises(Exception, match=r"option 'mode' must be 'append'"):
        (df.write.format("diskqueue").option("path", str(tmp_path)).option("name", "q")
         .mode("overwrite").save())
    other = spark.createDataFrame([(b"x",)], "data binary")
    with pytest.raises(Exception, match=r"needs a binary column 'payload'"):
        (other.write.format("diskqueue").option("path", str(tmp_path)).option("name", "q")
         .mode("append").save())
    assert not (tmp_path / "q.diskqueue.meta.dat").exists()


# ------------------------------------------------------------------ batch write


def write_df(df: DataFrame, path: Path, name: str, **options: str) -> None:
    w = df.write.format("diskqueue").option("path", str(path)).option("name", name)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


@pytest.mark.smoke
def test_write_then_read_back_with_diskqueue(spark: SparkSession, tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "out", [b"old-%d" % i for i in range(7)]))
    df = spark.range(0, 3000, numPartitions=3).select(
        F.format_string("new-%05d", "id").cast("binary").alias("payload"))
    write_df(df, tmp_path, "out", maxBytesPerFile="4096")
    meta = load_meta(str(tmp_path / "out.diskqueue.meta.dat"))
    assert meta is not None and meta.depth == 3007
    # Every new segment obeys the roll rule: 13-byte records, 315 fit in 4096 bytes.
    lay = Layout(str(tmp_path), "out")
    sizes = [os.path.getsize(p) for n, p in sorted(lay.segments().items()) if n > 0]
    assert all(s <= 4096 for s in sizes) and sizes.count(315 * 13) >= 6
    assert not (tmp_path / ".spark-staging").exists()
    got = asyncio.run(drain(tmp_path, "out"))
    assert got == [b"old-%d" % i for i in range(7)] + [b"new-%05d" % i for i in range(3000)]


def test_write_empty_dataframe_creates_nothing(spark: SparkSession, tmp_path: Path) -> None:
    write_df(spark.createDataFrame([], "payload binary"), tmp_path, "none")
    assert not list(tmp_path.glob("none.diskqueue.*"))


def test_write_nsq_round_trip(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"hello",), (b"world",)], "body binary")
    write_df(df, tmp_path, "nsqd", format="nsq")
    rows = read_df(spark, tmp_path, "nsqd", format="nsq").orderBy("offset").collect()
    assert [bytes(r.body) for r in rows] == [b"hello", b"world"]
    assert all(len(r.id) == 16 and r.attempts == 0 and r.timestamp > 0 for r in rows)


def test_failed_write_leaves_queue_byte_for_byte(spark: SparkSession, tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "out", [b"keep-%d" % i for i in range(50)],
                     max_bytes_per_file=100))
    before = snapshot(tmp_path)

    @F.udf("binary", useArrow=False)
    def explode(i: int) -> bytes:
        if i == 2900:
            raise RuntimeError("udf failed on row 2900")
        return b"row-%d" % i

    df = spark.range(0, 3000, numPartitions=3).select(explode("id").alias("payload"))
    with pytest.raises(Exception, match="udf failed on row 2900"):
        write_df(df, tmp_path, "out", maxBytesPerFile="256")
    assert queue_files(tmp_path, "out") == queue_files_of(before, "out")
    # Tasks of the failed job may still be finishing: they drop their rows, and nothing
    # of the job is left, not even a marker.
    assert wait_for(lambda: not (tmp_path / ".spark-staging").exists())
    assert wait_for(lambda: snapshot(tmp_path).keys() == before.keys())


def test_oversize_message_fails_the_job_cleanly(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"ok",), (b"x" * 100,)], "payload binary")
    with pytest.raises(Exception, match=r"message of 100 bytes is outside \[0, 10\]"):
        write_df(df, tmp_path, "small", maxMsgSize="10")
    assert not list(tmp_path.glob("small.diskqueue.*.dat"))


async def test_write_to_open_queue_names_queue_and_pid(
        spark: SparkSession, make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(tmp_path, "busy")
    await q.put(b"first")
    await q.sync()
    before = queue_files(tmp_path, "busy")
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match=rf"cannot append to queue 'busy'.*process {os.getpid()}"):
        write_df(df, tmp_path, "busy", lockWait="0.5")
    assert queue_files(tmp_path, "busy") == before
    assert await q.get() == b"first" and q.empty()


# ------------------------------------------------------------------ streaming read


def consume_to_parquet(spark: SparkSession, qdir: Path, out: Path, name: str,
                       **options: str) -> list[tuple[int, int]]:
    reader = (spark.readStream.format("diskqueue").option("path", str(qdir))
              .option("name", name).option("consume", "true"))
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]


def sink_payloads(spark: SparkSession, out: Path) -> list[bytes]:
    return [bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect()]


@pytest.mark.smoke
def test_stream_consume_restart_no_loss_no_dups(spark: SparkSession, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    first = [b"e%05d" % i for i in range(1000)]
    asyncio.run(fill(qdir, "events", first, max_bytes_per_file=1024))
    progress = consume_to_parquet(spark, qdir, out, "events", maxRecordsPerTrigger="300")
    assert [n for _, n in progress if n] == [300, 300, 300, 100]
    got = sink_payloads(spark, out)
    assert sorted(got) == first
    meta = load_meta(str(qdir / "events.diskqueue.meta.dat"))
    assert meta is not None and meta.read == meta.write and meta.depth == 0
    # Fully consumed segments are gone; only the one holding the position stays.
    assert list(Layout(str(qdir), "events").segments()) == [meta.write_file_num]

    second = [b"f%05d" % i for i in range(500)]
    asyncio.run(fill(qdir, "events", second, max_bytes_per_file=1024))
    consume_to_parquet(spark, qdir, out, "events", maxRecordsPerTrigger="300")
    got = sink_payloads(spark, out)
    assert len(got) == 1500 and digest(got) == digest(first + second)
    assert asyncio.run(drain(qdir, "events")) == []


def test_stream_consume_failed_batch_is_replayed(spark: SparkSession, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    items = [b"r%04d" % i for i in range(600)]
    asyncio.run(fill(qdir, "events", items, max_bytes_per_file=512))

    def run(fail_on: int | None) -> None:
        def sink(df: DataFrame, batch_id: int) -> None:
            if batch_id == fail_on:
                raise RuntimeError(f"sink failed on batch {batch_id}")
            # Idempotent per batch id, as foreachBatch sinks must be.
            df.write.mode("overwrite").parquet(str(out / "data" / f"batch={batch_id}"))

        query = (spark.readStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "events").option("consume", "true")
                 .option("maxRecordsPerTrigger", "250").load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(out / "ck"))
                 .trigger(availableNow=True).start())
        if fail_on is None:
            query.awaitTermination()
        else:
            with pytest.raises(Exception, match=f"sink failed on batch {fail_on}"):
                query.awaitTermination()

    run(fail_on=2)
    # Batches 0 and 1 (500 records) are in the sink and released; batch 2 was planned
    # (it is in the offset log) but never reached the sink, so the queue still has it.
    meta = load_meta(str(qdir / "events.diskqueue.meta.dat"))
    assert meta is not None and meta.depth == 100
    run(fail_on=None)
    got = [bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect()]
    assert sorted(got) == items
    assert asyncio.run(drain(qdir, "events")) == []


def test_stream_without_consume_changes_nothing(spark: SparkSession, copy_fixture: CopyFixture,
                                                tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    copy_fixture("partial", qdir)
    before = snapshot(qdir)
    query = (spark.readStream.format("diskqueue").option("path", str(qdir))
             .option("name", "partial").option("maxBytesPerTrigger", "10000").load()
             .writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3
    assert sorted(sink_payloads(spark, out)) == FIXTURE_MESSAGES["partial"]
    assert snapshot(qdir) == before


def test_stream_consume_glob_of_queues(spark: SparkSession, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    want = []
    for k in range(3):
        items = [b"q%d-%04d" % (k, i) for i in range(200 + 50 * k)]
        asyncio.run(fill(qdir, f"events-{k}", items, max_bytes_per_file=700))
        want += items
    asyncio.run(fill(qdir, "other", [b"not me"]))
    consume_to_parquet(spark, qdir, out, "events-*", maxRecordsPerTrigger="200")
    assert sorted(sink_payloads(spark, out)) == sorted(want)
    for k in range(3):
        meta = load_meta(str(qdir / f"events-{k}.diskqueue.meta.dat"))
        assert meta is not None and meta.depth == 0 and meta.read == meta.write
    assert asyncio.run(drain(qdir, "other")) == [b"not me"]


async def test_stream_consume_of_open_queue_names_queue_and_pid(
        spark: SparkSession, make_queue: MakeQueue, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    q = await make_queue(qdir, "held")
    await q.put_many([b"h%03d" % i for i in range(100)])
    await q.sync()
    reader = (spark.readStream.format("diskqueue").option("path", str(qdir))
              .option("name", "held").option("consume", "true").option("lockWait", "0.5")
              .option("maxRecordsPerTrigger", "40").load())
    query = (reader.writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    with pytest.raises(Exception, match=rf"cannot consume queue 'held'.*process {os.getpid()}"):
        query.awaitTermination()
    # The queue still holds everything for its owner.
    assert q.qsize() == 100
    assert [await q.get() for _ in range(3)] == [b"h000", b"h001", b"h002"]


async def test_stream_consume_glob_skips_open_queue_until_closed(
        spark: SparkSession, make_queue: MakeQueue, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    closed = [b"c%03d" % i for i in range(100)]
    await fill(qdir, "events-0", closed, max_bytes_per_file=200)
    q = await make_queue(qdir, "events-1")
    live = [b"l%03d" % i for i in range(50)]
    await q.put_many(live)
    await q.sync()
    consume_to_parquet(spark, qdir, out, "events-*", maxRecordsPerTrigger="30")
    assert sorted(sink_payloads(spark, out)) == closed
    # The open queue was not read, so nothing of it was lost or taken from its owner.
    assert q.qsize() == 50
    await q.aclose()
    consume_to_parquet(spark, qdir, out, "events-*", maxRecordsPerTrigger="30")
    assert sorted(sink_payloads(spark, out)) == sorted(closed + live)
    assert await drain(qdir, "events-1") == []


# ------------------------------------------------------------------ streaming write


def test_stream_write_appends_each_batch_once(spark: SparkSession, tmp_path: Path) -> None:
    qdir, ck = tmp_path / "q", tmp_path / "ck"
    items = [b"w%04d" % i for i in range(900)]
    asyncio.run(fill(qdir, "src", items, max_bytes_per_file=1000))

    def run() -> None:
        query = (spark.readStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "src").option("maxRecordsPerTrigger", "400").load()
                 .select("payload")
                 .writeStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "dst").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run()
    # The source did not consume, so the batch can be planned again below.
    lay = Layout(str(qdir), "dst")
    query_id = json.loads((ck / "metadata").read_text().splitlines()[0])["id"]
    assert committed_batch(lay, f"{ck}#{query_id}") == 2
    # The sink appended batch 2, then the commit log entry was lost: Spark runs the batch
    # again with the same id, and the sink must not append it twice.
    (ck / "commits" / "2").unlink()
    (ck / "commits" / ".2.crc").unlink(missing_ok=True)
    run()
    meta = load_meta(lay.meta_path)
    assert meta is not None and meta.depth == 900
    # A new checkpoint in the same place is a new query: its batch 0 is not a replay.
    shutil.rmtree(ck)
    run()
    meta = load_meta(lay.meta_path)
    assert meta is not None and meta.depth == 1800
    assert asyncio.run(drain(qdir, "dst")) == items + items
    assert staging_entries(qdir) == []  # each committed batch removed what it staged


def staging_entries(directory: Path) -> list[Path]:
    """Every file and directory under ``.spark-staging`` (os.walk skips a directory that
    is removed while it looks)."""
    out = []
    for root, dirs, files in os.walk(directory / ".spark-staging"):
        out += [Path(root, n) for n in dirs + files]
    return sorted(out)


def dead_driver_job(directory: Path, name: str) -> Path:
    """A staging directory left by a killed driver (its owner process is gone)."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = process_start_time(driver.pid)
    driver.kill()
    driver.wait()
    job = directory / ".spark-staging" / name / "job-of-a-killed-driver"
    job.mkdir(parents=True)
    (job / "owner").write_text(f"{socket.gethostname()} {driver.pid} {start}\n")
    (job / "0-000000.dat").write_bytes(b"\x00\x00\x00\x01x" * 100)
    return job


@pytest.mark.slow
def test_stream_write_leaves_no_staging_behind(spark: SparkSession, tmp_path: Path) -> None:
    qdir, ck = tmp_path / "q", tmp_path / "ck"
    items = [b"b%04d" % i for i in range(500)]
    asyncio.run(fill(qdir, "src", items))
    dead_driver_job(qdir, "dst")
    counts: list[int] = []
    done = threading.Event()

    def watch() -> None:
        # Samples what the sink keeps staged while the query runs.
        while not done.wait(0.01):
            counts.append(len(staging_entries(qdir)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        query = (spark.readStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "src").option("maxRecordsPerTrigger", "10").load()
                 .select("payload")
                 .writeStream.format("diskqueue").option("path", str(qdir))
                 .option("name", "dst").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        done.set()
        watcher.join()
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 50
    # Each batch removes what it staged, and the first one what the killed driver left:
    # nothing accumulates, so no commit lists more than the one before.
    assert staging_entries(qdir) == []
    assert counts and max(counts) <= 8, counts
    assert asyncio.run(drain(qdir, "dst")) == items


def test_failed_stream_write_batch_leaves_no_staging(spark: SparkSession,
                                                    tmp_path: Path) -> None:
    qdir, ck = tmp_path / "q", tmp_path / "ck"
    items = [b"f%04d" % i for i in range(100)]
    asyncio.run(fill(qdir, "src", items))

    @F.udf("binary", useArrow=False)
    def explode(p: bytes) -> bytes:
        if p == b"f0035":
            raise RuntimeError("udf failed on f0035")
        return p

    query = (spark.readStream.format("diskqueue").option("path", str(qdir))
             .option("name", "src").option("maxRecordsPerTrigger", "10").load()
             .select(explode("payload").alias("payload"))
             .writeStream.format("diskqueue").option("path", str(qdir))
             .option("name", "dst").option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="udf failed on f0035"):
        query.awaitTermination()
    # Batches 0 to 2 are in the queue; batch 3 was aborted, and tasks of it that were
    # still running drop what they staged.
    assert asyncio.run(drain(qdir, "dst")) == items[:30]
    assert wait_for(lambda: staging_entries(qdir) == [])


def test_meta_round_trip_sanity() -> None:
    assert Meta.decode(Meta(3, 1, 2, 4, 5).encode()) == Meta(3, 1, 2, 4, 5)
