"""Rows per second of the ``diskqueue`` Spark data source, against Spark's own text source
in the same run, and the cost of many queues for a consuming stream.

    python bench/bench_spark.py [--rows 1000000] [--reps 3] [--queues-rows 30000]
                                [--only throughput|queues] [--data-dir DIR]

Throughput (Spark ``local[2]``, ``--rows`` payloads ``%010d`` + filler, 100 MiB segments;
the anchor is Spark's text source reading the same payloads one per line):

* ``count``: ``count()`` of 100-byte payloads; once more with a schema of one column
  (``offset long``), as the Spark guide suggests for counting.
* ``sum(length)``: ``sum(length(payload))`` of 1 KiB payloads.
* ``to parquet``: a read of 100-byte payloads written to Parquet.

Many queues (a consuming stream, ``consume=true``, ``maxRecordsPerTrigger=3000``,
``availableNow``, into Parquet; ``--queues-rows`` rows of 100 B; the anchor is one queue):

* ``300 queues``: the same rows spread over 300 queues.
* ``1 queue + 2,000 drained``: one queue beside 2,000 drained queues.

A small stream runs first, untimed, so that the anchor does not pay for the
session's first stream. The note gives ``latestOffset`` per trigger (median, max).

Columns: rows/s, the ratio to the anchor of the same group, ``cpu``: CPU seconds of the
Spark JVM and every Python process under it per wall second (2 = both cores busy).
Every row is checked (row count, and payload bytes where summed); a mismatch exits
with status 1. Setup is not timed; a warm-up read starts the Python workers first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(tempfile.gettempdir()) / "aiodiskqueue-bench-spark"
Row = tuple[str, str, float, str, float, str]  # group, what, rows/s, ratio, cpu, note


def payload(i: int, size: int) -> bytes:
    """Payload ``i``: a 10-digit index, then filler, ``size`` bytes in all."""
    head = b"%010d" % i
    return head + b"x" * (size - len(head))


async def fill(directory: Path, name: str, rows: int, size: int, first: int = 0) -> None:
    """Put ``rows`` payloads of ``size`` bytes into queue ``name`` (default 100 MiB segments,
    so 1 M x 100 B is one segment)."""
    from aiodiskqueue import DiskQueue

    async with DiskQueue(directory, name, max_msg_size=max(size, 1 << 20)) as q:
        step = 10_000
        for start in range(first, first + rows, step):
            await q.put_many([payload(i, size) for i in range(start, min(first + rows,
                                                                          start + step))])


def write_text(path: Path, rows: int, size: int) -> None:
    """The same payloads, one per line, in 4 files."""
    path.mkdir(parents=True, exist_ok=True)
    per = -(-rows // 4)
    for k in range(4):
        with open(path / f"part-{k}.txt", "wb") as f:
            for start in range(k * per, min(rows, (k + 1) * per), 10_000):
                stop = min(rows, (k + 1) * per, start + 10_000)
                f.write(b"\n".join(payload(i, size) for i in range(start, stop)) + b"\n")


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


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of process ``root`` and all its descendants (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def timed(spark: Any, run: Callable[[], Any], want: Any, reps: int) -> tuple[float, float]:
    """Median seconds of ``reps`` runs of ``run`` and CPU per wall second over all of them.

    Exits with status 1 if a run returns something other than ``want``.
    """
    jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    times = []
    cpu0, wall0 = tree_cpu(jvm) + time.process_time(), time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        got = run()
        times.append(time.perf_counter() - t0)
        if got != want:
            raise SystemExit(f"check failed: got {got}, want {want}")
    cpu = (tree_cpu(jvm) + time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return statistics.median(times), cpu


def throughput(spark: Any, d: Path, rows: int, reps: int) -> list[Row]:
    """The three throughput pairs: diskqueue against the text source."""
    from pyspark.sql import functions as F

    out: list[Row] = []
    for what, size in (("count", 100), ("sum(length)", 1024), ("to parquet", 100)):
        qdir, tdir = d / f"q{size}", d / f"t{size}"
        if not qdir.exists():
            asyncio.run(fill(qdir, "src", rows, size))
            write_text(tdir, rows, size)
        dq = (spark.read.format("diskqueue").option("path", str(qdir)).option("name", "src")
              .option("maxMsgSize", str(max(size, 1 << 20))).load())
        text = spark.read.text(str(tdir))
        dq.limit(1).collect()  # warm-up: starts the Python workers
        if what == "count":
            runs = {"text": lambda t=text: t.count(), "diskqueue": lambda q=dq: q.count()}
            want: Any = rows
        elif what == "sum(length)":
            runs = {"text": lambda t=text: t.agg(F.sum(F.length("value"))).collect()[0][0],
                    "diskqueue": lambda q=dq: q.agg(F.sum(F.length("payload"))).collect()[0][0]}
            want = rows * size
        else:
            pq = str(d / "parquet")

            def to_parquet(df: Any, where: str = pq) -> int:
                df.write.mode("overwrite").parquet(where)
                return int(spark.read.parquet(where).count())

            runs = {"text": lambda t=text: to_parquet(t.select(F.col("value").cast("binary"))),
                    "diskqueue": lambda q=dq: to_parquet(q.select("payload"))}
            want = rows
        if what == "count":
            # Spark hands a Python data source no column pruning: every column crosses to
            # the JVM and is copied row by row. A schema that names one column is how a
            # user counts with less (see the Spark guide).
            narrow = (spark.read.format("diskqueue").schema("offset long")
                      .option("path", str(qdir)).option("name", "src")
                      .option("maxMsgSize", str(max(size, 1 << 20))).load())
            runs["diskqueue, schema 'offset long'"] = lambda q=narrow: q.count()
        t_text, c_text = timed(spark, runs.pop("text"), want, reps)
        group = f"{size} B {what}"
        out.append((group, "text source", rows / t_text, "anchor", c_text, ""))
        for name, run in runs.items():
            t_dq, c_dq = timed(spark, run, want, reps)
            out.append((group, name, rows / t_dq, f"{t_text / t_dq:.2f}x", c_dq, ""))
        print_rows(out[-1 - len(runs):])
    return out


def consume_run(spark: Any, qdir: Path, out: Path,
                name: str) -> tuple[float, int, list[float], int]:
    """A consuming availableNow stream into Parquet: (seconds, rows, latestOffset ms of
    each trigger, output files)."""
    query = (spark.readStream.format("diskqueue").option("path", str(qdir)).option("name", name)
             .option("consume", "true").option("maxRecordsPerTrigger", "3000").load()
             .writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True))
    t0 = time.perf_counter()
    for attempt in range(3):
        try:
            q = query.start()
            q.awaitTermination()
            break
        except Exception as exc:
            # A loaded machine can miss Spark's fixed 10 s for a new Python worker to
            # connect back; the query has read nothing then, so run it again.
            if "failed to connect back" not in str(exc) or attempt == 2:
                raise
            print(f"# {name}: Python worker did not connect back in time; again", flush=True)
            t0 = time.perf_counter()
    took = time.perf_counter() - t0
    progress = q.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    lat = [float(p["durationMs"].get("latestOffset", 0)) for p in progress]
    files = len(list((out / "data").glob("*.parquet")))
    return took, rows, lat, files


def many_queues(spark: Any, d: Path, rows: int) -> list[Row]:
    """One queue, 300 queues, one queue beside 2,000 drained queues."""
    from aiodiskqueue._format.layout import Layout

    out: list[Row] = []
    anchor = 0.0
    jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    # Warm-up, not timed: the session's first stream loads the streaming code paths.
    asyncio.run(fill(d / "mq" / "warmup", "events-warmup", 3000, 100))
    consume_run(spark, d / "mq" / "warmup", d / "mqout" / "warmup", "events-*")
    for what in ("1 queue", "300 queues", "1 queue + 2,000 drained"):
        qdir, odir = d / "mq" / what.replace(" ", "_"), d / "mqout" / what.replace(" ", "_")
        if what == "300 queues":
            per = rows // 300
            for k in range(300):
                asyncio.run(fill(qdir, f"events-{k:04d}", per, 100, k * per))
        else:
            asyncio.run(fill(qdir, "events-live", rows, 100))
        if what.endswith("drained"):
            for k in range(2000):
                lay = Layout(str(qdir), f"events-{k:04d}")
                with open(lay.segment_path(0), "wb") as f:
                    f.write(b"\x00\x00\x00\x01x")
                with open(lay.meta_path, "wb") as f:
                    f.write(b"0\n0,5\n0,5\n")
        cpu0, wall0 = tree_cpu(jvm) + time.process_time(), time.perf_counter()
        took, got, lat, files = consume_run(spark, qdir, odir, "events-*")
        cpu = (tree_cpu(jvm) + time.process_time() - cpu0) / (time.perf_counter() - wall0)
        if got != rows:
            raise SystemExit(f"check failed: {what}: {got} rows, want {rows}")
        rate = rows / took
        anchor = anchor or rate
        note = (f"latestOffset median {statistics.median(lat or [0]):.0f} ms, "
                f"max {max(lat or [0]):.0f} ms; {files} parquet files")
        out.append((f"{rows:,} x 100 B consume", what, rate,
                    "anchor" if rate == anchor else f"{rate / anchor:.2f}x", cpu, note))
        print_rows(out[-1:])
    return out


def print_rows(rows: list[Row]) -> None:
    """Print table rows as they are measured (a later failure keeps them)."""
    for group, what, rate, ratio, cpu, note in rows:
        print(f"| {group:<24} | {what:<24} | {rate:>11,.0f} | {ratio:>6} | {cpu:.2f} | {note} |",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queues-rows", type=int, default=30_000)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per row (median)")
    parser.add_argument("--only", choices=("throughput", "queues"))
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    shutil.rmtree(args.data_dir, ignore_errors=True)
    spark = start_spark()
    results: list[Row] = []
    try:
        if args.only in (None, "throughput"):
            results += throughput(spark, args.data_dir, args.rows, args.reps)
        if args.only in (None, "queues"):
            results += many_queues(spark, args.data_dir, args.queues_rows)
    finally:
        spark.stop()
        shutil.rmtree(args.data_dir, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nSpark local[2], median of {args.reps}; load average {load[0]:.1f}\n")
    print(f"| {'workload':<24} | {'source':<24} | {'rows/s':>11} | {'ratio':>6} | cpu | note |")
    print(f"|{'-' * 26}|{'-' * 26}|{'-' * 12}:|{'-' * 7}:|----:|------|")
    print_rows(results)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
