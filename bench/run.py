#!/usr/bin/env python
"""Benchmark aiodiskqueue against the Python peers and a raw baseline, in one run.

Usage: ``python bench/run.py [--quick] [--loop asyncio|uvloop|both] [--sizes 16,1024]
[--reps N] [--only WORKLOAD] [--systems ours,raw,queuelib,...] [--out PATH]``.

Prints a table and writes ``bench/results/latest.json``. Every repetition runs
in a fresh directory on the repository's filesystem, and ends by reading every
message back and checking that it came back once, in order (per producer when
there are several); the table's ``check`` column says so. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.metadata
import json
import os
import platform
import pstats
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _p in (str(REPO), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import baseline
import peers

import aiodiskqueue
from aiodiskqueue import DiskQueue

WORKLOADS = ("put", "put_many", "drain", "get_many", "durable")
DEFAULT_SIZES = (16, 256, 1024, 4096)
BATCH = 1000
OURS = "aiodiskqueue"
RAW_WRITE = "raw os.write 1 MiB"
RAW_SYNC = "raw os.write+fdatasync 1 MiB"
RAW_READ = "raw os.read 1 MiB"
LEVEL_RANK = {"none": 0, "kill": 1, "durable": 2, "-": -1}

OURS_DEFAULT = ("kill-safe; fsync/2500 or 2s", "kill",
                ("kill-safe: written to the OS before put() returns; fsync every 2500 "
                 "messages or 2 s (defaults), so power loss may lose the last ones"))
OURS_DURABLE = ("durable: group fsync", "durable",
                ("durable: sync_every=1, put() returns after the fsync that covers it; "
                 "concurrent puts share one fsync"))
OURS_READ = ("kill-safe; at-least-once", "kill",
             ("reads: a message taken after the last meta sync may be delivered again "
              "after a crash, none is lost"))

# --------------------------------------------------------------------------- config


@dataclass
class Config:
    """What one run measures and how long each part may take."""

    sizes: list[int]
    loops: list[str]
    reps: int
    n: int
    """Messages per repetition for the fast rows (capped by ``bytes_cap``)."""
    bytes_cap: int
    durable_n: int
    """Upper bound on messages per durable repetition (time-boxed as well)."""
    ours_box: float
    """Seconds of producing per repetition of ours, non-durable (the count is a cap)."""
    durable_box: float
    """Seconds of producing per durable repetition of ours."""
    peer_box: float
    """Seconds of producing per repetition of a peer (their drains read what was put)."""
    only: set[str]
    producers: set[int] | None
    """Run only scenarios with these producer counts (None: all)."""
    systems: set[str] | None
    tmp_base: str
    out: Path
    quick: bool
    profile: Path | None

    def count(self, size: int) -> int:
        """Messages per fast repetition for ``size``-byte messages."""
        return max(1, min(self.n, self.bytes_cap // (size + 4)))

    def wants(self, system_key: str) -> bool:
        """True if ``--systems`` includes ``system_key`` (or was not given)."""
        return self.systems is None or system_key in self.systems


# --------------------------------------------------------------------------- results


@dataclass
class Acc:
    """Every repetition of one row."""

    workload: str
    system: str
    size: int
    producers: int
    loop: str
    guarantee: str
    level: str
    detail: str
    how: str
    rates: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)  # process CPU seconds per wall second
    counts: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verified: int = 0


class Results:
    """Collects repetitions per row key."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int, int, str], Acc] = {}
        self.skipped: list[str] = []

    def add(self, *, workload: str, system: str, size: int, producers: int, loop: str,
            g: tuple[str, str, str], how: str, count: int, secs: float,
            error: str | None, cpu: float | None = None) -> None:
        """Record one repetition; ``error`` is None when its check passed; ``cpu``
        is the process CPU time (all threads) spent in the ``secs`` measured."""
        key = (workload, system, size, producers, loop)
        acc = self.rows.get(key)
        if acc is None:
            acc = self.rows[key] = Acc(workload, system, size, producers, loop, g[0], g[1],
                                       g[2], how)
        if count > 0 and secs > 0:
            acc.rates.append(count / secs)
            acc.counts.append(count)
            if cpu is not None:
                acc.cpus.append(cpu / secs)
        if error is None:
            acc.verified += 1
        else:
            acc.errors.append(error)

    def skip(self, note: str) -> None:
        """Note a workload a system cannot run, once."""
        if note not in self.skipped:
            self.skipped.append(note)


# --------------------------------------------------------------------------- payloads and checks

_HDR = struct.Struct(">II")


def make_payloads(size: int, counts: Sequence[int]) -> list[list[bytes]]:
    """Per producer, ``counts[p]`` messages of ``size`` bytes carrying (producer, index)."""
    if size < _HDR.size:
        raise ValueError(f"message size must be >= {_HDR.size} bytes, got {size}")
    pad = b"." * (size - _HDR.size)
    pack = _HDR.pack
    return [[pack(p, i) + pad for i in range(k)] for p, k in enumerate(counts)]


