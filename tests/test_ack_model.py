"""Random operations against an AckQueue, with the files copied at random moments.

A copy taken on the event loop's thread between two steps is a state a SIGKILL
can leave (every write issued so far is in the files, a hop in flight may be
cut anywhere). Each copy is opened afterwards and drained: every message whose
put() returned before the copy and that was not finished before it must come
back, deferred ones not before their due time. Small log segments and data files
make compaction and file rolls happen all the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from pathlib import Path

import pytest

from aiodiskqueue import AckQueue, Message, QueueEmpty
from aiodiskqueue.ack.clock import ManualClock

SEEDS = int(os.environ.get("ACK_MODEL_SEEDS", "6"))


def snapshot(src: Path, dest: Path) -> None:
    """Copy the files of a running queue, as a crash would leave them."""
    dest.mkdir()
    for f in sorted(src.iterdir()):
        try:
            if f.is_file():
                (dest / f.name).write_bytes(f.read_bytes())
        except FileNotFoundError:
            pass  # deleted by the queue's I/O thread after the listing: gone, as after a crash


async def drain_copy(directory: Path, wall_ns: int) -> tuple[dict[int, int], list[str]]:
    """Open a copy and deliver everything; return {index: first delivery wall ns}, errors."""
    clock = ManualClock(start=0.0, wall_ns=wall_ns)
    first: dict[int, int] = {}
    async with AckQueue(directory, "jobs", clock=clock, msg_timeout=1e6, max_msg_timeout=1e6,
                        log_segment_bytes=4096, max_bytes_per_file=512) as q:
        for _ in range(400):
            while q.qsize():
                m = await asyncio.wait_for(q.get(), 10)
                first.setdefault(int(m.body.split(b".")[0]), clock.time_ns())
                await m.finish()
            st = q.statistics()
            if not st.deferred and not st.depth and not st.in_flight:
                break
            clock.advance(1.0)
        else:
            return first, ["the copy never drained"]
    return first, []


@pytest.mark.parametrize("seed", range(SEEDS), ids=[f"seed-{s}" for s in range(SEEDS)])
async def test_random_operations_and_crash_copies(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    live = tmp_path / "live"
    live.mkdir()
    q = await AckQueue.open(live, "jobs", clock=clock, msg_timeout=30.0, max_delay=100.0,
                            max_in_flight=50, log_segment_bytes=4096, max_bytes_per_file=512,
                            sync_every=rng.choice([1, 7, 2500]))
    acked: set[int] = set()
    deferred_due: dict[int, int] = {}  # put with a delay: not before this wall ns
    finished: set[int] = set()
    in_flight: list[Message] = []
    copies: list[tuple[Path, set[int], dict[int, int], int]] = []
    n = 0
    try:
        for _step in range(600):
            op = rng.random()
            if op < 0.3:
                delay = rng.choice([0.0, 0.0, rng.uniform(0.5, 60.0)])
                if delay:
                    deferred_due[n] = clock.time_ns() + int(delay * 1e9)
                await q.put(b"%d" % n + b"." * rng.randrange(0, 300), delay=delay)
                acked.add(n)
                n += 1
            elif op < 0.55 and len(in_flight) < 50:
                with contextlib.suppress(QueueEmpty):  # nothing read back from disk yet
                    if rng.random() < 0.5:
                        in_flight.append(q.get_nowait())
                    else:
                        in_flight += q.get_many_nowait(rng.randrange(1, 51 - len(in_flight)))
            elif op < 0.75 and in_flight:
                m = in_flight.pop(rng.randrange(len(in_flight)))
                if m.in_flight:
                    await m.finish()
                    finished.add(int(m.body.split(b".")[0]))
            elif op < 0.85 and in_flight:
                m = in_flight.pop(rng.randrange(len(in_flight)))
                if m.in_flight:
                    await m.requeue(rng.choice([0.0, rng.uniform(0.1, 20.0)]))
            elif op < 0.93:
                clock.advance(rng.uniform(0.0, 5.0))
            elif op < 0.955:
                await q.sync()
            elif op < 0.96:
                await q.purge()  # only what is in flight must come back now
                acked = {int(m.body.split(b".")[0]) for m in in_flight if m.in_flight}
            else:
                for _ in range(rng.randrange(1, 20)):
                    await asyncio.sleep(0)  # let the pump and the I/O threads move
            if rng.random() < 0.03:
                dest = tmp_path / f"copy{len(copies)}"
                snapshot(live, dest)
                copies.append((dest, acked - finished, dict(deferred_due), clock.time_ns()))
    finally:
        await q.aclose()
    copies.append((live, acked - finished, dict(deferred_due), clock.time_ns()))
    for dest, required, dues, wall in copies:
        got, errors = await drain_copy(dest, wall)
        assert not errors, (dest, errors)
        lost = sorted(i for i in required if i not in got)
        assert not lost, (dest.name, lost[:20])
        early = [i for i, t in got.items() if i in dues and t < dues[i] and i in required]
        assert not early, (dest.name, early[:20])
