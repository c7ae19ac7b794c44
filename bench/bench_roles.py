"""One producer process and one consumer process on one queue: ours against the same
pipeline inside one process, and against the peers that allow several processes.

Rows, 1 KiB messages, every row in the same run (``--n`` messages, 20,000 by default):

- ours, one process: a producer task and a consumer task on one ``role="both"`` queue;
- ours, two processes: ``role="producer"`` in one process, ``role="consumer"`` in another,
  once with ``await put()`` / ``await get()`` per message and once with ``put_many(64)`` /
  ``get_many(1024)`` (each also in one process), once with 16 producer tasks each
  awaiting its ``put()`` (a web service's concurrent requests) and an ``async for``
  consumer (also in one process), and once with an AckQueue pair whose consumer
  finishes every message, and once with ``put_nowait()`` per message (returning before the
  message is written, as ``multiprocessing.Queue.put`` returns before its feeder thread
  sends it: the reference of that peer's row; the loop runs after every 64 puts, and
  ``put()`` awaits room only while the write buffer is full);
- the peers (``bench/peers.py``, ``PROCESS_PEERS``) in the same producer process /
  consumer process setup, each with its library's defaults: a plain loop of puts, a
  consumer loop of gets (persist-queue's SQLiteAckQueue acks each one), polling every
  ``peers.POLL_SECONDS`` while empty where the peer has no wake-up across processes.

Each row: messages/s from the producer's first put to the consumer's last get; CPU
seconds per 1,000 messages of both processes (each child's own resource usage, all its
threads, from the start signal until its queue is closed: interpreter start and imports
left out); "ours / row", our rate with the same API in two processes divided by the row's
(so the one-process rows show two processes against one); the issue's target for that
ratio and whether this run met it; what survives a kill and a power cut. Latency rows:
``--rate-n`` messages at 1,000 messages/s, each carrying the CLOCK_MONOTONIC time of its
put (one clock for every process on the host): p50 and p99 of the get's time minus it.

With ``--reps N`` every row runs N times, the repetitions interleaved, and shows the
median repetition with the range of the rates. A row whose processes are not done
``--row-timeout`` seconds after the start (300 by default) shows an upper bound of its
rate ("< x") and a lower bound of ours / row ("> y"); persist-queue's SQLiteAckQueue may
need that on a loaded machine (its acked rows stay in the table, and each get looks past
them). Every consumer checks that each message came once and in order. Our processes run
on uvloop where it is installed (``--loop asyncio`` for the default loop); the peers are
synchronous. Every child is started by multiprocessing (``peers.START_METHOD``: a fork
server, else spawn), as the ``multiprocessing.Queue`` row needs. Nothing is asserted: the
figures are evidence. A default run takes a few minutes, most of them the SQLite peers'.

Usage: ``python bench/bench_roles.py [--n 20000] [--rate-n 3000] [--loop uvloop]
[--systems ours,persistqueue-sqlite,...] [--reps 1] [--row-timeout 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402

from aiodiskqueue import AckQueue, DiskQueue, QueueFull  # noqa: E402

SIZE = 1024
HEAD = struct.Struct("<qq")  # put time (monotonic ns), sequence number
PAD = os.urandom(SIZE - HEAD.size)
CTX: Any = multiprocessing.get_context(peers.START_METHOD)  # a str picks no overload
if peers.START_METHOD == "forkserver":
    # Imported once by the fork server, not again by every child.
    CTX.set_forkserver_preload(["aiodiskqueue", "peers", "uvloop", "persistqueue",
                                "litequeue", "diskcache"])
LATENCY_RATE = 1000.0
TARGET_P50_MS = 1.0
TARGET_P99_MS = 10.0
NOWAIT_YIELD = 64  # the put_nowait() producer lets the loop run after this many puts
TASKS = 16  # producer tasks of the "ours-tasks" rows, each awaiting its put()


def _msg(seq: int) -> bytes:
    return HEAD.pack(time.monotonic_ns(), seq) + PAD


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return r.ru_utime + r.ru_stime


@dataclass(frozen=True)
class Setup:
    """One row: who runs, with which API, in one process or two."""

    label: str
    system: str  # "ours", "ours-batch", "ours-tasks", "ours-ack", "ours-nowait" or a peer's KEY
    processes: int
    ref: str | None  # label of the row whose rate is divided by this row's
    target: float | None  # the lower bound for that ratio
    crash: str
    latency: bool = False


OURS_CRASH = ("kill: nothing put is lost / power cut: up to the last fsync lost "
              "(every 2,500 puts or 2 s)")
ACK_CRASH = ("kill: unfinished redelivered / power cut: up to the last fsync lost "
             "(every 2,500 puts or 2 s)")
OURS_TWO = "ours, 2 processes: put() / get()"
OURS_TWO_BATCH = "ours, 2 processes: put_many(64) / get_many(1024)"
OURS_TWO_TASKS = f"ours, 2 processes: {TASKS} tasks awaiting put() / async for"
OURS_TWO_ACK = "ours AckQueue, 2 processes: put() / get()+finish()"
# multiprocessing.Queue's put() returns before the message is sent (a feeder thread sends
# it later); put_nowait() is our call with that contract: the message is written shortly
# after, and is written to the OS before anything later is read.
OURS_TWO_NOWAIT = "ours, 2 processes: put_nowait() / get()"


def _peer_crash(cls: type[peers.Peer]) -> str:
    if cls.LEVEL == "durable":
        return "kill: nothing committed is lost / power cut: same (fsync per commit)"
    if cls.LEVEL == "kill":
        return "kill: nothing committed is lost / power cut: recent commits may be lost"
    return "kill: all in flight lost / power cut: all in flight lost (stores nothing)"


def setups() -> list[Setup]:
    """Every row, in the table's order."""
    rows = [
        Setup("ours, 1 process: put() / get()", "ours", 1, OURS_TWO, 0.8, OURS_CRASH, True),
        Setup(OURS_TWO, "ours", 2, None, None, OURS_CRASH, True),
        Setup("ours, 1 process: put_many(64) / get_many(1024)", "ours-batch", 1,
              OURS_TWO_BATCH, 0.8, OURS_CRASH),
        Setup(OURS_TWO_BATCH, "ours-batch", 2, None, None, OURS_CRASH),
        Setup(f"ours, 1 process: {TASKS} tasks awaiting put() / async for", "ours-tasks", 1,
              OURS_TWO_TASKS, 0.8, OURS_CRASH),
        Setup(OURS_TWO_TASKS, "ours-tasks", 2, None, None, OURS_CRASH),
        Setup(OURS_TWO_ACK, "ours-ack", 2, None, None, ACK_CRASH, True),
        Setup(OURS_TWO_NOWAIT, "ours-nowait", 2, None, None, OURS_CRASH),
    ]
    for cls in peers.PROCESS_PEERS:
        level_target = 1.0 if cls.LEVEL == "none" else 10.0
        # An acking peer is compared with our acking consumer.
        ref = OURS_TWO_ACK if cls is peers.PersistQueueSQLiteAck else OURS_TWO
        if cls is peers.MultiprocessingQueue:
            ref = OURS_TWO_NOWAIT  # the same contract: put() returns before it is sent
        rows.append(Setup(f"{cls.NAME}, 2 processes", cls.KEY, 2, ref, level_target,
                          _peer_crash(cls)))
    return rows