class OrderCheck:
    """Checks a consume's messages as they come, in chunks, against what was put: each
    producer's in order, none missing, repeated or unknown. Keeps none of them.

    A consumer loop that kept every message (100,000 x 1 KiB: 100 MB of fresh memory)
    would measure its own page faults, about 1 us per message on the reference VM
    (see README, "The drain row and the messages it kept"); one that hands each chunk
    here and clears it reuses the same memory, as a service handling messages does.
    """

    def __init__(self, expected: Sequence[Sequence[bytes]]) -> None:
        self.expected = [list(e) for e in expected]  # once, before any timed phase
        self.next = [0] * len(expected)
        self.count = 0
        self.error: str | None = None

    def feed(self, got: Sequence[bytes]) -> None:
        """Check the next messages (the caller may reuse ``got`` afterwards)."""
        start = self.count
        self.count += len(got)
        if self.error is not None or not got:
            return
        if len(self.expected) == 1:
            exp, i = self.expected[0], self.next[0]
            self.next[0] = i + len(got)
            if (got if type(got) is list else list(got)) == exp[i:i + len(got)]:
                return
            j = next((j for j, (a, b) in enumerate(zip(got, exp[i:], strict=False))
                      if a != b), len(exp) - i)
            if i + j >= len(exp):
                self.error = f"got more than the {len(exp)} messages put"
            else:
                self.error = (f"message {start + j} differs: got {got[j][:8].hex()}, "
                              f"expected {exp[i + j][:8].hex()}")
            return
        for m in got:
            (p, _) = _HDR.unpack_from(m)
            if p >= len(self.expected):
                self.error = f"message from unknown producer {p}"
                return
            k = self.next[p]
            if k >= len(self.expected[p]) or m != self.expected[p][k]:
                self.error = f"producer {p}: messages missing, repeated or out of order"
                return
            self.next[p] = k + 1

    def result(self) -> str | None:
        """None if exactly the expected messages came, each producer's in order."""
        total = sum(len(e) for e in self.expected)
        if self.error is None and self.count != total:
            return f"got {self.count} messages, expected {total}"
        return self.error


def check_order(got: Sequence[bytes], expected: Sequence[Sequence[bytes]]) -> str | None:
    """None if ``got`` holds exactly the expected messages, each producer's in order."""
    check = OrderCheck(expected)
    check.feed(got)
    return check.result()


# --------------------------------------------------------------------------- profiling


class PhaseProfile:
    """cProfile around the timed phases of our rows (the event loop's thread only).

    The I/O thread is not seen by cProfile; use py-spy for it (see bench/README.md).
    """

    def __init__(self, rows: set[str], path: Path) -> None:
        self.rows = rows
        self.path = path
        self.prof = cProfile.Profile()
        self.messages = 0
        self._on = False

    def start(self, row: str) -> None:
        """Start profiling if ``row`` is one of the profiled workloads."""
        if row in self.rows:
            self.prof.enable()
            self._on = True

    def stop(self, messages: int) -> None:
        """Stop profiling; count ``messages`` if it was running."""
        if self._on:
            self.prof.disable()
            self._on = False
            self.messages += messages

    def report(self, top: int = 25) -> str:
        """Dump the stats to ``path`` and return the top functions by own time per message."""
        self.prof.dump_stats(str(self.path))
        st = pstats.Stats(self.prof)
        raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in raw.values()) or 1e-9
        n = max(1, self.messages)
        head = (f"profile of {', '.join(sorted(self.rows))} on the loop thread: {self.messages} "
                f"messages, {total * 1e6 / n:.2f} us/msg under cProfile (stats in {self.path})")
        lines = [head, "  own%   us/msg  calls/msg  function"]
        for (file, line, fn), (_, ncalls, tottime, _, _) in sorted(
                raw.items(), key=lambda kv: -kv[1][2])[:top]:
            where = f"{Path(file).name}:{line}" if line else "built-in"
            lines.append(f"{100 * tottime / total:6.1f}  {tottime * 1e6 / n:7.3f}  "
                         f"{ncalls / n:9.3f}  {fn} ({where})")
        return "\n".join(lines)


PROFILE: PhaseProfile | None = None


def _prof_start(row: str | None) -> None:
    if PROFILE is not None and row is not None:
        PROFILE.start(row)


def _prof_stop(messages: int) -> None:
    if PROFILE is not None:
        PROFILE.stop(messages)


# --------------------------------------------------------------------------- ours


async def _put_ours(q: DiskQueue, lists: list[list[bytes]], deadline: float
                    ) -> tuple[list[int], float]:
    async def producer(lst: list[bytes]) -> int:
        put = q.put
        clock = time.perf_counter
        i = 0
        for p in lst:
            if clock() >= deadline:
                break
            await put(p)
            i += 1
        return i

    t0 = time.perf_counter()
    if len(lists) == 1:
        done = [await producer(lists[0])]
    else:
        done = list(await asyncio.gather(*(producer(lst) for lst in lists)))
    return done, time.perf_counter() - t0


