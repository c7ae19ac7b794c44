"""Queue groups under SIGKILL: producer and consumer processes of one group killed at
random; no acknowledged put lost, FIFO per shard, duplicates only from a killed
consumer's unstored reads, every shard drained in the end."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest
from helpers_format import read_meta
from helpers_proc import Child

from aiodiskqueue import QueueGroup
from aiodiskqueue.group.layout import group_layout

SCRIPT = Path(__file__).with_name("group_child.py")
CYCLES_ENV = "AIODISKQUEUE_GROUP_KILL_CYCLES"
SPAN = 10**7  # index range of one producer process


async def _spawn(err: Path, *args: str) -> Child:
    with err.open("ab") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SCRIPT), *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=f)
    return Child(proc, err)


class Run:
    """The processes of one kill run and what each reported."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = str(tmp_path / "q")
        self.err = tmp_path / "stderr.txt"
        self.spawned = 0
        self.acked: set[tuple[str, int]] = set()
        # Per consumer process (by spawn number): what it got, in order; and which were killed.
        self.got: dict[int, list[tuple[str, int]]] = {}
        self.finished: dict[tuple[str, int], set[int]] = {}  # AckQueueGroup: by whom
        self.killed: set[int] = set()
        self.readers: list[asyncio.Task[None]] = []
        self.kills = {"producer": 0, "consumer": 0}

    async def _read(self, child: Child, key: int) -> None:
        while (line := await child.line(120.0)) is not None:
            kind, _, rest = line.partition(" ")
            if kind in ("P", "G", "F"):
                shard, _, i = rest.partition(":")
                if kind == "P":
                    self.acked.add((shard, int(i)))
                elif kind == "G":
                    self.got[key].append((shard, int(i)))
                else:
                    self.finished.setdefault((shard, int(i)), set()).add(key)

    async def start(self, mode: str, *extra: str) -> tuple[int, Child]:
        self.spawned += 1
        key = self.spawned
        args = [mode, self.dir, "ev"]
        if mode == "produce":
            args.append(str(key * SPAN))
        args += extra
        child = await _spawn(self.err, *args)
        first = await child.line(60.0)
        assert first is not None and first.startswith("READY"), (first, child.stderr())
        self.got[key] = []
        self.readers.append(asyncio.ensure_future(self._read(child, key)))
        return key, child


async def _run(tmp_path: Path, cycles: int, seed: int, ack: bool = False) -> Run:
    rnd = random.Random(seed)
    run = Run(tmp_path)
    consume = ["20", "ack"] if ack else ["20"]
    procs: dict[str, list[tuple[int, Child]]] = {
        "producer": [await run.start("produce") for _ in range(3)],
        "consumer": [await run.start("consume", *consume) for _ in range(2)],
    }
    for _ in range(cycles):
        await asyncio.sleep(rnd.uniform(0.2, 0.8))
        kind = rnd.choice(["producer", "consumer"])
        at = rnd.randrange(len(procs[kind]))
        key, child = procs[kind][at]
        child.kill()
        await child.wait()
        run.killed.add(key)
        run.kills[kind] += 1
        procs[kind][at] = await run.start("produce" if kind == "producer" else "consume",
                                          *([] if kind == "producer" else consume))
    await asyncio.sleep(0.3)
    for lst in procs.values():
        for key, child in lst:
            child.kill()
            await child.wait()
            run.killed.add(key)
    key, drainer = await run.start("drain", *(["ack"] if ack else []))
    assert await drainer.wait(120.0) == 0, drainer.stderr()
    await asyncio.gather(*run.readers)
    return run


def _check(run: Run, ack: bool = False) -> tuple[int, int]:
    received: dict[tuple[str, int], int] = {}
    for key, got in run.got.items():
        per_shard: dict[str, int] = {}
        for shard, i in got:
            # FIFO per shard within one consumer process.
            assert i > per_shard.get(shard, -1), (key, shard, i, per_shard.get(shard))
            per_shard[shard] = i
            if (shard, i) in received:
                # A duplicate: only what a killed consumer took and had not stored.
                assert received[(shard, i)] in run.killed, (shard, i)
            else:
                received[(shard, i)] = key
    lost = run.acked - received.keys()
    assert not lost, sorted(lost)[:10]
    if ack:
        # Every message finished, but for one a consumer was killed in the middle of
        # finishing (its finish() may have landed: not delivered again then). A consumer
        # finishes one message at a time: that is the last one it got.
        in_the_middle = {g[-1] for k, g in run.got.items() if g and k in run.killed}
        unfinished = run.acked - run.finished.keys() - in_the_middle
        assert not unfinished, sorted(unfinished)[:10]
        for key, got in run.got.items():
            for m in got:
                by = run.finished.get(m, set())
                # A durably finished message is not delivered again: a delivery by another
                # process is one that died (or handed it over) before finishing it.
                assert key in by or key in run.killed, (m, key, by)
    dups = sum(len(g) for g in run.got.values()) - len(received)
    lay = group_layout(run.dir, "ev")
    for num in lay.shards():
        meta = read_meta(Path(lay.shard_path(num)), "ev")
        assert meta.depth == 0, (num, meta)
        assert (meta.read_file, meta.read_pos) == (meta.write_file, meta.write_pos), meta
    return len(run.acked), dups


@pytest.mark.parametrize("ack", [False, True], ids=["QueueGroup", "AckQueueGroup"])
async def test_group_kill_producers_and_consumers(tmp_path: Path, ack: bool) -> None:
    run = await _run(tmp_path, cycles=4, seed=38, ack=ack)
    _check(run, ack)


@pytest.mark.slow
@pytest.mark.parametrize("ack", [False, True], ids=["QueueGroup", "AckQueueGroup"])
async def test_group_kill_many_cycles(tmp_path: Path, ack: bool) -> None:
    cycles = int(os.environ.get(CYCLES_ENV, "12"))
    run = await _run(tmp_path, cycles=cycles, seed=random.randrange(1 << 30), ack=ack)
    acked, dups = _check(run, ack)
    print(f"group kill ({'ack' if ack else 'plain'}): {cycles} cycles, kills {run.kills}, "
          f"{acked} acknowledged puts, {dups} duplicates, "
          f"{len(group_layout(run.dir, 'ev').shards())} shards")


async def test_a_consumer_process_shares_and_its_shards_are_taken_over_when_killed(
        tmp_path: Path) -> None:
    d = tmp_path / "q"
    producers = [await QueueGroup.open(d, "ev") for _ in range(4)]
    for p in producers:
        await p.aclose()
    child = await _spawn(tmp_path / "stderr.txt", "consume", str(d), "ev", "20")
    assert await child.line(60.0) == "READY", child.stderr()
    loop = asyncio.get_running_loop()
    try:
        async with QueueGroup(d, "ev", "consumer") as c:
            # A newcomer gets its share from a consumer in another process, which goes on.
            end = loop.time() + 30.0
            while len(c.shards) != 2:
                assert loop.time() < end, c.shards
                await asyncio.sleep(0.02)
            killed_at = loop.time()
            child.kill()
            await child.wait()
            while len(c.shards) != 4:  # the kernel dropped the dead one's locks
                assert loop.time() < killed_at + 30.0, c.shards
                await asyncio.sleep(0.02)
            took = loop.time() - killed_at
    finally:
        child.kill()
    print(f"take-over after {took:.2f} s")
    assert took < 10.0  # "within a few seconds"; about one look at the group (1 s) here