def _peer_class(key: str) -> type[peers.Peer]:
    return next(c for c in peers.PROCESS_PEERS if key == c.KEY)


# ---------------------------------------------------------------- in the child processes


@dataclass
class ChildResult:
    """What one child process reports: its times, CPU, latencies and its check."""

    start_ns: int = 0
    end_ns: int = 0
    cpu: float = 0.0
    latencies: list[int] = field(default_factory=list)
    error: str | None = None


class _Check:
    """Every message once and in order: its sequence number is the next one."""

    def __init__(self) -> None:
        self.count = 0
        self.error: str | None = None
        self.latencies: list[int] = []

    def feed(self, m: bytes, now: int) -> None:
        stamp, seq = HEAD.unpack_from(m)
        if self.error is None and (seq != self.count or len(m) != SIZE):
            self.error = f"message {self.count}: got sequence {seq}, {len(m)} bytes"
        self.latencies.append(now - stamp)
        self.count += 1


async def _produce_tasks(q: DiskQueue, n: int) -> None:
    """``TASKS`` tasks, each awaiting its put(): the one that takes the next sequence number
    puts it before any other can (put() accepts a message before its first suspension
    when the queue has no maxsize), so the queue holds them in order."""
    seqs = iter(range(n))

    async def one() -> None:
        for seq in seqs:
            await q.put(_msg(seq))

    await asyncio.gather(*(one() for _ in range(TASKS)))


