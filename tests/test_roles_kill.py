"""A producer process and a consumer process on one queue, killed (SIGKILL) at random
moments, one, the other or both at once, for many cycles: no acknowledged put is lost,
order is kept, and messages come twice only where at-least-once allows."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path

import pytest
from helpers_child import msg_index
from helpers_format import bad_files, read_queue
from helpers_proc import Child

from aiodiskqueue import DiskQueue

ROUND = 10**7  # each producer process starts its indices here times its number
MAX_BYTES = 64 * 1024  # small segments: rolls and deletions happen all the time


class Reader:
    """A child process and the lines it printed, read as they come."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.lines: list[str] = []
        self.ready = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while (line := await self.child.line(120)) is not None:
            if line.startswith("READY"):
                self.ready.set()
            else:
                self.lines.append(line)

    async def stop(self) -> None:
        self.child.kill()
        await self.child.wait()
        await self.task
        assert self.child.stderr() == ""


async def _producer(tmp_path: Path, n: int, sync_every: int) -> Reader:
    r = Reader(await Child.spawn(tmp_path / f"p{n}.err", "rproduce", str(tmp_path), "q",
                                 str(n * ROUND), str(sync_every), str(MAX_BYTES)))
    await asyncio.wait_for(r.ready.wait(), 60)
    return r


async def _consumer(tmp_path: Path, n: int, sync_every: int) -> Reader:
    r = Reader(await Child.spawn(tmp_path / f"c{n}.err", "rconsume", str(tmp_path), "q",
                                 str(sync_every), str(MAX_BYTES)))
    await asyncio.wait_for(r.ready.wait(), 60)
    return r


async def _run(tmp_path: Path, cycles: int, sync_every: int, seed: int) -> dict[str, int]:
    rnd = random.Random(seed)
    producers: list[Reader] = []
    consumers: list[Reader] = []
    counts = {"producer": 0, "consumer": 0, "both": 0}
    # The queue exists before a consumer opens it.
    async with DiskQueue(tmp_path, "q", "producer", max_bytes_per_file=MAX_BYTES):
        pass
    producers.append(await _producer(tmp_path, 1, sync_every))
    consumers.append(await _consumer(tmp_path, 0, 100))
    for _ in range(cycles):
        await asyncio.sleep(rnd.uniform(0.05, 0.4))
        victim = rnd.choice(("producer", "consumer", "both"))
        counts[victim] += 1
        if victim == "both":
            producers[-1].child.kill()
            consumers[-1].child.kill()
        if victim in ("producer", "both"):
            await producers[-1].stop()
        if victim in ("consumer", "both"):
            await consumers[-1].stop()
        if victim in ("producer", "both"):
            producers.append(await _producer(tmp_path, len(producers) + 1, sync_every))
        if victim in ("consumer", "both"):
            consumers.append(await _consumer(tmp_path, len(consumers), 100))
    await asyncio.sleep(0.2)
    await producers[-1].stop()
    await asyncio.sleep(0.3)  # the consumer catches up with the last acknowledged puts
    await consumers[-1].stop()

    acked = [int(x) for p in producers for x in p.lines]
    runs = [[int(x.split()[1]) for x in c.lines] for c in consumers]
    async with DiskQueue(tmp_path, "q", "consumer", max_bytes_per_file=MAX_BYTES) as q:
        rest = [msg_index(await q.get()) for _ in range(q.qsize())]
        assert q.statistics().bad_files == 0
    runs.append(rest)
    assert bad_files(tmp_path) == []
    assert read_queue(tmp_path, "q") == []  # what go-diskqueue sees: all taken
    delivered = [i for run in runs for i in run]
    # No acknowledged put lost.
    missing = set(acked) - set(delivered)
    assert not missing, sorted(missing)[:10]
    # Order: each consumer process gets messages in order, and every one starts at or
    # before the message after the last one its predecessor got (nothing skipped).
    first_seen: list[int] = []
    seen: set[int] = set()
    for run in runs:
        assert run == sorted(run) and len(set(run)) == len(run)
        for i in run:
            if i not in seen:
                seen.add(i)
                first_seen.append(i)
    assert first_seen == sorted(first_seen)
    # Duplicates: only messages taken after the last stored position of a killed
    # consumer come again (its sync_every=100 gets plus its read-ahead at most).
    dups = len(delivered) - len(set(delivered))
    assert dups <= sum(len(r) for r in runs[:-1])
    for prev, run in itertools.pairwise(runs):
        if prev and run:
            again = [i for i in run if i <= prev[-1]]
            assert set(again) <= set(prev)
    counts.update(acked=len(acked), delivered=len(delivered), duplicates=dups,
                  producers=len(producers), consumers=len(consumers))
    return counts


@pytest.mark.parametrize("sync_every", [2500, 1], ids=["default-sync", "sync_every=1"])
async def test_killing_producer_consumer_or_both_loses_nothing(tmp_path: Path,
                                                               sync_every: int) -> None:
    counts = await _run(tmp_path, 8, sync_every, seed=sync_every)
    assert counts["acked"] > 0 and counts["delivered"] >= counts["acked"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_many_cycles_of_kills(tmp_path: Path, seed: int) -> None:
    counts = await _run(tmp_path, 40, 2500 if seed != 2 else 1, seed=seed)
    print(counts)
    assert counts["acked"] > 0
