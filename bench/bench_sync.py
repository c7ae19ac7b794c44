"""Thread facade benchmark: puts/s from 16 OS threads, against persist-queue in the same run.

Rows (1 KiB messages, 16 threads sharing one queue object, each putting n/16):

* persist-queue ``Queue`` (files; kill-safe, its own lock) and ``SQLiteQueue(multithreading=True)``
  (durable: a commit with synchronous=FULL per put), through the adapters of ``peers.py``;
* ``aiodiskqueue.sync.DiskQueue`` with the default ``sync_every=2500`` (a returned put is
  written to the OS: kill-safe) and with ``sync_every=1`` (fsynced before put returns:
  durable), on the facade's own loop thread, asyncio and uvloop;
* for scale, the async queue itself with 16 tasks (no threads).

Each row gives the median rate of ``--reps`` repetitions, the process CPU time (all
threads) per message in µs, and the ratio to the persist-queue peer of the same level
(kill-safe rows against ``Queue``, durable rows against ``SQLiteQueue``). Every repetition
reads everything back and checks that each message came back once, in order per thread.

Usage: ``python bench/bench_sync.py [--n 32000] [--n-peer 4000] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peers import Peer, PersistQueueFile, PersistQueueSQLite

import aiodiskqueue
from aiodiskqueue import sync

THREADS = 16
SIZE = 1024


def payload(producer: int, k: int) -> bytes:
    """1 KiB: producer and index first, so the check can restore the order."""
    head = struct.pack(">II", producer, k)
    return head + bytes(SIZE - len(head))


def check(messages: list[bytes], producers: int, per: int) -> None:
    """Every message exactly once, and in order per producer; raises AssertionError."""
    seen: dict[int, list[int]] = {p: [] for p in range(producers)}
    for m in messages:
        p, k = struct.unpack_from(">II", m)
        seen[p].append(k)
    for p, ks in seen.items():
        assert ks == list(range(per)), f"producer {p}: {len(ks)} messages, out of order or lost"


def run_threads(put_some: Callable[[int], None]) -> float:
    """Start THREADS threads running ``put_some(i)`` at one barrier; return the elapsed time."""
    barrier = threading.Barrier(THREADS + 1)

    def body(i: int) -> None:
        barrier.wait()
        put_some(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


Result = tuple[float, float]
"""messages per second, process CPU µs per message."""


def peer_rep(cls: type[Peer], n: int) -> Result:
    per = n // THREADS
    with tempfile.TemporaryDirectory() as d:
        peer = cls(d, threads=True)
        c0 = time.process_time()
        def put_some(i: int) -> None:
            for k in range(per):
                peer.put(payload(i, k))

        elapsed = run_threads(put_some)
        cpu = time.process_time() - c0
        check(peer.rest(), THREADS, per)
        peer.close()
    return per * THREADS / elapsed, cpu / (per * THREADS) * 1e6


def facade_rep(n: int, sync_every: int, use_uvloop: bool) -> Result:
    per = n // THREADS
    with tempfile.TemporaryDirectory() as d:
        with sync.DiskQueue(d, "bench", sync_every=sync_every, uvloop=use_uvloop) as q:
            def put_some(i: int) -> None:
                put = q.put
                for k in range(per):
                    put(payload(i, k))

            c0 = time.process_time()
            elapsed = run_threads(put_some)
            cpu = time.process_time() - c0
        with sync.DiskQueue(d, "bench") as q:  # reopened: read back from the files
            out: list[bytes] = []
            while q.qsize():
                out += q.get_many(per * THREADS)
            check(out, THREADS, per)
    return per * THREADS / elapsed, cpu / (per * THREADS) * 1e6


def tasks_rep(n: int, sync_every: int, use_uvloop: bool) -> Result:
    per = n // THREADS

    async def main() -> Result:
        with tempfile.TemporaryDirectory() as d:
            async with aiodiskqueue.DiskQueue(d, "bench", sync_every=sync_every) as q:
                async def put_some(i: int) -> None:
                    for k in range(per):
                        await q.put(payload(i, k))

                c0 = time.process_time()
                t0 = time.perf_counter()
                await asyncio.gather(*(put_some(i) for i in range(THREADS)))
                elapsed = time.perf_counter() - t0
                cpu = time.process_time() - c0
                out: list[bytes] = []
                while q.qsize():
                    out += await q.get_many(per * THREADS)
                check(out, THREADS, per)
        return per * THREADS / elapsed, cpu / (per * THREADS) * 1e6

    if use_uvloop:
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=32_000, help="messages per row of ours")
    ap.add_argument("--n-durable", type=int, default=8_000, help="messages, sync_every=1 rows")
    ap.add_argument("--n-peer", type=int, default=4_000, help="messages per peer row")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    try:
        import uvloop  # noqa: F401
        loops = [False, True]
    except ImportError:
        loops = [False]

    # (system, level, thunk); systems interleaved repetition by repetition
    rows: list[tuple[str, str, Callable[[], Result]]] = [
        (PersistQueueFile.NAME, "kill", lambda: peer_rep(PersistQueueFile, args.n_peer)),
        (PersistQueueSQLite.NAME + " (multithreading)", "durable",
         lambda: peer_rep(PersistQueueSQLite, args.n_peer)),
    ]
    for uv in loops:
        name = "uvloop" if uv else "asyncio"
        rows.append((f"sync.DiskQueue, {name}", "kill",
                     lambda uv=uv: facade_rep(args.n, 2500, uv)))  # type: ignore[misc]
        rows.append((f"sync.DiskQueue sync_every=1, {name}", "durable",
                     lambda uv=uv: facade_rep(args.n_durable, 1, uv)))  # type: ignore[misc]
        rows.append((f"async DiskQueue, 16 tasks, {name}", "kill",
                     lambda uv=uv: tasks_rep(args.n, 2500, uv)))  # type: ignore[misc]
    results: dict[str, list[Result]] = {r[0]: [] for r in rows}
    for _ in range(args.reps):
        for system, _, thunk in rows:
            results[system].append(thunk())

    med = {s: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
           for s, rs in results.items()}
    anchor = {"kill": med[rows[0][0]][0], "durable": med[rows[1][0]][0]}
    print(f"{THREADS} threads (tasks in the last rows) putting 1 KiB messages into one queue; "
          f"median of {args.reps}; ours n={args.n} (sync_every=1: {args.n_durable}), "
          f"peers n={args.n_peer}; cpu = process CPU µs per message, all threads")
    print(f"{'system':<48} {'level':<8} {'puts/s':>9} {'min-max':>15} {'cpu':>6} "
          f"{'vs peer':>8}")
    for system, level, _ in rows:
        rate, cpu = med[system]
        lo = min(r[0] for r in results[system])
        hi = max(r[0] for r in results[system])
        print(f"{system:<48} {level:<8} {rate:>9,.0f} {f'{lo:,.0f}-{hi:,.0f}':>15} {cpu:>6.0f} "
              f"{rate / anchor[level]:>7.1f}x")
    print("vs peer: kill-safe rows against persist-queue Queue, durable rows against "
          "SQLiteQueue; every repetition passed its exactly-once, in-order check")


if __name__ == "__main__":
    main()