async def _produce_nowait(q: DiskQueue, n: int) -> None:
    """put_nowait() per message, as a fire-and-forget producer calls it, letting the loop
    run after every ``NOWAIT_YIELD`` puts (as a service's other tasks would); while the
    write buffer is full (``write_buffer_bytes``), the put that found it full awaits room."""
    put_nowait = q.put_nowait
    for i in range(n):
        m = _msg(i)
        try:
            put_nowait(m)
        except QueueFull:
            await q.put(m)
        if i % NOWAIT_YIELD == NOWAIT_YIELD - 1:
            await asyncio.sleep(0)


async def _produce_ours(q: DiskQueue | AckQueue, n: int, rate: float, batch: bool,
                        first: list[int], tasks: bool = False, nowait: bool = False) -> None:
    first.append(time.monotonic_ns())
    if nowait:
        assert isinstance(q, DiskQueue)
        await _produce_nowait(q, n)
        return
    if tasks:
        assert isinstance(q, DiskQueue)
        await _produce_tasks(q, n)
        return
    if batch:
        for i in range(0, n, 64):
            await q.put_many([_msg(s) for s in range(i, min(n, i + 64))])
        return
    if rate <= 0:
        for i in range(n):
            await q.put(_msg(i))
        return
    start = time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await q.put(_msg(i))


async def _consume_ours(q: DiskQueue, n: int, batch: bool, check: _Check,
                        iterate: bool = False) -> int:
    clock = time.monotonic_ns
    if iterate:
        if n > 0:
            async for m in q:
                check.feed(m, clock())
                if check.count >= n:
                    break
    elif batch:
        while check.count < n:
            for m in await q.get_many(1024):
                check.feed(m, clock())
    else:
        while check.count < n:
            check.feed(await q.get(), clock())
    return clock()


async def _consume_ack(q: AckQueue, n: int, check: _Check) -> int:
    clock = time.monotonic_ns
    while check.count < n:
        m = await q.get()
        check.feed(m.body, clock())
        await m.finish()
    return clock()


async def _ours(system: str, role: str, directory: str, n: int, rate: float,
                go: Callable[[], Awaitable[None]], out: ChildResult) -> None:
    batch = system == "ours-batch"
    tasks = system == "ours-tasks"
    nowait = system == "ours-nowait"
    check = _Check()
    first: list[int] = []
    if system == "ours-ack":
        async with AckQueue(directory, "q", role) as aq:
            await go()
            if role == "producer":
                await _produce_ours(aq, n, rate, False, first)
            else:
                out.end_ns = await _consume_ack(aq, n, check)
    else:
        async with DiskQueue(directory, "q", role) as q:
            await go()
            if role == "producer":
                await _produce_ours(q, n, rate, batch, first, tasks, nowait)
            elif role == "consumer":
                out.end_ns = await _consume_ours(q, n, batch, check, tasks)
            else:
                cons = asyncio.ensure_future(_consume_ours(q, n, batch, check, tasks))
                await _produce_ours(q, n, rate, batch, first, tasks, nowait)
                out.end_ns = await cons
    out.start_ns = first[0] if first else 0
    out.latencies = check.latencies
    out.error = check.error


