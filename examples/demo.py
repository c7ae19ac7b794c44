"""The main demo: put, crash with SIGKILL, reopen, drain; two processes on one queue,
each killed once; then the Spark pipeline.

    python examples/demo.py [--data-dir DIR] [--no-spark] [--messages N]
                            [--role-messages N] [--sync-takes N]

1. A producer process puts numbered messages and prints each number once its
   ``put()`` has returned. The demo kills it with SIGKILL part-way through.
2. The queue is reopened: every acknowledged message is there, in order, with
   no gap, including those written after the last meta sync (recovered from the
   tail of the write segment).
3. A consumer takes half, the queue is closed cleanly and reopened: the rest
   comes back where it left off.
4. One queue, two processes at once: a producer process (``role="producer"``)
   prints each number it put, a consumer process (``role="consumer"``) prints each
   number it took and syncs every ``--sync-takes`` takes, which makes its position
   durable. The demo kills the producer with SIGKILL and starts it again (it
   continues after the last number it printed), kills the consumer with SIGKILL and
   starts it again, stops the producer cleanly and lets the consumer drain. Checked:
   every acknowledged put was delivered, in order; the only messages delivered twice
   are those the killed consumer took after its last durable position.
5. If pyspark is installed, ``examples/spark_pipeline.py`` runs next.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NoReturn

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


# Step 4: one queue, a producer process and a consumer process at once.
ROLES_QUEUE = "orders"  # in ROLE_CHILD too, with small segments: rolls and deletions happen
ROLE_CHILD = r"""
import asyncio, signal, sys
from aiodiskqueue import DiskQueue

def say(*words):
    sys.stdout.write(" ".join(map(str, words)) + "\n")  # one write: a kill cuts no line
    sys.stdout.flush()

async def produce(d, run, start):
    # SIGTERM stops it cleanly: the put under way returns, is printed, the queue closes.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with DiskQueue(d, "orders", "producer", max_bytes_per_file=64 * 1024) as q:
        say("ready")
        i = start
        while not stop.is_set():
            await q.put(b"%d:%d" % (i, run))  # the number and the producer's run
            say("put", i, run)  # acknowledged: put() returned
            i += 1
            await asyncio.sleep(0)  # lets the SIGTERM handler run
    say("closed")

async def consume(d, every):
    # The meta is stored only by the explicit sync() below (and on close).
    task = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with DiskQueue(d, "orders", "consumer", sync_every=10**9, sync_interval=3600.0,
                         max_bytes_per_file=64 * 1024) as q:
        say("ready")
        taken = 0
        try:
            while True:
                i, run = (await q.get()).split(b":")
                say("took", int(i), int(run))
                taken += 1
                if taken % every == 0:
                    await q.sync()  # the read position is durable now
                    say("durable", int(i), int(run))
        except asyncio.CancelledError:  # SIGTERM: a cancelled get() takes nothing
            pass
    say("closed")

