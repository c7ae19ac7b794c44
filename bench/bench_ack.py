"""Ack path benchmark: get + finish, against persist-queue's SQLiteAckQueue in the same run.

Rows: messages/s for get+finish (ack) with 1 consumer and with 16 concurrent
consumers, 1 KiB payloads, queue pre-filled (the fill is timed too, as put/s).
AckQueue runs with its defaults (sync_every=2500: a finish is written to the OS
at once and fsynced by the next commit) and with sync_every=1 (every finish is
fsynced before it returns, group commit). SQLiteAckQueue commits every
operation (its only mode); its 16 consumers are threads. Last, the lateness of
AckQueue's deadline timer with 100,000 messages in flight (real clock).

Each row also gives the process CPU time (all threads) per message of each phase, in µs.
Our rows run on uvloop where it is installed (``--loop asyncio`` for the default loop).

Usage: ``python bench/bench_ack.py [--n 50000] [--n-sqlite 3000] [--loop uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiodiskqueue import AckQueue
from aiodiskqueue.ack.clock import LoopClock, TimerHandle

PAYLOAD = os.urandom(1024)


Rates = tuple[float, float, float, float]
"""put/s, get+ack/s, CPU µs per put, CPU µs per get+ack."""


def _rates(n: int, t0: float, t1: float, t2: float, t3: float,
           c: tuple[float, float, float, float]) -> Rates:
    return n / (t1 - t0), n / (t3 - t2), (c[1] - c[0]) / n * 1e6, (c[3] - c[2]) / n * 1e6


async def ours(n: int, consumers: int, sync_every: int) -> Rates:
    """Rates of an AckQueue in a fresh directory."""
    with tempfile.TemporaryDirectory() as d:
        async with AckQueue(d, "bench", sync_every=sync_every, max_in_flight=1000) as q:
            c0 = time.process_time()
            t0 = time.perf_counter()
            if sync_every == 1:
                await asyncio.gather(*(_put_some(q, n // 16) for _ in range(16)))
            else:
                for _ in range(n):
                    await q.put(PAYLOAD)
            t1 = time.perf_counter()
            c1 = time.process_time()
            left = [n if sync_every != 1 else (n // 16) * 16]

            async def consume() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    m = await q.get()
                    await m.finish()

            c2 = time.process_time()
            t2 = time.perf_counter()
            await asyncio.gather(*(consume() for _ in range(consumers)))
            t3 = time.perf_counter()
            c3 = time.process_time()
            total = n if sync_every != 1 else (n // 16) * 16
            assert q.statistics().finished == total
        return _rates(total, t0, t1, t2, t3, (c0, c1, c2, c3))


async def _put_some(q: AckQueue, k: int) -> None:
    for _ in range(k):
        await q.put(PAYLOAD)


def sqlite_ack(n: int, consumers: int) -> Rates:
    """Rates of persist-queue's SQLiteAckQueue."""
    from persistqueue import SQLiteAckQueue

    with tempfile.TemporaryDirectory() as d:
        q = SQLiteAckQueue(d, multithreading=True, auto_commit=True)
        c0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(n):
            q.put(PAYLOAD)
        t1 = time.perf_counter()
        c1 = time.process_time()
        lock = threading.Lock()
        left = [n]

        def consume() -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                item = q.get(block=True)
                q.ack(item)

        c2 = time.process_time()
        t2 = time.perf_counter()
        threads = [threading.Thread(target=consume) for _ in range(consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t3 = time.perf_counter()
        c3 = time.process_time()
        assert q.acked_count() == n
        return _rates(n, t0, t1, t2, t3, (c0, c1, c2, c3))


class _TimingClock(LoopClock):
    """The loop's clock, recording how late each timer callback finished."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.late: list[float] = []

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        def run() -> None:
            callback()
            self.late.append(self.monotonic() - when)

        return super().call_at(when, run)


async def deadline_lateness(n: int) -> tuple[float, float, float]:
    """(p50, p99, max) seconds from a deadline to the end of the timer run that handled it."""
    with tempfile.TemporaryDirectory() as d:
        clock = _TimingClock(asyncio.get_running_loop())
        async with AckQueue(d, "late", msg_timeout=2.0, max_in_flight=n, clock=clock) as q:
            for _ in range(n):
                await q.put(b"x")
            for _ in range(n):
                await q.get()
            while q.statistics().timed_out < n:
                await asyncio.sleep(0.05)
        late = sorted(clock.late)
    return statistics.median(late), late[int(len(late) * 0.99)], late[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--n-sync", type=int, default=4_000)
    ap.add_argument("--n-sqlite", type=int, default=3_000)
    ap.add_argument("--in-flight", type=int, default=100_000)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args()
    run = asyncio.run
    if args.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            sys.exit("--loop uvloop needs uvloop installed (pip install uvloop)")
        run = uvloop.run

    rows: list[tuple[str, str, Rates]] = []
    anchors: dict[int, float] = {}
    for consumers in (1, 16):
        r = sqlite_ack(args.n_sqlite, consumers)
        anchors[consumers] = r[1]
        rows.append(("persist-queue SQLiteAckQueue", f"{consumers} consumer(s)", r))
    for consumers in (1, 16):
        rows.append(("AckQueue sync_every=2500", f"{consumers} consumer(s)",
                     run(ours(args.n, consumers, 2500))))
    for consumers in (1, 16):
        rows.append(("AckQueue sync_every=1", f"{consumers} consumer(s)",
                     run(ours(args.n_sync, consumers, 1))))

    print(f"1 KiB payloads; AckQueue n={args.n} (sync_every=1: {args.n_sync}) on {args.loop}, "
          f"SQLiteAckQueue n={args.n_sqlite}; cpu = process CPU µs per message, all threads")
    print(f"{'system':<30} {'consumers':<14} {'put/s':>10} {'cpu':>6} {'get+ack/s':>10} "
          f"{'cpu':>6} {'vs SQLite':>10}")
    for system, scen, (put, ack, put_cpu, ack_cpu) in rows:
        c = 1 if scen.startswith("1 ") else 16
        print(f"{system:<30} {scen:<14} {put:>10,.0f} {put_cpu:>6.1f} {ack:>10,.0f} "
              f"{ack_cpu:>6.1f} {ack / anchors[c]:>9.1f}x")
    p50, p99, worst = run(deadline_lateness(args.in_flight))
    print(f"deadline timer with {args.in_flight:,} in flight: late by p50 {p50 * 1e3:.1f} ms, "
          f"p99 {p99 * 1e3:.1f} ms, max {worst * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
