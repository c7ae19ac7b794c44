"""Worker pools: producer processes writing one queue group, consumer processes reading it,
against the same setup with ``multiprocessing.Queue`` (which stores nothing).

Rows, 1 KiB messages, every row in the same run, each in a fresh directory:

- 4 producer processes -> one QueueGroup -> 1 consumer process;
- 1 producer process -> QueueGroup -> 1 consumer process;
- 4 producer processes -> one ``multiprocessing.Queue`` -> 1 consumer process;
- 4 producer processes -> one QueueGroup -> 2 consumer processes.

Every process opens its queue and says it is ready before the clock starts; the rate is
the messages of the row over the time from the start signal to the last message taken.
CPU is the CPU time (every thread) the row's processes spent from the start signal to
their end, summed: ``cores`` is that over the wall time, ``us/msg`` per message. Group
producers put in batches of ``--batch`` with ``put_many`` (a batch of requests a worker
accepted), ``multiprocessing.Queue`` producers call ``put`` per message (it batches in
its feeder thread); consumers take one message at a time. The queues run with their
defaults (``sync_every=2500``), our processes on uvloop where installed. The check
column says every message came once and, per producer, in order (FIFO per shard).

Usage: ``python bench/bench_group.py [--n 200000] [--batch 64] [--loop uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiodiskqueue import QueueEmpty, QueueGroup

SIZE = 1024
HEAD = struct.Struct("<II")  # producer index, sequence number
PAD = os.urandom(SIZE - HEAD.size)
GROUP = "bench"


def _run(coro: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coro)
            return
    asyncio.run(coro)


@dataclass
class Shared:
    """What a row's processes share: readiness, the start signal, the consumed count."""

    ready: Any  # a multiprocessing Queue: each process puts its index once open
    go: Any  # a multiprocessing Event: set when every process is ready
    taken: Any  # a multiprocessing Value('q'): messages taken, all consumers
    done: Any  # a multiprocessing Event: set once every message was taken
    end: Any  # a multiprocessing Value('d'): CLOCK_MONOTONIC when the last one was taken
    results: Any  # a multiprocessing Queue: (role, cpu seconds, check or None)


