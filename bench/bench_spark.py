"""Rows per second of the ``diskqueue`` Spark data source, against anchors in the same run.

    python bench/bench_spark.py [--rows 1000000] [--sizes 100,1024] [--data-dir DIR]

For each payload size, on Spark ``local[2]``:

* ``read tuples`` / ``read arrow``: a batch read of a queue of ``--rows`` records
  (``arrow=false`` / ``arrow=true``), every payload materialized (sum of lengths).
* ``write``: ``df.write.format("diskqueue")`` of ``--rows`` generated payloads.

Anchors, same data, same session:

* ``python source, no I/O``: a minimal Python data source that yields prebuilt
  Arrow batches of the same shape without touching a disk: what the Python Data
  Source API itself costs here.
* ``parquet read`` / ``parquet write``: Spark's built-in JVM file source and sink.

Every row is checked (count and total payload bytes); a mismatch exits with status 1.
Setup (filling the source queue) is not timed. The first Spark job of the session
starts the Python workers, so a warm-up read runs before any timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(tempfile.gettempdir()) / "aiodiskqueue-bench-spark"


def payload(i: int, size: int) -> bytes:
    """Payload ``i``: a 10-digit index, then filler, ``size`` bytes in all."""
    head = b"%010d" % i
    return head + b"x" * (size - len(head))


async def fill(directory: Path, name: str, rows: int, size: int) -> None:
    """Put ``rows`` payloads of ``size`` bytes into queue ``name`` (16 MiB segments)."""
    from aiodiskqueue import DiskQueue

    async with DiskQueue(directory, name, max_bytes_per_file=16 << 20,
                         max_msg_size=max(size, 1 << 20)) as q:
        step = 10_000
        for start in range(0, rows, step):
            await q.put_many([payload(i, size) for i in range(start, min(rows, start + step))])


def start_spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import aiodiskqueue.spark

    spark = (SparkSession.builder.master("local[2]").appName("aiodiskqueue-bench-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    aiodiskqueue.spark.register(spark)
    return spark


def ceiling_source(rows: int, size: int) -> Any:
    """A Python data source yielding ``rows`` prebuilt Arrow rows of our schema, no I/O."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    per_part = -(-rows // 2)

    class CeilingReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(k) for k in range(2)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            n = min(per_part, rows - partition.value * per_part)
            chunk = 10_000
            body = b"y" * size
            batch = pa.RecordBatch.from_arrays(
                [pa.array(["bench"] * chunk), pa.array([0] * chunk, pa.int64()),
                 pa.array(range(chunk), pa.int64()), pa.array([body] * chunk, pa.binary())],
                names=["name", "file_num", "offset", "payload"])
            while n > 0:
                yield batch if n >= chunk else batch.slice(0, n)
                n -= chunk

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_ceiling"

        def schema(self) -> str:
            return "name string, file_num long, offset long, payload binary"

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader()

    return CeilingSource


def timed(run: Callable[[], object], check: Callable[[], tuple[int, int]],
          want: tuple[int, int], reps: int) -> float:
    """Median seconds of ``reps`` runs of ``run``; after each (untimed), ``check()`` must
    return ``want`` (rows, payload bytes)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        got = run()
        times.append(time.perf_counter() - t0)
        if not isinstance(got, tuple):
            got = check()
        if got != want:
            raise SystemExit(f"check failed: got (rows, bytes) {got}, want {want}")
    return statistics.median(times)


def bench_size(spark: Any, d: Path, rows: int, size: int, reps: int
               ) -> list[tuple[str, int, float, str]]:
    """All rows of the table for one payload size."""
    from pyspark.sql import functions as F

    from aiodiskqueue._format.layout import Layout
    from aiodiskqueue._format.meta import load_meta

    asyncio.run(fill(d / "queues", "src", rows, size))
    want = (rows, rows * size)

    def measure(df: Any) -> tuple[int, int]:
        r = df.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).collect()[0]
        return (int(r.n), int(r.b or 0))

    def read(arrow: str) -> tuple[int, int]:
        return measure(spark.read.format("diskqueue").option("path", str(d / "queues"))
                       .option("name", "src").option("arrow", arrow).load())

    spark.dataSource.register(ceiling_source(rows, size))
    ceiling = spark.read.format("bench_ceiling").load()
    read("true")  # warm-up: starts the Python workers
    measure(ceiling)

    def no_check() -> tuple[int, int]:
        return (-1, -1)

    t_tuples = timed(lambda: read("false"), no_check, want, reps)
    t_arrow = timed(lambda: read("true"), no_check, want, reps)
    t_ceiling = timed(lambda: measure(ceiling), no_check, want, reps)

    gen = spark.range(rows, numPartitions=2).select(
        F.concat(F.lpad(F.col("id").cast("string"), 10, "0"),
                 F.repeat(F.lit("x"), size - 10)).cast("binary").alias("payload"))
    out = Layout(str(d / "written"), "dst")

    def write_queue() -> None:
        shutil.rmtree(out.directory, ignore_errors=True)
        (gen.write.format("diskqueue").option("path", out.directory).option("name", "dst")
         .option("maxMsgSize", str(max(size, 1 << 20))).mode("append").save())

    def check_queue() -> tuple[int, int]:
        meta = load_meta(out.meta_path)
        total = sum(os.path.getsize(p) for p in out.segments().values())
        return (meta.depth if meta else 0, total - 4 * rows)

    def write_parquet() -> None:
        gen.write.mode("overwrite").parquet(str(d / "parquet"))

    def check_parquet() -> tuple[int, int]:
        return measure(spark.read.parquet(str(d / "parquet")))

    t_write = timed(write_queue, check_queue, want, reps)
    t_pq_write = timed(write_parquet, check_parquet, want, reps)
    t_pq_read = timed(check_parquet, no_check, want, reps)
    shutil.rmtree(d, ignore_errors=True)
    return [
        ("read tuples", size, rows / t_tuples,
         f"{t_ceiling / t_tuples:.2f}x no-I/O source, {t_pq_read / t_tuples:.2f}x parquet read"),
        ("read arrow", size, rows / t_arrow,
         (f"{t_ceiling / t_arrow:.2f}x no-I/O source, {t_pq_read / t_arrow:.2f}x parquet read, "
          f"{t_tuples / t_arrow:.2f}x tuples")),
        ("write", size, rows / t_write, f"{t_pq_write / t_write:.2f}x parquet write"),
        ("python source, no I/O", size, rows / t_ceiling, "anchor"),
        ("parquet read", size, rows / t_pq_read, "anchor"),
        ("parquet write", size, rows / t_pq_write, "anchor"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="100,1024", help="payload sizes in bytes")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per row (median)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = args.rows
    shutil.rmtree(args.data_dir, ignore_errors=True)
    spark = start_spark()
    results: list[tuple[str, int, float, str]] = []
    try:
        for size in sizes:
            results += bench_size(spark, args.data_dir / f"s{size}", rows, size, args.reps)
    finally:
        spark.stop()
        shutil.rmtree(args.data_dir, ignore_errors=True)
    print(f"\n{rows:,} rows, Spark local[2], median of {args.reps}\n")
    print(f"| {'workload':<22} | {'payload':>7} | {'rows/s':>11} | vs anchors |")
    print(f"|{'-' * 24}|{'-' * 9}:|{'-' * 12}:|{'-' * 12}|")
    for what, size, r, note in results:
        print(f"| {what:<22} | {size:>5} B | {r:>11,.0f} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
