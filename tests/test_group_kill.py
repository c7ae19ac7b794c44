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
        self.killed: set[int] = set()
        self.readers: list[asyncio.Task[None]] = []
        self.kills = {"producer": 0, "consumer": 0}

    async def _read(self, child: Child, key: int) -> None:
        while (line := await child.line(120.0)) is not None:
            kind, _, rest = line.partition(" ")
            if kind in ("P", "G"):
                shard, _, i = rest.partition(":")
                if kind == "P":
                    self.acked.add((shard, int(i)))
                else:
                    self.got[key].append((shard, int(i)))

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


async def _run(tmp_path: Path, cycles: int, seed: int) -> Run:
    rnd = random.Random(seed)
    run = Run(tmp_path)
    procs: dict[str, list[tuple[int, Child]]] = {
        "producer": [await run.start("produce") for _ in range(3)],
        "consumer": [await run.start("consume", "20") for _ in range(2)],
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
                                          *([] if kind == "producer" else ["20"]))
    await asyncio.sleep(0.3)
    for lst in procs.values():
        for key, child in lst:
            child.kill()
            await child.wait()
            run.killed.add(key)
    key, drainer = await run.start("drain")
    assert await drainer.wait(120.0) == 0, drainer.stderr()
    await asyncio.gather(*run.readers)
    return run


def _check(run: Run, tmp_path: Path) -> tuple[int, int]:
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
    dups = sum(len(g) for g in run.got.values()) - len(received)
    lay = group_layout(run.dir, "ev")
    for num in lay.shards():
        meta = read_meta(Path(lay.shard_path(num)), "ev")
        assert meta.depth == 0, (num, meta)
        assert (meta.read_file, meta.read_pos) == (meta.write_file, meta.write_pos), meta
    return len(run.acked), dups


async def test_group_kill_producers_and_consumers(tmp_path: Path) -> None:
    run = await _run(tmp_path, cycles=4, seed=38)
    _check(run, tmp_path)


@pytest.mark.slow
async def test_group_kill_many_cycles(tmp_path: Path) -> None:
    cycles = int(os.environ.get(CYCLES_ENV, "20"))
    run = await _run(tmp_path, cycles=cycles, seed=random.randrange(1 << 30))
    acked, dups = _check(run, tmp_path)
    print(f"group kill: {cycles} cycles, kills {run.kills}, {acked} acknowledged puts, "
          f"{dups} duplicates, {len(group_layout(run.dir, 'ev').shards())} shards")