async def _put_many_ours(q: DiskQueue, lst: list[bytes], deadline: float) -> tuple[int, float]:
    clock = time.perf_counter
    t0 = clock()
    done = 0
    for i in range(0, len(lst), BATCH):
        if clock() >= deadline:
            break
        await q.put_many(lst[i:i + BATCH])
        done = min(i + BATCH, len(lst))
    return done, clock() - t0


async def _drain_ours(q: DiskQueue, check: OrderCheck, n: int, batched: bool) -> float:
    """Take ``n`` messages, handing them to ``check`` a chunk at a time; the seconds."""
    t0 = time.perf_counter()
    if n == 0:
        pass
    elif batched:
        while check.count < n:
            check.feed(await q.get_many(BATCH))
    else:
        out: list[bytes] = []
        append = out.append
        limit = min(BATCH, n)
        async for m in q:
            append(m)
            if len(out) >= limit:
                check.feed(out)
                out.clear()
                limit = min(BATCH, n - check.count)
                if limit <= 0:
                    break
    return time.perf_counter() - t0


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread included (the queue's own threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


OUR_OPTIONS: dict[str, Any] = {}
"""Options of our queues in every row (``--inline-writes`` adds ``inline_writes=True``)."""


async def ours_rep(scenario: str, d: str, lists: list[list[bytes]], box: float
                   ) -> tuple[float, int, float, int, str | None, float, float]:
    """One repetition of ours: produce (time-boxed), reopen, consume everything, check.

    Returns the produce seconds and the messages the timed produce stored, the
    consume seconds and messages, None or what the check found wrong, and the
    CPU seconds of the produce and of the consume.
    """
    durable = scenario == "durable"
    opts: dict[str, Any] = dict(OUR_OPTIONS, sync_every=1) if durable else dict(OUR_OPTIONS)
    async with DiskQueue(d, "bench", **opts) as q:
        gc.collect()
        deadline = time.perf_counter() + box
        _prof_start(scenario)
        c0 = cpu_seconds()
        if scenario == "put_many":
            k, put_secs = await _put_many_ours(q, lists[0], deadline)
            done = [k]
        else:
            done, put_secs = await _put_ours(q, lists, deadline)
        put_cpu = cpu_seconds() - c0
        put_count = sum(done)
        _prof_stop(put_count)
        if scenario == "put" and len(lists) == 1 and done[0] < len(lists[0]):
            # Untimed top-up, so the drain row always reads the full count.
            for i in range(done[0], len(lists[0]), BATCH):
                await q.put_many(lists[0][i:i + BATCH])
            done = [len(lists[0])]
    expected = [lst[:k] for lst, k in zip(lists, done, strict=True)]
    total = sum(done)
    async with DiskQueue(d, "bench") as q:
        if q.qsize() != total:
            return (put_secs, put_count, 0.0, total,
                    f"reopened with qsize {q.qsize()}, expected {total}", put_cpu, 0.0)
        gc.collect()
        _prof_start({"put": "drain", "put_many": "get_many"}.get(scenario))
        check = OrderCheck(expected)
        c0 = cpu_seconds()
        get_secs = await _drain_ours(q, check, total, batched=scenario == "put_many")
        get_cpu = cpu_seconds() - c0
        _prof_stop(check.count)
        left = q.qsize()
    err = check.result()
    if err is None and left:
        err = f"{left} messages left after the drain"
    return put_secs, put_count, get_secs, total, err, put_cpu, get_cpu


def _loop_runner(loop_name: str) -> asyncio.Runner:
    if loop_name == "uvloop":
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def run_in_loop(loop_name: str, make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make()`` in a fresh event loop of the given kind."""
    with _loop_runner(loop_name) as runner:
        return runner.run(make())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- peers


def _peer_put(cls: type[peers.Peer], d: str, lists: list[list[bytes]], box: float,
              batched: bool) -> tuple[list[int], float, float]:
    clock = time.perf_counter
    if len(lists) == 1:
        lst = lists[0]
        q = cls(d, batch=batched)
        try:
            gc.collect()
            c0 = cpu_seconds()
            t0 = clock()
            deadline = t0 + box
            i = 0
            if batched:
                for i in range(0, len(lst), BATCH):
                    if clock() >= deadline:
                        break
                    q.put_batch(lst[i:i + BATCH])
                else:
                    i = len(lst)
            else:
                put = q.put
                for p in lst:
                    if clock() >= deadline:
                        break
                    put(p)
                    i += 1
            secs = clock() - t0
            cpu = cpu_seconds() - c0
        finally:
            q.close()
        return [i], secs, cpu

    q = cls(d, threads=True)
    counts = [0] * len(lists)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(lists) + 1)
    deadline_box: list[float] = []

    def work(k: int) -> None:
        put = q.put
        barrier.wait()
        deadline = deadline_box[0]
        i = 0
        try:
            for p in lists[k]:
                if clock() >= deadline:
                    break
                put(p)
                i += 1
        except Exception as exc:  # noqa: BLE001  # re-raised in the calling thread
            errors.append(exc)
        counts[k] = i

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(lists))]
    try:
        for t in threads:
            t.start()
        gc.collect()
        c0 = cpu_seconds()
        t0 = clock()
        deadline_box.append(t0 + box)
        barrier.wait()
        for t in threads:
            t.join()
        secs = clock() - t0
        cpu = cpu_seconds() - c0
    finally:
        q.close()
    if errors:
        raise errors[0]
    return counts, secs, cpu


def _peer_drain(cls: type[peers.Peer], d: str, check: OrderCheck, n: int, batched: bool,
                box: float) -> tuple[int, float, list[bytes], float]:
    """Take up to ``n`` messages within ``box`` seconds (timed), then the rest (untimed),
    handing them to ``check`` a chunk at a time.

    Returns how many the timed part took, its seconds, anything the peer returned
    beyond ``n``, and the timed part's CPU seconds.
    """
    q = cls(d)
    try:
        clock = time.perf_counter
        gc.collect()
        c0 = cpu_seconds()
        t0 = clock()
        deadline = t0 + box
        if batched:
            while check.count < n and clock() < deadline:
                got = q.get_batch(min(BATCH, n - check.count))
                if not got:
                    break
                check.feed(got)
        else:
            out: list[bytes] = []
            get = q.get
            append = out.append
            for _ in range(n):
                if clock() >= deadline:
                    break
                append(get())
                if len(out) >= BATCH:
                    check.feed(out)
                    out.clear()
            check.feed(out)
        secs = clock() - t0
        cpu = cpu_seconds() - c0
        timed = check.count
        rest = q.rest()
        check.feed(rest[:n - timed])
    finally:
        q.close()
    return timed, secs, rest[n - timed:], cpu


def peer_rep(cls: type[peers.Peer], scenario: str, d: str, lists: list[list[bytes]], box: float
             ) -> tuple[float, float, int, int, str | None, float, float]:
    """One repetition of a peer: produce and consume (each time-boxed), check everything.

    Returns the produce seconds, the timed consume seconds, the messages stored,
    how many the timed consume took, None or what the check found wrong, and the
    CPU seconds of the produce and of the timed consume.
    """
    batched = scenario == "put_many"
    done, put_secs, put_cpu = _peer_put(cls, d, lists, box, batched)
    expected = [lst[:k] for lst, k in zip(lists, done, strict=True)]
    total = sum(done)
    check = OrderCheck(expected)
    timed, get_secs, extra, get_cpu = _peer_drain(
        cls, d, check, total, batched and cls.GET_BATCH is not None, box)
    err = check.result()
    if err is None and extra:
        err = f"{len(extra)} messages returned after the last one put"
    return put_secs, get_secs, total, timed, err, put_cpu, get_cpu


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Scenario:
    """One produce-then-consume pass and the rows it yields."""

    name: str
    """``put``, ``put_many`` or ``durable``."""
    producers: int
    put_row: str | None
    get_row: str | None


SCENARIOS = [
    Scenario("put", 1, "put", "drain"),
    Scenario("put", 16, "put", None),
    Scenario("put_many", 1, "put_many", "get_many"),
    Scenario("durable", 1, "durable", None),
    Scenario("durable", 16, "durable", None),
    Scenario("durable", 64, "durable", None),
]


def _fresh_dir(cfg: Config) -> str:
    return tempfile.mkdtemp(prefix="aiodiskqueue-bench-", dir=cfg.tmp_base)


def _split(n: int, producers: int) -> list[int]:
    return [n // producers + (1 if p < n % producers else 0) for p in range(producers)]


def run_size(cfg: Config, size: int, res: Results, log: Callable[[str], None]) -> None:
    """Every scenario for one message size, repetitions interleaved across systems."""
    peer_classes = [c for c in peers.PEERS if cfg.wants(c.KEY) and c.available()]
    for sc in SCENARIOS:
        rows = {r for r in (sc.put_row, sc.get_row) if r is not None}
        if not rows & cfg.only:
            continue
        if cfg.producers is not None and sc.producers not in cfg.producers:
            continue
        durable = sc.name == "durable"
        n = min(cfg.count(size), cfg.durable_n) if durable else cfg.count(size)
        lists = make_payloads(size, _split(n, sc.producers))
        log(f"size {size:>5} B  {sc.name:<8} x{sc.producers:<3} {n} msgs")
        for rep in range(cfg.reps):
            spent: list[str] = []
            clock = time.perf_counter
            if cfg.wants("ours"):
                for loop_name in cfg.loops:
                    t = clock()
                    _rep_ours(cfg, sc, size, lists, loop_name, res)
                    spent.append(f"ours/{loop_name} {clock() - t:.1f}s")
            if cfg.wants("raw") and sc.producers == 1 and sc.name in ("put", "durable"):
                t = clock()
                _rep_raw(cfg, sc, size, lists[0], res)
                spent.append(f"raw {clock() - t:.1f}s")
            for cls in peer_classes:
                t = clock()
                _rep_peer(cfg, sc, size, lists, cls, res)
                spent.append(f"{cls.KEY} {clock() - t:.1f}s")
            log(f"    rep {rep + 1}/{cfg.reps}: {', '.join(spent)}")
        del lists
        gc.collect()


def _rep_ours(cfg: Config, sc: Scenario, size: int, lists: list[list[bytes]], loop_name: str,
              res: Results) -> None:
    d = _fresh_dir(cfg)
    box = cfg.durable_box if sc.name == "durable" else cfg.ours_box
    # A generous limit, so an engine that stops making progress shows as a FAIL row.
    limit = 60.0 + 20 * box
    put_c = get_c = 0.0
    try:
        put_s, put_n, get_s, get_n, err, put_c, get_c = run_in_loop(
            loop_name, lambda: asyncio.wait_for(ours_rep(sc.name, d, lists, box), limit))
    except TimeoutError:
        put_s, put_n, get_s, get_n, err = 0.0, 0, 0.0, 0, f"no progress within {limit:.0f} s"
    except Exception as exc:  # noqa: BLE001  # a failed repetition is a FAIL row, not a crash
        put_s, put_n, get_s, get_n, err = 0.0, 0, 0.0, 0, f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    how = (f"{sc.producers} asyncio tasks" if sc.producers > 1
           else ("put_many(1000 items)" if sc.name == "put_many" else "one task, await put()"))
    g = OURS_DURABLE if sc.name == "durable" else OURS_DEFAULT
    if sc.put_row in cfg.only:
        res.add(workload=sc.put_row, system=OURS, size=size, producers=sc.producers,
                loop=loop_name, g=g, how=how, count=put_n, secs=put_s, error=err, cpu=put_c)
    if sc.get_row is not None and sc.get_row in cfg.only:
        how = "get_many(1000)" if sc.get_row == "get_many" else "async for"
        res.add(workload=sc.get_row, system=OURS, size=size, producers=1, loop=loop_name,
                g=OURS_READ, how=how, count=get_n, secs=get_s, error=err, cpu=get_c)


def _rep_raw(cfg: Config, sc: Scenario, size: int, lst: list[bytes], res: Results) -> None:
    d = _fresh_dir(cfg)
    path = os.path.join(d, "raw.dat")
    sync = sc.name == "durable"
    err: str | None
    put_c = get_c = 0.0
    try:
        gc.collect()
        c0 = cpu_seconds()
        put_s = baseline.write_records(path, lst, sync=sync)
        put_c = cpu_seconds() - c0
        check = OrderCheck([lst])
        gc.collect()
        c0 = cpu_seconds()
        _, get_s = baseline.read_records(path, sink=check.feed)
        get_c = cpu_seconds() - c0
        err = check.result()
    except Exception as exc:  # noqa: BLE001  # a failed repetition is a FAIL row, not a crash
        put_s, get_s, err = 0.0, 0.0, f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if sync:
        if "durable" in cfg.only:
            res.add(workload="durable", system=RAW_SYNC, size=size, producers=1, loop="-",
                    g=("durable: fdatasync/1MiB", "durable",
                       "durable: os.fdatasync after every 1 MiB os.write"),
                    how="framing loop", count=len(lst), secs=put_s, error=err, cpu=put_c)
        return
    if "put" in cfg.only or "put_many" in cfg.only:
        res.add(workload="put", system=RAW_WRITE, size=size, producers=1, loop="-",
                g=("kill-safe; no fsync", "kill", "kill-safe: os.write returned; no fsync"),
                how="framing loop", count=len(lst), secs=put_s, error=err, cpu=put_c)
    if "drain" in cfg.only or "get_many" in cfg.only:
        res.add(workload="drain", system=RAW_READ, size=size, producers=1, loop="-",
                g=("-", "-", "reads only"), how="parse loop", count=len(lst), secs=get_s,
                error=err, cpu=get_c)


def _peer_short(cls: type[peers.Peer]) -> tuple[str, str, str]:
    return (cls.GUARANTEE.split(":")[0] + ":" + _short_mode(cls), cls.LEVEL, cls.GUARANTEE)


def _short_mode(cls: type[peers.Peer]) -> str:
    text = cls.GUARANTEE
    if "until close" in text:
        return " state in RAM until close()"
    if "synchronous=FULL" in text or "sqlite_synchronous=2" in text:
        return " WAL FULL"
    if "synchronous=NORMAL" in text:
        return " WAL NORMAL"
    return " no fsync per put"


def _rep_peer(cfg: Config, sc: Scenario, size: int, lists: list[list[bytes]],
              cls: type[peers.Peer], res: Results) -> None:
    durable = sc.name == "durable"
    if durable and not cls.DURABLE:
        return
    if not durable and not cls.STANDARD:
        return
    if sc.producers > 1 and cls.THREADS is None:
        res.skip(f"{cls.NAME}: {sc.producers} producers n/a (not thread-safe)")
        return
    if sc.name == "put_many" and cls.PUT_BATCH is None:
        res.skip(f"{cls.NAME}: put_many and get_many n/a (no batch API)")
        return
    d = _fresh_dir(cfg)
    put_c = get_c = 0.0
    try:
        put_s, get_s, total, taken, err, put_c, get_c = peer_rep(cls, sc.name, d, lists,
                                                                 cfg.peer_box)
    except Exception as exc:  # noqa: BLE001  # a failed repetition is a FAIL row, not a crash
        put_s, get_s, total, taken, err = 0.0, 0.0, 0, 0, f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    g = _peer_short(cls)
    if sc.producers > 1:
        how = f"{sc.producers} {cls.THREADS}"
    elif sc.name == "put_many":
        how = cls.PUT_BATCH or ""
    else:
        how = "plain loop"
    if sc.put_row in cfg.only:
        res.add(workload=sc.put_row, system=cls.NAME, size=size, producers=sc.producers,
                loop="-", g=g, how=how, count=total, secs=put_s, error=err, cpu=put_c)
    if sc.get_row is not None and sc.get_row in cfg.only:
        if sc.get_row == "get_many" and cls.GET_BATCH is None:
            res.skip(f"{cls.NAME}: get_many n/a (no batch get)")
            return
        how = (cls.GET_BATCH or "") if sc.get_row == "get_many" else "plain loop"
        res.add(workload=sc.get_row, system=cls.NAME, size=size, producers=1, loop="-",
                g=g, how=how, count=taken, secs=get_s, error=err, cpu=get_c)


# --------------------------------------------------------------------------- report


def _row_dict(a: Acc) -> dict[str, Any]:
    rates = a.rates or [0.0]
    return {
        "workload": a.workload,
        "system": a.system,
        "size": a.size,
        "producers": a.producers,
        "loop": a.loop,
        "rate_median": round(statistics.median(rates), 1),
        "rate_min": round(min(rates), 1),
        "rate_max": round(max(rates), 1),
        "cpu_per_s": round(statistics.median(a.cpus), 2) if a.cpus else None,
        "cpu_us_per_msg": (round(statistics.median(a.cpus) / statistics.median(rates) * 1e6, 2)
                           if a.cpus and statistics.median(rates) > 0 else None),
        "guarantee": a.guarantee,
        "level": a.level,
        "guarantee_detail": a.detail,
        "how": a.how,
        "reps": len(a.rates),
        "messages": int(statistics.median(a.counts)) if a.counts else 0,
        "verified": not a.errors and a.verified > 0,
        "errors": a.errors,
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Give each of our rows its ratios to the best peer of at least its guarantee,
    to queuelib and to the raw baseline (measured in the same run)."""
    peer_rows = [r for r in rows if r["system"] not in (OURS, RAW_WRITE, RAW_SYNC, RAW_READ)]
    raw_for = {"put": RAW_WRITE, "put_many": RAW_WRITE, "drain": RAW_READ, "get_many": RAW_READ,
               "durable": RAW_SYNC}
    raw_wl = {"put": "put", "put_many": "put", "drain": "drain", "get_many": "drain",
              "durable": "durable"}
    for r in rows:
        if r["system"] != OURS:
            continue
        same = [p for p in peer_rows
                if (p["workload"], p["size"], p["producers"]) == (r["workload"], r["size"],
                                                                   r["producers"])
                and p["verified"] and p["rate_median"] > 0]
        ok = [p for p in same if LEVEL_RANK[p["level"]] >= LEVEL_RANK[r["level"]]]
        best = max(ok, key=lambda p: p["rate_median"], default=None)
        r["best_peer"] = best["system"] if best else None
        r["ratio_best_peer"] = _ratio(r, best)
        ql = next((p for p in same if p["system"] == peers.QueuelibFifo.NAME), None)
        if ql is None and r["producers"] > 1 and r["workload"] == "put":
            # queuelib is not thread-safe: several producers compare with its single one.
            ql = next((p for p in peer_rows if p["system"] == peers.QueuelibFifo.NAME
                       and (p["workload"], p["size"], p["producers"]) == ("put", r["size"], 1)
                       and p["verified"] and p["rate_median"] > 0), None)
        r["ratio_queuelib"] = _ratio(r, ql)
        raw = next((p for p in rows if p["system"] == raw_for[r["workload"]]
                    and p["workload"] == raw_wl[r["workload"]] and p["size"] == r["size"]
                    and p["verified"]), None)
        r["ratio_raw"] = _ratio(r, raw)


def _ratio(r: dict[str, Any], other: dict[str, Any] | None) -> float | None:
    if other is None or not other["rate_median"]:
        return None
    return round(float(r["rate_median"]) / float(other["rate_median"]), 3)


def fmt_rate(x: float) -> str:
    """A rate as ``812k`` or ``1.23M``."""
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x"


def sort_key(r: dict[str, Any]) -> tuple[Any, ...]:
    """Table order: workload, producers, size, ours first, then by rate."""
    sys_rank = 0 if r["system"] == OURS else (1 if r["system"].startswith("raw") else 2)
    return (WORKLOADS.index(r["workload"]), r["producers"], r["size"], sys_rank, r["loop"],
            -r["rate_median"])


def format_table(rows: list[dict[str, Any]]) -> str:
    """The result table as text."""
    head = ["workload", "prod", "size", "system", "loop", "msgs/s", "min-max", "cpu",
            "us cpu/msg", "n", "check", "guarantee", "/best peer", "/queuelib", "/raw"]
    lines = []
    prev: tuple[Any, ...] | None = None
    body: list[list[str] | None] = []
    for r in sorted(rows, key=sort_key):
        group = (r["workload"], r["producers"], r["size"])
        if prev is not None and group != prev:
            body.append(None)
        prev = group
        ours = r["system"] == OURS
        body.append([
            r["workload"], str(r["producers"]), str(r["size"]), r["system"], r["loop"],
            fmt_rate(r["rate_median"]),
            f"{fmt_rate(r['rate_min'])}-{fmt_rate(r['rate_max'])}",
            "-" if r.get("cpu_per_s") is None else f"{r['cpu_per_s']:.2f}",
            "-" if r.get("cpu_us_per_msg") is None else f"{r['cpu_us_per_msg']:.2f}",
            str(r["messages"]),
            "ok" if r["verified"] else "FAIL",
            r["guarantee"],
            _fmt_ratio(r.get("ratio_best_peer")) if ours else "",
            _fmt_ratio(r.get("ratio_queuelib")) if ours else "",
            _fmt_ratio(r.get("ratio_raw")) if ours else "",
        ])
    widths = [max(len(head[i]), *(len(b[i]) for b in body if b is not None)) if body
              else len(head[i]) for i in range(len(head))]
    right = {1, 2, 5, 6, 7, 8, 9, 12, 13, 14}

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    lines.append(fmt(head))
    lines.append("  ".join("-" * w for w in widths))
    for b in body:
        lines.append("" if b is None else fmt(b))
    return "\n".join(lines)


# --------------------------------------------------------------------------- meta and main


def fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/mounts), or ``?``."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def choose_tmp_base(requested: str | None) -> str:
    """A directory for the per-repetition queues on the repository's filesystem, not tmpfs."""
    if requested:
        os.makedirs(requested, exist_ok=True)
        return requested
    repo_dev = os.stat(REPO).st_dev
    tmp = tempfile.gettempdir()
    if os.stat(tmp).st_dev == repo_dev and fs_type(tmp) not in ("tmpfs", "ramfs"):
        return tmp
    fallback = BENCH_DIR / "results" / "tmp"
    fallback.mkdir(parents=True, exist_ok=True)
    return str(fallback)


def _git_rev() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             check=False, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _native_writer_loaded() -> bool:
    """Whether the queue's native write lane (a compiled module) was imported."""
    return any(name.startswith("aiodiskqueue.") and name.endswith("._writer")
               and str(getattr(mod, "__file__", "")).endswith(".so")
               for name, mod in list(sys.modules.items()))


def meta_block(cfg: Config, started: float, res: Results,
               rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Machine, Python, versions, time and the run's settings."""
    versions = {"aiodiskqueue": f"{aiodiskqueue.__version__} (git {_git_rev()})"}
    try:
        versions["uvloop"] = importlib.metadata.version("uvloop")
    except importlib.metadata.PackageNotFoundError:
        versions["uvloop"] = "missing"
    for cls in peers.PEERS:
        versions[cls.DIST] = cls.version()
    import sqlite3

    versions["sqlite"] = sqlite3.sqlite_version
    return {
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "tmp_dir": cfg.tmp_base,
            "tmp_fs": fs_type(cfg.tmp_base),
            "tmp_same_device_as_repo": os.stat(cfg.tmp_base).st_dev == os.stat(REPO).st_dev,
        },
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "versions": versions,
        "package": os.path.dirname(os.path.abspath(aiodiskqueue.__file__)),
        "native_writer": _native_writer_loaded(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - started, 1),
        "config": {
            "quick": cfg.quick, "sizes": cfg.sizes, "loops": cfg.loops, "reps": cfg.reps,
            "messages": cfg.n, "bytes_cap": cfg.bytes_cap, "durable_messages": cfg.durable_n,
            "ours_box_s": cfg.ours_box, "durable_box_s": cfg.durable_box,
            "peer_box_s": cfg.peer_box,
            "only": sorted(cfg.only),
            "producers": sorted(cfg.producers) if cfg.producers else "all",
        },
        "skipped": res.skipped,
        "all_verified": all(r["verified"] for r in rows),
    }


def parse_size(text: str) -> int:
    """``1024``, ``1k`` or ``1KiB`` -> bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = 1
    if t.endswith("k"):
        t, mult = t[:-1], 1024
    elif t.endswith("m"):
        t, mult = t[:-1], 1 << 20
    return int(t) * mult


def parse_args(argv: Sequence[str] | None) -> Config:
    """Command line -> Config."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--inline-writes", action="store_true",
                    help="open our queues with inline_writes=True (the loop appends small batches)")
    ap.add_argument("--quick", action="store_true",
                    help="small counts and short time boxes: a few seconds per row set")
    ap.add_argument("--loop", choices=["asyncio", "uvloop", "both"], default="both")
    ap.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                    help="comma-separated message sizes (default 16,256,1024,4096)")
    ap.add_argument("--reps", type=int, default=None,
                    help="repetitions per row (default 3, quick 2)")
    ap.add_argument("--only", action="append", default=None, choices=WORKLOADS,
                    metavar="WORKLOAD",
                    help=f"run only these workloads (repeatable): {', '.join(WORKLOADS)}")
    ap.add_argument("--producers", default=None,
                    help="comma-separated producer counts to run (1, 16, 64; default all)")
    ap.add_argument("--systems", default=None,
                    help="comma-separated: ours, raw, " + ", ".join(c.KEY for c in peers.PEERS))
    ap.add_argument("--messages", type=int, default=None,
                    help="messages per fast repetition (default 100000, quick 10000)")
    ap.add_argument("--tmpdir", default=None, help="where the per-repetition directories go")
    ap.add_argument("--out", default=str(BENCH_DIR / "results" / "latest.json"))
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="cProfile our timed phases of the --only workloads into FILE and "
                         "print the top costs per message (rates are then slower)")
    a = ap.parse_args(argv)
    if a.inline_writes:
        OUR_OPTIONS["inline_writes"] = True
    quick = bool(a.quick)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < _HDR.size:
        ap.error(f"sizes must be >= {_HDR.size} bytes")
    loops = ["asyncio", "uvloop"] if a.loop == "both" else [a.loop]
    if "uvloop" in loops:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            ap.error("uvloop is not installed: pip install uvloop, or use --loop asyncio")
    systems = None
    if a.systems:
        systems = {s.strip() for s in a.systems.split(",") if s.strip()}
        known = {"ours", "raw", *(c.KEY for c in peers.PEERS)}
        if systems - known:
            ap.error(f"unknown systems {sorted(systems - known)}; known: {sorted(known)}")
    reps = a.reps if a.reps is not None else (2 if quick else 3)
    if reps < 1:
        ap.error("--reps must be >= 1")
    return Config(
        sizes=sizes, loops=loops, reps=reps,
        n=a.messages or (10_000 if quick else 100_000),
        bytes_cap=(8 if quick else 128) << 20,
        durable_n=2_000 if quick else 50_000,
        ours_box=0.3 if quick else 1.5,
        durable_box=0.2 if quick else 0.8,
        peer_box=0.1 if quick else 0.3,
        only=set(a.only) if a.only else set(WORKLOADS),
        producers={int(p) for p in a.producers.split(",")} if a.producers else None,
        systems=systems,
        tmp_base=choose_tmp_base(a.tmpdir),
        out=Path(a.out),
        quick=quick,
        profile=Path(a.profile) if a.profile else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, write the JSON; exit 1 if a check failed."""
    global PROFILE
    cfg = parse_args(argv)
    started = time.perf_counter()
    if cfg.profile is not None:
        PROFILE = PhaseProfile(cfg.only, cfg.profile)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    missing = [c.NAME for c in peers.PEERS if cfg.wants(c.KEY) and not c.available()]
    res = Results()
    for name in missing:
        res.skip(f"{name}: not installed")
    log(f"queues in {cfg.tmp_base} ({fs_type(cfg.tmp_base)}); loops {', '.join(cfg.loops)}; "
        f"{cfg.reps} reps")
    for size in cfg.sizes:
        run_size(cfg, size, res, log)
    rows = [_row_dict(a) for a in res.rows.values()]
    add_ratios(rows)
    rows.sort(key=sort_key)
    meta = meta_block(cfg, started, res, rows)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = cfg.out.with_name(cfg.out.name + ".tmp")
    tmp_out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    os.replace(tmp_out, cfg.out)

    print(format_table(rows))
    print()
    n_ok = sum(r["verified"] for r in rows)
    print(f"check: every message came back once and in order (per producer) in {n_ok} of "
          f"{len(rows)} rows" + ("" if n_ok == len(rows) else " -- FAILURES:"))
    for r in rows:
        if not r["verified"]:
            print(f"  {r['workload']} x{r['producers']} {r['size']} B {r['system']} "
                  f"{r['loop']}: {'; '.join(r['errors']) or 'no repetition ran'}")
    print("ratios: ours / best peer with at least the same crash guarantee, ours / queuelib, "
          "ours / raw baseline (same workload and size, same run; medians)")
    print("peers with several producers: OS threads sharing one queue object; ours: asyncio tasks")
    print("cpu: the process's CPU seconds (all threads) per wall second of the timed phase; "
          "us cpu/msg: CPU microseconds per message")
    print("/queuelib for several producers: against queuelib's single producer (not thread-safe)")
    for note in res.skipped:
        print(f"n/a: {note}")
    if PROFILE is not None:
        print("rates above were measured under cProfile")
        print(PROFILE.report())
    print(f"machine: {meta['machine']['cpus']} cpus, Python {meta['python']}, "
          f"{meta['timestamp']}, {meta['duration_s']} s; JSON: {cfg.out}")
    return 0 if meta["all_verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
