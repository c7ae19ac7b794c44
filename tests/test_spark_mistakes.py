"""The ``diskqueue`` source under Spark ``local[2]``: mistakes fail loudly, lost data is
reported, the advice in errors works, streams survive short-lived lock holders,
one segment splits into parallel partitions.

Shares the one SparkSession of the test session (``getOrCreate``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers_spark import payloads, read_df
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from aiodiskqueue import DiskQueue, QueueLocked
from aiodiskqueue._format.layout import Layout
from aiodiskqueue._format.lock import QueueLock
from aiodiskqueue.spark._staging import process_start_time

pytestmark = pytest.mark.spark


async def fill(directory: Path, name: str, items: list[bytes], **options: Any) -> None:
    async with DiskQueue(directory, name, **options) as q:
        await q.put_many(items)


def run_stream(spark: SparkSession, qdir: Path, out: Path, name: str, **options: str) -> Any:
    reader = spark.readStream.format("diskqueue").option("path", str(qdir)).option("name", name)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def sink(spark: SparkSession, out: Path) -> list[bytes]:
    return sorted(bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect())


# ------------------------------------------------------------------ loud on mistakes


def test_missing_path_and_unmatched_name_fail_batch_and_stream(spark: SparkSession,
                                                              tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(Exception, match=rf"\[PATH_NOT_FOUND\] diskqueue: path '{missing}' "
                                        r"does not exist \(option name='q'\)"):
        read_df(spark, missing, "q").collect()
    asyncio.run(fill(tmp_path, "other", [b"x"]))
    with pytest.raises(Exception, match=r"PATH_NOT_FOUND.*holds no queue matching 'ev-\*'"):
        read_df(spark, tmp_path, "ev-*").collect()
    with pytest.raises(Exception, match=rf"PATH_NOT_FOUND.*'{missing}' does not exist"):
        run_stream(spark, missing, tmp_path / "out1", "q", consume="true")
    with pytest.raises(Exception, match=r"PATH_NOT_FOUND.*holds no queue matching 'ev-\*'"):
        run_stream(spark, tmp_path, tmp_path / "out2", "ev-*", consume="true")


def test_unknown_and_misplaced_options_fail(spark: SparkSession, tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "q", [b"x"]))
    # Spark passes option keys in lower case; the message spells them as typed.
    with pytest.raises(Exception, match=r"option 'maxRecordPerTrigger' is unknown; did you "
                                        r"mean 'maxRecordsPerTrigger'\? valid options: path, "):
        (spark.readStream.format("diskqueue").option("path", str(tmp_path)).option("name", "q")
         .option("maxRecordPerTrigger", "10").load())
    with pytest.raises(Exception, match=r"option 'consume' does not apply to a batch read "
                                        r"\(it applies to: streaming read\)"):
        read_df(spark, tmp_path, "q", consume="true").collect()
    with pytest.raises(Exception, match=r"option 'maxRecordsPerTrigger' does not apply to a "
                                        r"batch read"):
        read_df(spark, tmp_path, "q", maxRecordsPerTrigger="5").collect()


def test_user_schema_is_honoured_or_refused(spark: SparkSession, tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path, "q", [b"a", b"bb"]))
    df = (spark.read.format("diskqueue").schema("payload binary, offset long")
          .option("path", str(tmp_path)).option("name", "q").load())
    assert df.columns == ["payload", "offset"]
    assert [(bytes(r.payload), r.offset) for r in df.orderBy("offset").collect()] == [
        (b"a", 0), (b"bb", 5)]
    tuples = (spark.read.format("diskqueue").schema("offset long").option("arrow", "false")
              .option("path", str(tmp_path)).option("name", "q").load())
    assert sorted(r.offset for r in tuples.collect()) == [0, 5]
    bad = (spark.read.format("diskqueue").schema("value string")
           .option("path", str(tmp_path)).option("name", "q").load())
    with pytest.raises(Exception, match=r"SchemaMismatch: diskqueue: the schema given to the "
                                        r"reader asks for 'value string'"):
        bad.collect()


def test_write_without_mode_names_the_modes_and_writes_nothing(spark: SparkSession,
                                                                tmp_path: Path) -> None:
    # Spark refuses the default mode (ErrorIfExists) for every Python data source before
    # the source is asked; the README says to use mode("append").
    df = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match=r"UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*\"Append\""):
        df.write.format("diskqueue").option("path", str(tmp_path)).option("name", "q").save()
    assert not list(tmp_path.iterdir())


def test_missing_middle_segment_fails_a_batch_read(spark: SparkSession, tmp_path: Path) -> None:
    items = [b"m%04d" % i for i in range(300)]
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=900))
    os.remove(Layout(str(tmp_path), "q").segment_path(1))
    with pytest.raises(Exception, match=r"DataLoss: diskqueue: data loss in queue 'q': the "
                                        r"records between positions \[1, 0\] to \[2, 0\]"):
        read_df(spark, tmp_path, "q").collect()
    assert payloads(read_df(spark, tmp_path, "q", failOnDataLoss="false")) == (
        items[:100] + items[200:])


def test_corrupt_segment_advice_makes_the_next_read_succeed(spark: SparkSession,
                                                            tmp_path: Path) -> None:
    items = [b"c%04d" % i for i in range(300)]
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=900))
    seg = Layout(str(tmp_path), "q").segment_path(1)
    with open(seg, "r+b") as f:
        f.seek(9 * 50)  # the length field of the 51st record of segment 1
        f.write(b"\x7f\xff\xff\xff")
    with pytest.raises(Exception, match="repair the queue with") as info:
        read_df(spark, tmp_path, "q").collect()
    found = re.search(r"repair the queue with '([^']+)'", str(info.value))
    assert found is not None, str(info.value)
    command = shlex.split(found.group(1))
    assert command[:4] == ["python", "-m", "aiodiskqueue", "repair"]
    done = subprocess.run([sys.executable, *command[1:]], check=False, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    # Every whole record before the damage is kept; the rest of that file is quarantined.
    assert payloads(read_df(spark, tmp_path, "q")) == items[:150] + items[200:]


def test_torn_record_in_a_completed_segment_fails_a_batch_read(spark: SparkSession,
                                                               tmp_path: Path) -> None:
    items = [b"t%05d" % i for i in range(3000)]  # 10 bytes a record, 1,000 a segment
    asyncio.run(fill(tmp_path, "q", items, max_bytes_per_file=10_000))
    seg = Layout(str(tmp_path), "q").segment_path(1)
    os.truncate(seg, os.path.getsize(seg) - 3)  # the last record of segment 1 is torn
    with pytest.raises(Exception, match=(
            rf"DataLoss: diskqueue: data loss in queue 'q': {re.escape(seg)} is a completed "
            r"segment \(a later one follows\) but its last 7 byte\(s\), from byte 9990, are "
            r"not a whole record.*'python -m aiodiskqueue repair ")):
        read_df(spark, tmp_path, "q").collect()
    assert payloads(read_df(spark, tmp_path, "q", failOnDataLoss="false")) == (
        items[:1999] + items[2000:])


# ------------------------------------------------------------------ streams


def test_consume_stream_waits_for_a_briefly_held_single_queue(spark: SparkSession,
                                                              tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    items = [b"w%04d" % i for i in range(1200)]
    asyncio.run(fill(qdir, "events", items, max_bytes_per_file=2000))
    stop = threading.Event()
    held = threading.Event()

    def producer() -> None:  # holds the queue 0.4 s out of every 0.8 s
        while not stop.is_set():
            lock = QueueLock(Layout(str(qdir), "events").lock_path)
            try:
                lock.acquire()
            except QueueLocked:  # the stream holds it now: come back shortly
                stop.wait(0.05)
                continue
            held.set()
            stop.wait(0.4)
            lock.release()
            stop.wait(0.4)

    t = threading.Thread(target=producer)
    t.start()
    try:
        held.wait()
        query = run_stream(spark, qdir, out, "events", consume="true", lockWait="5",
                           maxRecordsPerTrigger="200")
    finally:
        stop.set()
        t.join()
    assert query.exception() is None
    assert sink(spark, out) == items


def test_stream_data_loss_fails_then_goes_on_with_fail_on_data_loss_false(
        spark: SparkSession, tmp_path: Path) -> None:
    qdir, out = tmp_path / "q", tmp_path / "out"
    items = [b"r%04d" % i for i in range(300)]
    asyncio.run(fill(qdir, "events", items, max_bytes_per_file=500))

    def run(fail_on: int | None, **options: str) -> Any:
        def sink(df: DataFrame, batch_id: int) -> None:
            if batch_id == fail_on:
                raise RuntimeError(f"sink failed on batch {batch_id}")
            df.write.mode("overwrite").parquet(str(out / "data" / f"batch={batch_id}"))

        reader = (spark.readStream.format("diskqueue").option("path", str(qdir))
                  .option("name", "events").option("consume", "true")
                  .option("maxRecordsPerTrigger", "100"))
        for k, v in options.items():
            reader = reader.option(k, v)
        query = (reader.load().writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(out / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        return query

    with pytest.raises(Exception, match="sink failed on batch 1"):
        run(fail_on=1)
    # Batch 0 is in the sink and released; batch 1 (records 100-199) is planned. Another
    # consumer takes records 100-249 before the query restarts.

    async def worker() -> None:
        async with DiskQueue(qdir, "events", max_bytes_per_file=500) as q:
            assert [await q.get() for _ in range(150)] == items[100:250]

    asyncio.run(worker())
    with pytest.raises(Exception, match=r"data loss in queue 'events': the records between "
                                        r"positions .* are gone.*failOnDataLoss=false"):
        run(fail_on=None)
    # The same checkpoint goes on, from the oldest record still there.
    assert run(fail_on=None, failOnDataLoss="false").exception() is None
    got = sorted(bytes(r.payload) for r in spark.read.parquet(str(out / "data")).collect())
    assert got == items[:100] + items[250:]


# ------------------------------------------------------------------ parallel reads


def test_one_big_segment_is_cut_by_each_read_s_options(spark: SparkSession,
                                                       tmp_path: Path) -> None:
    items = [b"%010d" % i + b"p" * 90 for i in range(52_500)]  # 5.5 MB in one segment
    asyncio.run(fill(tmp_path, "big", items, max_bytes_per_file=64 << 20))
    lay = Layout(str(tmp_path), "big")
    assert len(lay.segments()) == 1
    size = os.path.getsize(lay.segment_path(0))
    assert size == 52_500 * 104
    # Spark's file sources spread a read over the CPUs, in pieces of 4 MiB at least.
    default = -(-size // max(4 << 20, -(-size // (os.cpu_count() or 1))))
    # The same segment read three times in one session: each read is cut by its own options.
    for extra, count in [({}, default), ({"minPartitions": "8"}, 8),
                         ({"maxBytesPerPartition": "262144"}, 21)]:
        df = read_df(spark, tmp_path, "big", **extra)
        assert df.rdd.getNumPartitions() == count, extra
        # Every record exactly once: 52,500 rows, each at the offset its number says.
        (row,) = df.select(
            F.count("*").alias("rows"),
            F.count_distinct("offset").alias("offsets"),
            F.sum((F.col("offset") != F.substring(F.col("payload").cast("string"), 1, 10)
                   .cast("long") * 104).cast("int")).alias("misplaced"),
        ).collect()
        assert (row.rows, row.offsets, row.misplaced) == (52_500, 52_500, 0), extra


# ------------------------------------------------------------------ staged files


def test_next_write_removes_what_a_killed_driver_staged(spark: SparkSession,
                                                        tmp_path: Path) -> None:
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = process_start_time(driver.pid)
    driver.kill()
    driver.wait()
    job = tmp_path / ".spark-staging" / "q" / "job-of-a-killed-driver"
    job.mkdir(parents=True)
    (job / "owner").write_text(f"{socket.gethostname()} {driver.pid} {start}\n")
    (job / "0-000000.dat").write_bytes(b"\x00\x00\x00\x01x" * 1000)
    # The next write of any size (here: none) to that queue removes it.
    (spark.createDataFrame([], "payload binary").write.format("diskqueue")
     .option("path", str(tmp_path)).option("name", "q").mode("append").save())
    assert not (tmp_path / ".spark-staging").exists()
