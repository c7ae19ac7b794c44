"""Awaited puts: where the CPU goes, thread by thread, for each way of writing.

Rows: producers awaiting each ``put()`` of 1 KiB (1 and 16 by default), for each write
mode: the default (polled writes on the native writer thread, ``spin_us=250``), shorter
writer spins (``spin_us=50``, ``spin_us=0``) and ``inline_writes=True`` (the loop's
thread writes small batches itself). For each row: messages/s and the CPU µs per
message of the whole process and of each thread: the event loop's, the native writer's
(``adq-writer``), the queue's Python I/O thread (sync rounds, the meta) and the rest.
The anchor, measured in the same run: one thread appending the same record (framed
once, by the queue's codec) with one ``os.write`` each (what the write of a record
costs from Python, with no queue around it).

The modes run alternately, ``--reps`` times each; the table gives medians. Linux only
(per-thread CPU from ``/proc/self/task``).

Usage: ``python bench/bench_put_threads.py [--n 200000] [--producers 1,16] [--reps 3]
[--modes default,spin50,spin0,inline] [--loop uvloop]``.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from report import print_table

from aiodiskqueue import DiskQueue
from aiodiskqueue._format.codec import frame

PAYLOAD = os.urandom(1024)
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "spin50": {"spin_us": 50},
    "spin0": {"spin_us": 0},
    "inline": {"inline_writes": True},
}
PARTS = ("loop", "writer", "io", "other")
TICK = os.sysconf("SC_CLK_TCK")


def _writer_name() -> str | None:
    try:
        from aiodiskqueue._core import _writer
    except ImportError:
        return None
    return _writer.THREAD_NAME


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process, by thread id, with its part."""
    io = {t.native_id for t in threading.enumerate() if t.name.startswith("aiodiskqueue-io-")}
    writer = _writer_name()
    out: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            comm = Path(entry.path, "comm").read_text().strip()
            cpu = _cpu_seconds(entry.path)
        except OSError:  # the thread ended meanwhile
            continue
        tid = int(entry.name)
        part = ("loop" if tid == os.getpid() else "writer" if comm == writer
                else "io" if tid in io else "other")
        out[tid] = (part, cpu)
    return out


def _cpu_seconds(task: str) -> float:
    """A thread's CPU time: from ``schedstat`` (nanoseconds), else from ``stat``'s
    utime + stime (clock ticks of 10 ms: too coarse for short runs)."""
    try:
        return int(Path(task, "schedstat").read_text().split()[0]) / 1e9
    except FileNotFoundError:
        stat = Path(task, "stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / TICK


def cpu_by_part(before: dict[int, tuple[str, float]],
                after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each part used between two :func:`thread_cpu` readings."""
    used = dict.fromkeys(PARTS, 0.0)
    for tid, (part, cpu) in after.items():
        used[part] += cpu - before.get(tid, (part, 0.0))[1]
    return used


Result = tuple[float, dict[str, float]]
"""messages/s, CPU µs per message by part (and "all")."""


async def ours(n: int, producers: int, options: dict[str, Any]) -> Result:
    """Awaited puts into a fresh queue; the CPU is read before the queue closes, while
    its threads still exist."""
    with tempfile.TemporaryDirectory() as d:
        q = await DiskQueue.open(d, "bench", **options)
        try:
            per = n // producers

            async def produce() -> None:
                for _ in range(per):
                    await q.put(PAYLOAD)

            b, t0 = thread_cpu(), time.perf_counter()
            await asyncio.gather(*(produce() for _ in range(producers)))
            secs, used = time.perf_counter() - t0, cpu_by_part(b, thread_cpu())
        finally:
            await q.aclose()
    total = per * producers
    return total / secs, _per_message(used, total)


def raw(n: int) -> Result:
    """The anchor: one thread appends n records with ``os.write``."""
    record = frame([PAYLOAD])
    with tempfile.TemporaryDirectory() as d:
        fd = os.open(Path(d, "raw.dat"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            b, t0 = thread_cpu(), time.perf_counter()
            for _ in range(n):
                os.write(fd, record)
            secs, used = time.perf_counter() - t0, cpu_by_part(b, thread_cpu())
        finally:
            os.close(fd)
    return n / secs, _per_message(used, n)


def _per_message(used: dict[str, float], n: int) -> dict[str, float]:
    out = {part: secs / n * 1e6 for part, secs in used.items()}
    out["all"] = sum(used.values()) / n * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages per row")
    ap.add_argument("--producers", default="1,16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("per-thread CPU is read from /proc: Linux only")
    run: Callable[[Any], Any] = asyncio.run
    if args.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            sys.exit("--loop uvloop needs uvloop installed (pip install uvloop)")
        run = uvloop.run
    modes = args.modes.split(",")
    unknown = set(modes) - MODES.keys()
    if unknown:
        sys.exit(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    counts = [int(p) for p in args.producers.split(",")]

    results: dict[tuple[str, int], list[Result]] = {}
    for rep in range(args.reps):
        order = modes if rep % 2 == 0 else modes[::-1]
        results.setdefault(("raw os.write", 1), []).append(raw(args.n))
        for producers in counts:
            for mode in order:
                results.setdefault((mode, producers), []).append(
                    run(ours(args.n, producers, MODES[mode])))

    print(f"awaited put() of 1 KiB, n={args.n} per row, {args.loop}, medians of {args.reps}; "
          f"cpu = CPU µs per message: the process, then by thread")
    head = ("mode", "producers", "msgs/s", "cpu all", "loop", "writer", "I/O", "other",
            "cpu vs raw")
    rows = [list(head)]
    anchor = statistics.median(r[1]["all"] for r in results[("raw os.write", 1)])
    for (mode, producers), reps in results.items():
        cpu = {k: statistics.median(r[1][k] for r in reps) for k in ("all", *PARTS)}
        rows.append([mode, str(producers), f"{statistics.median(r[0] for r in reps):,.0f}",
                     f"{cpu['all']:.1f}", f"{cpu['loop']:.1f}", f"{cpu['writer']:.1f}",
                     f"{cpu['io']:.1f}", f"{cpu['other']:.1f}",
                     f"{cpu['all'] / anchor:.1f}x" if anchor > 0 else "-"])
    print_table(rows, right=frozenset(range(1, len(head))))


if __name__ == "__main__":
    main()
