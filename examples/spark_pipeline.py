"""A queue-to-table pipeline: asyncio producers buffer events in a disk queue, a Spark
structured-streaming job drains the queue into Parquet, and restarts lose and repeat nothing.

    python examples/spark_pipeline.py [--data-dir DIR] [--events N]

1. Four asyncio producers put N events into the queue ``events`` (``DiskQueue``).
2. Spark (``local[2]``) reads the queue with ``consume=true`` and
   ``Trigger.AvailableNow``, a few thousand records per micro-batch, into Parquet
   with a checkpoint. Each committed batch is released from the queue, and its
   segment files are deleted (the file holding the read position stays, as in
   go-diskqueue, so "bytes on disk" does not reach 0). This first run is a separate driver
   process that is killed with SIGKILL (driver and JVM) after its second micro-batch.
3. The job is started again from its checkpoint: it finishes what the killed run
   left. The producers add more events; a third start picks up only those.
4. A fourth start finds nothing new. The Parquet table holds every event exactly
   once: the count and a checksum of the payloads match what was produced.

Exit status 0 when nothing was lost or duplicated, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiodiskqueue import DiskQueue, QueueLocked

QUEUE = "events"
DEFAULT_DIR = Path(tempfile.gettempdir()) / "aiodiskqueue-spark-pipeline"


def event(i: int) -> bytes:
    """Event ``i`` as the producers send it."""
    return json.dumps({"id": i, "user": f"u{i % 97}", "amount": (i * 37) % 1000 / 10}).encode()


def checksum(payloads: list[bytes]) -> str:
    """An order-independent digest of a multiset of payloads."""
    h = hashlib.sha256()
    for p in sorted(payloads):
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.hexdigest()[:16]


async def produce(directory: Path, first: int, count: int, producers: int = 4) -> None:
    """Put events ``first .. first+count-1`` from ``producers`` concurrent tasks."""
    async with DiskQueue(directory, QUEUE, max_bytes_per_file=256 * 1024) as q:

        async def one(k: int) -> None:
            batch: list[bytes] = []
            for i in range(first + k, first + count, producers):
                batch.append(event(i))
                if len(batch) == 500:
                    await q.put_many(batch)
                    batch = []
            if batch:
                await q.put_many(batch)

        await asyncio.gather(*(one(k) for k in range(producers)))


def queue_state(directory: Path, wait: float = 60.0) -> tuple[int, int]:
    """(messages waiting, bytes of segment files) of the queue, as DiskQueue sees it.

    After a killed Spark driver, its Python workers may hold the queue's lock until
    they notice the JVM is gone: wait up to ``wait`` seconds for it, as a consumer would.
    """

    async def stats() -> tuple[int, int]:
        deadline = time.monotonic() + wait
        while True:
            try:
                async with DiskQueue(directory, QUEUE) as q:
                    s = q.statistics()
                    return s.depth, s.bytes_on_disk
            except QueueLocked:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    return asyncio.run(stats())


def start_spark() -> Any:
    """A local[2] SparkSession with the ``diskqueue`` format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import aiodiskqueue.spark

    spark = (SparkSession.builder.master("local[2]").appName("aiodiskqueue-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    aiodiskqueue.spark.register(spark)
    return spark


def start_job(spark: Any, queues: Path, table: Path, checkpoint: Path) -> Any:
    """Start the streaming job; returns its StreamingQuery."""
    return (
        spark.readStream.format("diskqueue")
        .option("path", str(queues))
        .option("name", QUEUE)
        .option("consume", "true")
        .option("maxRecordsPerTrigger", "4000")
        .load()
        .select("payload", "file_num", "offset")
        .writeStream.format("parquet")
        .option("path", str(table))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run_job(spark: Any, queues: Path, table: Path, checkpoint: Path) -> list[int]:
    """One start of the streaming job; returns the rows of each micro-batch it ran."""
    query = start_job(spark, queues, table, checkpoint)
    query.awaitTermination()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def crash_run(data_dir: Path) -> None:
    """Run the job and kill this driver, JVM included, after its second micro-batch."""
    spark = start_spark()
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    query = start_job(spark, data_dir / "queues", data_dir / "table", data_dir / "checkpoint")
    while query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] >= 1:
            os.kill(jvm_pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)  # polling the query's own progress, nothing to wait on
    raise SystemExit("the job finished before it could be killed; use more --events")


@dataclass(frozen=True)
class PipelineResult:
    """What the pipeline produced and what landed in the table."""

    produced: int
    stored: int
    distinct: int
    produced_checksum: str
    stored_checksum: str

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing duplicated."""
        return (self.produced == self.stored == self.distinct
                and self.produced_checksum == self.stored_checksum)


def run_pipeline(data_dir: Path, events: int = 20_000, spark: Any = None,
                 log: Any = print) -> PipelineResult:
    """Run the whole pipeline in ``data_dir`` (wiped first) and check the table."""
    shutil.rmtree(data_dir, ignore_errors=True)
    queues, table, checkpoint = data_dir / "queues", data_dir / "table", data_dir / "checkpoint"
    first, more = events, events // 4
    t0 = time.monotonic()
    asyncio.run(produce(queues, 0, first))
    depth, size = queue_state(queues)
    log(f"produced {first} events with 4 asyncio producers: queue depth {depth}, "
        f"{size:,} bytes on disk")
    log("job run 1: a separate Spark driver, killed with SIGKILL after 2 micro-batches ...")
    child = subprocess.run([sys.executable, __file__, "--data-dir", str(data_dir),
                            "--crash-run"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
    depth, size = queue_state(queues)
    log(f"job run 1: killed (exit status {child.returncode}); queue depth {depth}, "
        f"{size:,} bytes on disk")
    own = spark is None
    if own:
        spark = start_spark()
    try:
        batches = run_job(spark, queues, table, checkpoint)
        depth, size = queue_state(queues)
        log(f"job run 2 (restart from the checkpoint): micro-batches {batches}; "
            f"queue depth {depth}, {size:,} bytes on disk")
        asyncio.run(produce(queues, first, more))
        log(f"produced {more} more events")
        batches = run_job(spark, queues, table, checkpoint)
        depth, size = queue_state(queues)
        log(f"job run 3 (restart): micro-batches {batches}; "
            f"queue depth {depth}, {size:,} bytes on disk")
        batches = run_job(spark, queues, table, checkpoint)
        log(f"job run 4 (restart, nothing new): micro-batches {batches or 'none'}")
        rows = spark.read.parquet(str(table)).select("payload").collect()
    finally:
        if own:
            spark.stop()
    stored = [bytes(r.payload) for r in rows]
    produced = [event(i) for i in range(first + more)]
    result = PipelineResult(len(produced), len(stored), len(set(stored)),
                            checksum(produced), checksum(stored))
    log(f"produced {result.produced} (checksum {result.produced_checksum}); "
        f"table has {result.stored} rows, {result.distinct} distinct "
        f"(checksum {result.stored_checksum})")
    lost = len(set(produced) - set(stored))
    log(f"lost: {lost}, duplicated: {result.stored - result.distinct} -> "
        f"{'OK' if result.ok else 'MISMATCH'} ({time.monotonic() - t0:.1f} s)")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR,
                        help="where queues, table and checkpoint go "
                             f"(wiped; default {DEFAULT_DIR})")
    parser.add_argument("--events", type=int, default=20_000, help="events in the first round")
    parser.add_argument("--crash-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash_run:
        crash_run(args.data_dir)
        return 1
    return 0 if run_pipeline(args.data_dir, args.events).ok else 1


if __name__ == "__main__":
    sys.exit(main())