class Check:
    """Each producer's sequence numbers must come in order, each once."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.problem: str | None = None

    def feed(self, msg: bytes) -> None:
        """Check one message."""
        p, seq = HEAD.unpack_from(msg)
        if self.problem is None and (seq <= self.last.get(p, -1) or len(msg) != SIZE):
            self.problem = f"producer {p}: {seq} after {self.last.get(p)}"
        self.last[p] = seq


def _msgs(index: int, start: int, stop: int) -> list[bytes]:
    return [HEAD.pack(index, i) + PAD for i in range(start, stop)]


def _count(shared: Shared, n: int, total: int) -> bool:
    """Add ``n`` taken messages; True once all ``total`` are taken (records the time)."""
    with shared.taken.get_lock():
        shared.taken.value += n
        last = bool(shared.taken.value >= total)
    if last and not shared.done.is_set():
        shared.end.value = time.monotonic()
        shared.done.set()
    return last


# ---------------------------------------------------------------------- QueueGroup rows


async def _group_producer(d: str, index: int, n: int, batch: int, shared: Shared) -> None:
    async with QueueGroup(d, GROUP, "producer") as g:
        shared.ready.put(index)
        await asyncio.to_thread(shared.go.wait)
        cpu = time.process_time()
        for i in range(0, n, batch):
            await g.put_many(_msgs(index, i, min(n, i + batch)))
        await g.sync()
        shared.results.put(("producer", time.process_time() - cpu, None))


async def _group_consumer(d: str, index: int, total: int, shared: Shared) -> None:
    check = Check()
    async with QueueGroup(d, GROUP, "consumer") as g:
        shared.ready.put(index)
        await asyncio.to_thread(shared.go.wait)
        cpu = time.process_time()
        got = 0
        while not shared.done.is_set():
            try:
                check.feed(g.get_nowait())
                got += 1
                if got < 256:
                    continue
            except QueueEmpty:
                pass
            if got and _count(shared, got, total):
                got = 0
                break
            got = 0
            try:  # wait for more, and look at ``done`` again now and then
                check.feed(await asyncio.wait_for(g.get(), 0.05))
                got = 1
            except TimeoutError:
                pass
        if got:
            _count(shared, got, total)
        shared.results.put(("consumer", time.process_time() - cpu, check.problem))


def _group_producer_main(d: str, index: int, n: int, batch: int, shared: Shared,
                         loop: str) -> None:
    _run(_group_producer(d, index, n, batch, shared), loop)


def _group_consumer_main(d: str, index: int, total: int, shared: Shared, loop: str) -> None:
    _run(_group_consumer(d, index, total, shared), loop)


# ---------------------------------------------------------------------- multiprocessing.Queue


def _mp_producer_main(q: Any, index: int, n: int, shared: Shared) -> None:
    shared.ready.put(index)
    shared.go.wait()
    cpu = time.process_time()
    for i in range(n):
        q.put(HEAD.pack(index, i) + PAD)
    q.close()
    q.join_thread()  # everything handed to the pipe
    shared.results.put(("producer", time.process_time() - cpu, None))


def _mp_consumer_main(q: Any, total: int, shared: Shared) -> None:
    check = Check()
    shared.ready.put(-1)
    shared.go.wait()
    cpu = time.process_time()
    for _ in range(total):
        check.feed(q.get())
    _count(shared, total, total)
    shared.results.put(("consumer", time.process_time() - cpu, check.problem))


# ---------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    """One measured setup."""

    label: str
    messages: int
    seconds: float
    cpu: float
    check: str

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds


def run_row(label: str, producers: int, consumers: int, n: int, batch: int, loop: str,
            mp_queue: bool = False) -> Row:
    """Run one setup with ``n`` messages in all; return what it measured.

    Raises RuntimeError if a process fails or the row does not finish.
    """
    ctx: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    shared = Shared(ctx.Queue(), ctx.Event(), ctx.Value("q", 0), ctx.Event(),
                    ctx.Value("d", 0.0), ctx.Queue())
    share = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]
    with tempfile.TemporaryDirectory(prefix="bench-group-") as d:
        procs: list[Any] = []
        target: Callable[..., None]
        if mp_queue:
            q = ctx.Queue()
            procs.append(ctx.Process(target=_mp_consumer_main, args=(q, n, shared)))
            for i in range(producers):
                procs.append(ctx.Process(target=_mp_producer_main, args=(q, i, share[i],
                                                                          shared)))
        else:
            target = _group_consumer_main
            # The consumers join first (a shard each claim is read at once), then the
            # producers claim their shards.
            for i in range(consumers):
                procs.append(ctx.Process(target=target, args=(d, i, n, shared, loop)))
            for i in range(producers):
                procs.append(ctx.Process(target=_group_producer_main,
                                         args=(d, i, share[i], batch, shared, loop)))
        try:
            for p in procs:
                p.start()
            for _ in procs:
                _wait(lambda: shared.ready.get(timeout=1), procs)
            t0 = time.monotonic()
            shared.go.set()
            results = [_wait(lambda: shared.results.get(timeout=1), procs) for _ in procs]
            for p in procs:
                p.join(60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        if not shared.done.is_set():
            raise RuntimeError(f"{label}: {shared.taken.value} of {n} messages taken")
        problems = [r[2] for r in results if r[2] is not None]
        check = "ok" if not problems and shared.taken.value == n else (
            problems[0] if problems else f"{shared.taken.value} taken of {n}")
        return Row(label, n, shared.end.value - t0, sum(r[1] for r in results), check)


def _wait(get: Callable[[], Any], procs: list[Any]) -> Any:
    """``get()`` retried while every process lives; raises RuntimeError once one failed."""
    while True:
        try:
            return get()
        except queue.Empty:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a process of the row failed (exit code "
                                   f"{failed[0].exitcode})") from None


ROWS = [
    ("4 producer processes -> QueueGroup -> 1 consumer", 4, 1, False),
    ("1 producer process -> QueueGroup -> 1 consumer", 1, 1, False),
    ("4 producer processes -> multiprocessing.Queue -> 1", 4, 1, True),
    ("4 producer processes -> QueueGroup -> 2 consumers", 4, 2, False),
]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run every row, print the table."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages per row, in all")
    ap.add_argument("--batch", type=int, default=64, help="a group producer's put_many size")
    ap.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    args = ap.parse_args(argv)
    if args.n < 1 or args.batch < 1:
        ap.error("--n and --batch must be >= 1")
    rows = [run_row(label, p, c, args.n, args.batch, args.loop, mp)
            for label, p, c, mp in ROWS]
    print(f"1 KiB messages, {args.n} per row, loop {args.loop}, {os.cpu_count()} CPUs")
    print(f"| {'setup':52} | {'msgs/s':>9} | {'vs row 1':>8} | {'cores':>5} | "
          f"{'us/msg':>7} | check |")
    print(f"|{'-' * 54}|{'-' * 11}|{'-' * 10}|{'-' * 7}|{'-' * 9}|-------|")
    base = rows[0].rate
    for r in rows:
        print(f"| {r.label:52} | {r.rate:9.0f} | {r.rate / base:7.2f}x | "
              f"{r.cpu / r.seconds:5.2f} | {r.cpu / r.messages * 1e6:7.2f} | {r.check} |")
    return 0 if all(r.check == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
