"""One producer process and one consumer process on one queue, against the same pipeline
inside one process (a producer task and a consumer task on one ``role="both"`` queue).

Rows, 1 KiB messages, every row in the same run:

- throughput: messages/s from the first put to the last get;
- put-to-get latency at 1,000 messages/s: each message carries the CLOCK_MONOTONIC time
  of its put (one clock for every process on the host); p50 and p99 of the get's time
  minus it.

The queues run with their defaults (``sync_every=2500``); our processes run on uvloop
where it is installed (``--loop asyncio`` for the default loop). Nothing is asserted.

Usage: ``python bench/bench_roles.py [--n 200000] [--rate-n 3000] [--loop uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiodiskqueue import DiskQueue

PAD = os.urandom(1024 - 8)
STAMP = struct.Struct("<q")


def _msg() -> bytes:
    return STAMP.pack(time.monotonic_ns()) + PAD


def _run(coro: object, loop: str) -> object:
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            loop = "asyncio"
        else:
            return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _produce(q: DiskQueue, n: int, rate: float) -> None:
    if rate <= 0:
        batch = 64
        for i in range(0, n, batch):
            await q.put_many([_msg() for _ in range(min(batch, n - i))])
        return
    start = time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await q.put(_msg())


async def _consume(q: DiskQueue, n: int) -> list[int]:
    lat = []
    got = 0
    while got < n:
        for m in await q.get_many(1024):
            lat.append(time.monotonic_ns() - STAMP.unpack_from(m)[0])
            got += 1
    return lat


async def one_process(directory: str, n: int, rate: float) -> tuple[float, list[int]]:
    async with DiskQueue(directory, "q") as q:
        t0 = time.monotonic()
        cons = asyncio.ensure_future(_consume(q, n))
        await _produce(q, n, rate)
        lat = await cons
        return time.monotonic() - t0, lat


def two_processes(directory: str, n: int, rate: float, loop: str) -> tuple[float, list[int]]:
    async def make() -> None:
        async with DiskQueue(directory, "q", "producer"):
            pass

    _run(make(), loop)
    me = [sys.executable, __file__, "--loop", loop, "--child"]
    cons = subprocess.Popen([*me, "consumer", directory, str(n), "0"], stdout=subprocess.PIPE,
                            text=True)
    assert cons.stdout is not None
    assert cons.stdout.readline().strip() == "READY"
    t0 = time.monotonic()
    prod = subprocess.Popen([*me, "producer", directory, str(n), str(rate)])
    out = cons.stdout.read()
    cons.wait()
    prod.wait()
    end, *lat = (int(x) for x in out.split())
    return end / 1e9 - t0, lat


async def child(role: str, directory: str, n: int, rate: float) -> None:
    async with DiskQueue(directory, "q", role) as q:
        if role == "producer":
            await _produce(q, n, rate)
            await q.sync()
            return
        print("READY", flush=True)
        lat = await _consume(q, n)
        print(time.monotonic_ns(), *lat, flush=True)


def _pct(lat: list[int], p: float) -> float:
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6


def main() -> None:
    """Parse the arguments, run every row, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rate-n", type=int, default=3000)
    ap.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    ap.add_argument("--child", nargs=4, metavar=("ROLE", "DIR", "N", "RATE"))
    args = ap.parse_args()
    if args.child:
        role, d, n, rate = args.child
        _run(child(role, d, int(n), float(rate)), args.loop)
        return
    rows = []
    for label, fn in (("one process (producer task + consumer task)", None),
                      ("producer process + consumer process", two_processes)):
        with tempfile.TemporaryDirectory() as d:
            if fn is None:
                secs, _ = _run(one_process(d, args.n, 0), args.loop)  # type: ignore[misc]
            else:
                secs, _ = fn(d, args.n, 0, args.loop)
        with tempfile.TemporaryDirectory() as d:
            if fn is None:
                _, lat = _run(one_process(d, args.rate_n, 1000.0), args.loop)  # type: ignore[misc]
            else:
                _, lat = fn(d, args.rate_n, 1000.0, args.loop)
        rows.append((label, args.n / secs, _pct(lat, 0.5), _pct(lat, 0.99),
                     statistics.mean(lat) / 1e6))
    print(f"1 KiB messages, {args.n} for throughput, {args.rate_n} at 1,000/s for latency, "
          f"loop {args.loop}")
    print(f"| {'setup':46} | {'msgs/s':>9} | {'p50 ms':>7} | {'p99 ms':>7} | {'mean ms':>7} |")
    print(f"|{'-' * 48}|{'-' * 11}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
    for label, rate, p50, p99, mean in rows:
        print(f"| {label:46} | {rate:9.0f} | {p50:7.3f} | {p99:7.3f} | {mean:7.3f} |")
    base = rows[0][1]
    print(f"two processes / one process: {rows[1][1] / base:.2f}x")


if __name__ == "__main__":
    main()