if sys.argv[1] == "produce":
    asyncio.run(produce(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
else:
    asyncio.run(consume(sys.argv[2], int(sys.argv[3])))
"""

Msg = tuple[int, int]  # (run of the producer that put it, its number): the order of puts


class RoleProcess:
    """A child process running ``ROLE_CHILD`` and what it printed so far."""

    def __init__(self, what: str, proc: asyncio.subprocess.Process) -> None:
        self.what = what
        self.proc = proc
        self.acked: list[Msg] = []  # a producer's acknowledged puts
        self.took: list[Msg] = []  # a consumer's takes
        self.durable: Msg | None = None  # the last take before the consumer's last sync
        self.ready = False
        self.closed = False
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, what: str, *args: str) -> RoleProcess:
        """Start ``ROLE_CHILD`` with ``args``; return once it has opened the queue."""
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ROLE_CHILD, *args, stdout=subprocess.PIPE, env=env)
        child = cls(what, proc)
        await until(lambda: child.ready, f"{what} to open the queue")
        return child

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # the torn last line of a killed child
            kind, *rest = raw.decode().split()
            msg = (int(rest[1]), int(rest[0])) if rest else (0, 0)
            if kind == "put":
                self.acked.append(msg)
            elif kind == "took":
                self.took.append(msg)
            elif kind == "durable":
                self.durable = msg
            elif kind == "ready":
                self.ready = True
            elif kind == "closed":
                self.closed = True

    async def stop(self, sig: signal.Signals) -> None:
        """Send ``sig``, wait for the exit and for every line it printed before."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        await asyncio.wait_for(self.proc.wait(), 30)
        await asyncio.wait_for(self._reader, 30)
        if sig == signal.SIGTERM and not (self.closed and self.proc.returncode == 0):
            raise SystemExit(f"{self.what} did not stop cleanly (exit {self.proc.returncode})")


async def until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait until ``cond()`` holds; raises SystemExit after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def fmt(m: Msg | None) -> str:
    """A message as a newcomer reads it."""
    return "none yet" if m is None else f"number {m[1]} of producer run {m[0]}"


async def two_processes(qdir: str, per_run: int, sync_takes: int) -> str:
    """Run step 4 in ``qdir``; return the closing verdict line.

    The producer runs twice (killed after ``per_run`` acknowledged puts, then stopped
    cleanly after ``per_run`` more); the consumer syncs every ``sync_takes`` takes.
    Raises SystemExit if a check fails or a process does not answer in time.
    """
    async with DiskQueue(qdir, ROLES_QUEUE, "producer", max_bytes_per_file=64 * 1024):
        pass  # a consumer opens only a queue that exists
    children: list[RoleProcess] = []
    try:
        p1 = await RoleProcess.start("producer run 1", "produce", qdir, "1", "0")
        c1 = await RoleProcess.start("consumer run 1", "consume", qdir, str(sync_takes))
        children += [p1, c1]
        print(f"producer (pid {p1.proc.pid}) and consumer (pid {c1.proc.pid}) run at once; "
              f"the consumer syncs every {sync_takes} takes")
        await until(lambda: len(p1.acked) >= per_run, "producer run 1 to put")
        await p1.stop(signal.SIGKILL)
        last1 = p1.acked[-1][1]
        print(f"SIGKILL producer: it had acknowledged numbers 0..{last1}; "
              f"the consumer had taken {len(c1.took)} meanwhile")
        p2 = await RoleProcess.start("producer run 2", "produce", qdir, "2", str(last1 + 1))
        children.append(p2)
        print(f"producer restarted (pid {p2.proc.pid}): it continues with number {last1 + 1}")
        # The consumer is killed part-way into the new producer's messages, between syncs.
        await until(lambda: len(c1.took) >= len(p1.acked) + per_run // 3,
                    "consumer run 1 to take producer run 2's messages")
        await c1.stop(signal.SIGKILL)
        after = [m for m in c1.took if c1.durable is not None and m > c1.durable]
        print(f"SIGKILL consumer: it had taken {len(c1.took)}; last durable position: "
              f"{fmt(c1.durable)}; {len(after)} taken after it")
        c2 = await RoleProcess.start("consumer run 2", "consume", qdir, str(sync_takes))
        children.append(c2)
        await until(lambda: bool(c2.took), "consumer run 2 to take")
        print(f"consumer restarted (pid {c2.proc.pid}): its first message is {fmt(c2.took[0])}")
        await until(lambda: len(p2.acked) >= per_run, "producer run 2 to put")
        await p2.stop(signal.SIGTERM)
        last = p2.acked[-1]
        print(f"producer stopped cleanly (SIGTERM) after number {last[1]}; "
              f"the consumer drains the rest")
        await until(lambda: bool(c2.took) and c2.took[-1] >= last, "the consumer to drain")
        await c2.stop(signal.SIGTERM)
        print(f"consumer stopped cleanly; it took {len(c2.took)}")
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.proc.kill()
                await child.proc.wait()
    async with DiskQueue(qdir, ROLES_QUEUE, max_bytes_per_file=64 * 1024) as q:
        left = q.qsize()
    return check_two_processes(p1, p2, c1, c2, left)


def check_two_processes(p1: RoleProcess, p2: RoleProcess, c1: RoleProcess, c2: RoleProcess,
                        left: int) -> str:
    """Check step 4's outputs; return the verdict line. Raises SystemExit on a failure."""
    def fail(why: str) -> NoReturn:
        raise SystemExit(f"CHECK FAILED: {why}")

    acked = p1.acked + p2.acked
    if [n for _, n in acked] != list(range(len(acked))):
        fail("the acknowledged numbers are not 0, 1, 2, ... across the producer restart")
    delivered = c1.took + c2.took
    missing = set(acked) - set(delivered)
    if missing:
        fail(f"{len(missing)} acknowledged puts never delivered, first {fmt(min(missing))}")
    print(f"checked: all {len(acked)} acknowledged puts were delivered")
    for c in (c1, c2):
        if any(a >= b for a, b in itertools.pairwise(c.took)):
            fail(f"{c.what} got messages out of put order")
    # Across the restart: each message's first delivery comes in put order too (the
    # restarted consumer goes back only to messages the killed one had taken).
    took1 = set(c1.took)
    firsts = c1.took + [m for m in c2.took if m not in took1]
    if any(a >= b for a, b in itertools.pairwise(firsts)):
        fail("first deliveries out of put order across the consumer restart")
    print("checked: in put order, in each consumer run and across the restart")
    again = [m for m in c2.took if m in took1]
    if again != c1.took[len(c1.took) - len(again):]:
        fail("messages delivered twice are not the killed consumer's last takes")
    if c1.durable is None or any(m <= c1.durable for m in again):
        fail("a message taken before the consumer's last durable position came again")
    print(f"checked: {len(again)} delivered twice, all taken by the killed consumer after its "
          f"last durable position ({fmt(c1.durable)}): it died before the sync that "
          f"would have stored them, so the restarted consumer got them again (at-least-once)")
    acked1 = set(p1.acked)
    unacked = {m for m in delivered if m[0] == 1 and m not in acked1}
    if unacked:
        print(f"note: {len(unacked)} put(s) of the killed producer landed but were not yet "
              f"acknowledged; they were delivered too, and the restarted producer reused "
              f"their numbers")
    if left:
        fail(f"{left} messages left in the queue after the drain")
    return (f"OK: {len(acked)} acknowledged puts, producer and consumer each killed once: "
            f"none lost, in order, {len(again)} duplicates, all allowed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.path.join(os.getcwd(), "demo-data"))
    ap.add_argument("--messages", type=int, default=50_000,
                    help="kill the producer after this many")
    ap.add_argument("--role-messages", type=int, default=5_000,
                    help="step 4: the producer's puts in each of its two runs")
    ap.add_argument("--sync-takes", type=int, default=500,
                    help="step 4: the consumer syncs its position every this many takes")
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
    print("== 4. one queue, two processes: a producer and a consumer at once, each killed once")
    print(asyncio.run(two_processes(qdir, args.role_messages, args.sync_takes)))
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
    print("== 5. Spark pipeline")
    subprocess.run([sys.executable, pipeline, "--data-dir", os.path.join(args.data_dir, "spark")],
                   check=True)


if __name__ == "__main__":
    main()