def _peer(key: str, role: str, directory: str, n: int, shared: object,
          go: Callable[[], None], out: ChildResult) -> None:
    q = _peer_class(key).attach(directory, shared)
    try:
        go()
        if role == "producer":
            out.start_ns = time.monotonic_ns()
            put = q.put
            for i in range(n):
                put(_msg(i))
        else:
            check = _Check()
            get = q.get_wait
            clock = time.monotonic_ns
            for _ in range(n):
                check.feed(get(), clock())
            out.end_ns = clock()
            out.latencies = check.latencies
            out.error = check.error
    finally:
        q.close()


def _uvloop_run(coro: Awaitable[None], loop: str) -> None:
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coro)  # type: ignore[arg-type]
            return
    asyncio.run(coro)  # type: ignore[arg-type]


def child(system: str, role: str, directory: str, n: int, rate: float, loop: str,
          conn: Connection, shared: object) -> None:
    """One process of a row: open the queue, say "ready", wait for "go", run, report.

    The CPU it reports is its own (every thread) from "go" until the queue is closed.
    """
    out = ChildResult()
    cpu0 = [0.0]

    def go() -> None:
        conn.send("ready")
        conn.recv()
        cpu0[0] = _cpu()

    async def ago() -> None:
        go()

    try:
        if system.startswith("ours"):
            _uvloop_run(_ours(system, role, directory, n, rate, ago, out), loop)
        else:
            _peer(system, role, directory, n, shared, go, out)
        out.cpu = _cpu() - cpu0[0]
    except BaseException as exc:  # noqa: BLE001  # reported as the row's failure
        out.error = f"{role}: {type(exc).__name__}: {exc}"
        try:
            conn.send("ready")  # the parent may still wait for it
        except OSError:
            pass
    conn.send(out)


# ---------------------------------------------------------------- in the parent


@dataclass
class Row:
    """One measured row."""

    setup: Setup
    rate: float = 0.0
    cpu_per_1k: float = 0.0
    p50: float | None = None
    p99: float | None = None
    error: str | None = None
    below: float | None = None  # timed out: the rate was below this
    note: str | None = None
    spread: tuple[float, float] | None = None  # lowest and highest rate of the repetitions


async def _make_ours(system: str, directory: str) -> None:
    if system == "ours-ack":
        async with AckQueue(directory, "q", "producer"):
            pass
    else:
        async with DiskQueue(directory, "q", "producer"):
            pass


def _prepare(system: str, directory: str) -> object:
    if system.startswith("ours"):
        asyncio.run(_make_ours(system, directory))
        return None
    return _peer_class(system).prepare(directory)


