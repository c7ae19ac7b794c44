"""A drain across many segments: what removing the consumed ones costs the consumer.

``bench/run.py``'s drain row reads 100,000 messages, which fit in one segment: nothing is
removed while it is timed. Here a queue of ``--messages`` 1 KiB messages is written with
the default 100 MiB segments, closed, reopened and drained with ``async for``; each
consumed segment is removed while the drain goes on. The anchor is the same drain from a
queue whose one segment holds everything (no removal during the drain), in the same
run, alternating. Reported per row: msgs/s, CPU us per message, and the consumer's
stalls: gaps of more than 1 ms between two messages, their count, total and the longest.

Usage: ``python bench/bench_long_drain.py [--messages 1200000] [--reps 3] [--loop uvloop]``
(1.2 M x 1 KiB needs about 1.3 GB of free disk beside the repository, or in ``--dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiodiskqueue import DiskQueue

MiB = 1 << 20
ONE_SEGMENT = 2**31 - 1  # the largest segment go-diskqueue's format allows


async def drain_once(directory: str, messages: int, size: int,
                     segment_bytes: int) -> tuple[float, float, list[float], int]:
    """(msgs/s, CPU us/msg, the gaps over 1 ms in seconds, segments written)."""
    payload = os.urandom(size)
    with tempfile.TemporaryDirectory(dir=directory, prefix="long-drain-") as d:
        q = await DiskQueue.open(d, "drain", max_bytes_per_file=segment_bytes)
        for i in range(0, messages, 1000):
            await q.put_many([payload] * min(1000, messages - i))
        await q.aclose()
        segments = sum(1 for n in os.listdir(d) if n.endswith(".dat") and ".meta." not in n)
        q = await DiskQueue.open(d, "drain", max_bytes_per_file=segment_bytes)
        gaps: list[float] = []
        n = 0
        c0 = time.process_time()
        t0 = last = time.perf_counter()
        async for m in q:
            now = time.perf_counter()
            if now - last > 0.001:
                gaps.append(now - last)
            last = now
            if len(m) != size:
                raise AssertionError(f"message {n} has {len(m)} bytes")
            n += 1
            if n == messages:
                break
        t1 = time.perf_counter()
        c1 = time.process_time()
        await q.aclose()
    return messages / (t1 - t0), (c1 - c0) / messages * 1e6, gaps, segments


def main(argv: list[str] | None = None) -> None:
    """Run the alternating reps and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--segment-bytes", type=int, default=100 * MiB,
                    help="segment size of the row that removes (default 100 MiB, nsqd's)")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent),
                    help="where the queues go (default: beside the repository, not tmpfs)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args(argv)
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run
    rows: dict[str, list[tuple[float, float, list[float], int]]] = {"removing": [], "one": []}
    for _ in range(args.reps):
        rows["removing"].append(run(drain_once(args.dir, args.messages, args.size,
                                               args.segment_bytes)))
        rows["one"].append(run(drain_once(args.dir, args.messages, args.size, ONE_SEGMENT)))
    print(f"drain of {args.messages:,} x {args.size} B with async for, {args.loop}, "
          f"{args.reps} alternating reps (medians, the longest gap over all reps; gaps: the "
          f"consumer waited over 1 ms)")
    print(f"{'queue':<34} {'segments':>8} {'msgs/s':>10} {'cpu us':>7} {'gaps':>5} "
          f"{'gap ms total':>12} {'longest':>8} {'vs anchor':>9}")
    anchor = statistics.median(r[0] for r in rows["one"])
    seg = args.segment_bytes
    seg_text = f"{seg // MiB} MiB" if seg % MiB == 0 else f"{seg / 1024:g} KiB"
    for key, label in (("removing", f"{seg_text} segments, removing"),
                       ("one", "one segment (anchor)")):
        rs = rows[key]
        rate = statistics.median(r[0] for r in rs)
        print(f"{label:<34} {rs[0][3]:>8} {rate:>10,.0f} "
              f"{statistics.median(r[1] for r in rs):>7.2f} "
              f"{statistics.median(len(r[2]) for r in rs):>5.0f} "
              f"{statistics.median(sum(r[2]) for r in rs) * 1e3:>12.0f} "
              f"{max(max(r[2], default=0.0) for r in rs) * 1e3:>8.1f} {rate / anchor:>8.2f}x")


if __name__ == "__main__":
    main()
