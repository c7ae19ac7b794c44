"""The main demo: put, crash with SIGKILL, reopen, drain — then the Spark pipeline.

    python examples/demo.py [--data-dir DIR] [--no-spark]

1. A producer process puts numbered messages and prints each number once its
   ``put()`` has returned. The demo kills it with SIGKILL part-way through.
2. The queue is reopened: every acknowledged message is there, in order, with
   no gap, including those written after the last meta sync (recovered from the
   tail of the write segment).
3. A consumer takes half, the queue is closed cleanly and reopened: the rest
   comes back where it left off.
4. If pyspark is installed, ``examples/spark_pipeline.py`` runs next.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from aiodiskqueue import DiskQueue

PRODUCER = r"""
import asyncio, sys
from aiodiskqueue import DiskQueue
async def main(d):
    async with DiskQueue(d, "events", max_bytes_per_file=64 * 1024) as q:
        i = 0
        while True:
            await q.put(b"event-%08d" % i)
            print(i, flush=True)
            i += 1
asyncio.run(main(sys.argv[1]))
"""


def crash_producer(data_dir: str, kill_after: int) -> int:
    """Run the producer, SIGKILL it after ``kill_after`` acknowledgements; return the last one."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, data_dir],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    last = -1
    for line in proc.stdout:
        last = int(line)
        if last + 1 >= kill_after:
            proc.send_signal(signal.SIGKILL)
            break
    # Acknowledgements already in the pipe when the kill landed still count.
    for line in proc.stdout:
        last = int(line)
    proc.wait()
    return last


async def check_after_crash(data_dir: str, last_acked: int) -> None:
    t0 = time.perf_counter()
    async with DiskQueue(data_dir, "events", max_bytes_per_file=64 * 1024) as q:
        st = q.statistics()
        opened = time.perf_counter() - t0
        print(f"reopened in {opened * 1000:.1f} ms: depth={st.depth}, "
              f"recovered past the last meta sync={st.recovered}, "
              f"segments {st.read_file_num}..{st.write_file_num}")
        expected = 0
        half = st.depth // 2
        for _ in range(half):
            msg = await q.get()
            assert msg == b"event-%08d" % expected, (msg, expected)
            expected += 1
        print(f"consumed {half} in order; closing cleanly")
    async with DiskQueue(data_dir, "events", max_bytes_per_file=64 * 1024) as q:
        print(f"reopened: depth={q.qsize()}, next message is number {expected}")
        while not q.empty():
            msg = await q.get()
            assert msg == b"event-%08d" % expected, (msg, expected)
            expected += 1
        await q.sync()  # stores the meta; fully consumed segments are deleted after it
        st = q.statistics()
    assert expected - 1 >= last_acked, f"lost messages: last acked {last_acked}, got {expected - 1}"
    print(f"drained: every acknowledged message 0..{last_acked} came back exactly once, in order "
          f"({expected} in all; {expected - 1 - last_acked} more were written but not yet acked "
          f"when the kill landed); bytes on disk now {st.bytes_on_disk}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.path.join(os.getcwd(), "demo-data"))
    ap.add_argument("--messages", type=int, default=50_000,
                    help="kill the producer after this many")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    qdir = os.path.join(args.data_dir, "queues")
    shutil.rmtree(qdir, ignore_errors=True)
    os.makedirs(qdir)
    print(f"== 1. producer in {qdir}, killed with SIGKILL after {args.messages} acknowledged puts")
    last = crash_producer(qdir, args.messages)
    print(f"producer killed; last acknowledged message: {last}")
    print("== 2-3. reopen, check, consume half, restart, drain")
    asyncio.run(check_after_crash(qdir, last))
    if args.no_spark:
        return
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("pyspark is not installed: skipping the Spark pipeline (pip install -e '.[spark]')")
        return
    pipeline = os.path.join(HERE, "spark_pipeline.py")
    if not os.path.exists(pipeline):
        print("examples/spark_pipeline.py is not present: skipping the Spark pipeline")
        return
    print("== 4. Spark pipeline")
    subprocess.run([sys.executable, pipeline, "--data-dir", os.path.join(args.data_dir, "spark")],
                   check=True)


if __name__ == "__main__":
    main()