class TimedOut(Exception):
    """A row's processes did not finish within the time limit, ``seconds`` after "go"."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"not done {seconds:.0f} s after the start")
        self.seconds = seconds


def run_once(s: Setup, n: int, rate: float, loop: str, tmp: str | None,
             timeout: float) -> tuple[list[ChildResult], str | None]:
    """Start the row's processes (the consumer first), let them go at once, collect.

    Raises TimedOut if they are not done ``timeout`` seconds after the start signal.
    """
    d = tempfile.mkdtemp(prefix="aiodiskqueue-roles-", dir=tmp)
    procs: list[tuple[Any, Connection]] = []
    try:
        roles = ["both"] if s.processes == 1 else ["consumer", "producer"]
        shared = None if s.processes == 1 else _prepare(s.system, d)
        for role in roles:
            mine, theirs = CTX.Pipe()
            p = CTX.Process(target=child, args=(s.system, role, d, n, rate, loop, theirs,
                                                shared), daemon=True)
            p.start()
            theirs.close()
            procs.append((p, mine))
        for _, c in procs:
            if not c.poll(120):
                return [], "a process did not open its queue within 120 s"
            c.recv()
        for _, c in procs:
            c.send("go")
        went = time.monotonic()
        deadline = went + timeout
        # Whichever reports first: a producer that failed must not leave us waiting for
        # the consumer's last message until the deadline.
        results: list[ChildResult] = []
        waiting = [c for _, c in procs]
        while waiting:
            ready = multiprocessing.connection.wait(
                waiting, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimedOut(time.monotonic() - went)
            for conn in ready:
                assert isinstance(conn, Connection)
                got = conn.recv()
                if got == "ready":  # a failed child's extra "ready"
                    continue
                waiting.remove(conn)
                results.append(got)
                if got.error:
                    return [], got.error
        for p, _ in procs:
            p.join(timeout=30)
        return results, None
    finally:
        for p, c in procs:
            if p.is_alive():
                p.kill()
                p.join()
            c.close()
        shutil.rmtree(d, ignore_errors=True)


def _pct(lat: list[int], p: float) -> float:
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6


def measure(s: Setup, n: int, rate_n: int, loop: str, tmp: str | None,
            limit: float) -> Row:
    """Throughput and CPU of one row, then its latency at 1,000 messages/s if it has one.

    A row not done within ``limit`` seconds gets an upper bound of its rate instead.
    """
    row = Row(s)
    try:
        results, err = run_once(s, n, 0.0, loop, tmp, limit)
    except TimedOut as t:
        row.below, row.note = n / t.seconds, f"not done in {t.seconds:.0f} s"
        return row
    if err is not None:
        row.error = err
        return row
    start = min(r.start_ns for r in results if r.start_ns)
    end = max(r.end_ns for r in results)
    row.rate = n / ((end - start) / 1e9)
    row.cpu_per_1k = sum(r.cpu for r in results) / n * 1000
    if s.latency and rate_n > 0:
        try:
            results, err = run_once(s, rate_n, LATENCY_RATE, loop, tmp,
                                    limit + rate_n / LATENCY_RATE)
        except TimedOut as t:
            err = str(t)
        if err is not None:
            row.error = f"latency run: {err}"
            return row
        lat = [x for r in results for x in r.latencies]
        row.p50, row.p99 = _pct(lat, 0.5), _pct(lat, 0.99)
    return row


def median_row(reps: list[Row]) -> Row:
    """One row of several repetitions: the first failure or time-out, else the repetition
    with the median rate (the upper middle one of an even number), with the range of the
    rates."""
    for r in reps:
        if r.error or r.below:
            return r
    ordered = sorted(reps, key=lambda r: r.rate)
    mid = ordered[len(ordered) // 2]
    if len(reps) > 1:
        mid.spread = (ordered[0].rate, ordered[-1].rate)
    return mid


def _fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def table(rows: list[Row]) -> list[str]:
    """The markdown table and the targets' summary lines."""
    by_label = {r.setup.label: r for r in rows}
    lines = [
        "| setup | msgs/s | ours / row | target | CPU s / 1k msgs | p50 ms | p99 ms "
        "| check | crash guarantee |",
        "|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    summary: list[str] = []
    for r in rows:
        s = r.setup
        ratio = "-"
        target = "-"
        rate = _fmt_rate(r.rate)
        ref = by_label.get(s.ref) if s.ref else None
        if ref is not None and ref.rate > 0 and (r.rate > 0 or r.below):
            # A row that timed out was slower than ``below``: ours is more than this many
            # times faster, which meets a target only if that bound already does.
            x = ref.rate / (r.rate or r.below or 1.0)
            more = "> " if r.below else ""
            ratio = f"{more}{x:.2f}x"
            if s.target is not None:
                met = ("met" if x >= s.target else "unknown (timed out)" if r.below
                       else "MISSED")
                target = f">= {s.target:g}x {met}"
                what = (f"ours two-process / one-process ({s.label.split(': ', 1)[1]})"
                        if s.system.startswith("ours") else f"{ref.setup.label} / {s.label}")
                summary.append(f"- {what}: {ratio}, target >= {s.target:g}x: {met}")
        if r.below:
            rate = f"< {_fmt_rate(r.below)}"
        elif r.spread:
            rate += f" ({_fmt_rate(r.spread[0])}-{_fmt_rate(r.spread[1])})"
        if s.ref is None:
            target = "(reference)"
        check = "FAIL: " + r.error if r.error else (r.note or "ok")
        lines.append(f"| {s.label} | {rate} | {ratio} | {target} "
                     f"| {r.cpu_per_1k:.3f} | {_fmt_ms(r.p50)} | {_fmt_ms(r.p99)} "
                     f"| {check} | {s.crash} |")
        if s.latency and s.processes == 2 and r.p50 is not None and r.p99 is not None:
            ok50 = "met" if r.p50 <= TARGET_P50_MS else "MISSED"
            ok99 = "met" if r.p99 <= TARGET_P99_MS else "MISSED"
            summary.append(f"- {s.label} at 1,000 msgs/s: p50 {r.p50:.3f} ms "
                           f"(target <= {TARGET_P50_MS:g} ms: {ok50}), p99 {r.p99:.3f} ms "
                           f"(target <= {TARGET_P99_MS:g} ms: {ok99})")
    return [*lines, "", "Targets (issue: one queue, two processes):", *summary]


def main() -> None:
    """Parse the arguments, run every row, print the table."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="messages per throughput row")
    ap.add_argument("--rate-n", type=int, default=3000,
                    help="messages per latency row, put at 1,000/s (0: no latency rows)")
    ap.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    ap.add_argument("--systems", default="all",
                    help="comma-separated: ours, " + ", ".join(c.KEY for c in peers.PROCESS_PEERS)
                    + " (ours runs every row of ours; default all)")
    ap.add_argument("--tmpdir", default=None, help="where the queues go (default: the system's)")
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions of every row, interleaved; the median and the range shown")
    ap.add_argument("--row-timeout", type=float, default=300.0,
                    help="seconds a row may run; a slower one shows an upper bound of its rate")
    args = ap.parse_args()
    if args.n <= 0 or args.reps <= 0 or args.rate_n < 0 or args.row_timeout <= 0:
        ap.error(f"--n, --reps and --row-timeout must be > 0 and --rate-n >= 0, got {args.n}, "
                 f"{args.reps}, {args.row_timeout} and {args.rate_n}")
    wanted = None if args.systems == "all" else set(args.systems.split(","))
    known = {"ours", *(c.KEY for c in peers.PROCESS_PEERS)}
    if wanted is not None and not wanted <= known:
        ap.error(f"unknown systems {sorted(wanted - known)}; known: {sorted(known)}")
    skipped = []
    todo = []
    for s in setups():
        key = "ours" if s.system.startswith("ours") else s.system
        if wanted is not None and key not in wanted:
            continue
        if key != "ours" and not _peer_class(key).available():
            skipped.append(f"{s.label}: not installed")
            continue
        todo.append(s)
    reps: dict[str, list[Row]] = {s.label: [] for s in todo}
    for i in range(args.reps):
        for s in todo:  # the repetitions interleaved: each sees the machine's moods alike
            t = time.monotonic()
            reps[s.label].append(measure(s, args.n, args.rate_n, args.loop, args.tmpdir,
                                         args.row_timeout))
            print(f"# rep {i + 1}/{args.reps} {s.label}: {time.monotonic() - t:.1f} s",
                  file=sys.stderr, flush=True)
    rows = [median_row(reps[s.label]) for s in todo]
    versions = ", ".join(f"{c.NAME} {c.version()}" for c in peers.PROCESS_PEERS
                         if wanted is None or c.KEY in wanted)
    print(f"{SIZE} B messages, {args.n} per throughput row x {args.reps}, {args.rate_n} at "
          f"{LATENCY_RATE:,.0f}/s per latency row, our loop {args.loop}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"versions: {versions}")
    print()
    for line in table(rows):
        print(line)
    for why in skipped:
        print(f"skipped: {why}")
    if any(r.error for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
