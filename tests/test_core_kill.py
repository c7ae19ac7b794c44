"""Durability across SIGKILL of a real process: producers and consumers killed at
random points, many times; nothing acknowledged is lost, nothing synced is redelivered."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from helpers_child import child_msg, msg_index
from helpers_format import bad_files
from helpers_proc import Child

from aiodiskqueue import DiskQueue

ROUND = 10**7  # producer round r puts indices r*ROUND + w*STRIDE + k (worker w, k = 0, 1, ...)
STRIDE = 10**5
assert STRIDE * 32 <= ROUND  # room for up to 32 workers per round
Acked = dict[int, list[int]]  # stream start -> indices printed (acknowledged) for it


async def _producer_round(tmp_path: Path, r: int, sync_every: int, max_bytes: int,
                          rng: random.Random, most: int, workers: int = 1,
                          recovered: list[int] | None = None) -> Acked:
    """One child producer killed after a random number of acknowledged puts.

    Appends to ``recovered`` how many records the child found past a stale meta.
    """
    child = await Child.spawn(tmp_path / "stderr.txt", "produce", str(tmp_path / "q"), "q",
                              str(r * ROUND), str(sync_every), str(max_bytes), str(workers))
    target = rng.choice([0, 1, rng.randrange(2, most), rng.randrange(2, most)])
    printed: list[int] = []
    try:
        ready = await child.line()
        assert ready is not None and ready.startswith("READY "), child.stderr()
        if recovered is not None:
            recovered.append(int(ready.split()[1]))
        while len(printed) < target:
            line = await child.line()
            assert line is not None, child.stderr()
            printed.append(int(line))
        child.kill()
        printed += [int(x) for x in await child.rest()]  # already in the pipe when killed
    finally:
        child.kill()
        rc = await child.wait()
    assert rc == -signal.SIGKILL, child.stderr()
    acked: Acked = {r * ROUND + w * STRIDE: [] for w in range(workers)}
    for i in printed:
        acked[i - i % STRIDE].append(i)
    for first, run in acked.items():
        assert run == list(range(first, first + len(run)))
    return acked


async def _kill_after_gets(child: Child, gets: int) -> list[str]:
    """The lines a consumer child prints (``G i`` per message taken, and the rest) when
    it is SIGKILLed after its ``gets``-th ``G`` line (at once with 0)."""
    events: list[str] = []
    try:
        assert await child.line() == "READY", child.stderr()
        seen = 0
        while seen < gets:
            line = await child.line()
            assert line is not None, child.stderr()
            events.append(line)
            seen += line.startswith("G ")
        child.kill()
        events += await child.rest()
    finally:
        child.kill()
        await child.wait()
    return events


async def _check_all_acknowledged(directory: Path, rounds: list[Acked]) -> None:
    async with DiskQueue(directory, "q") as q:
        got = [msg_index(await q.get()) for _ in range(q.qsize())]
        assert q.statistics().bad_files == 0
    assert bad_files(directory) == []
    # Rounds come back in order (each child died before the next started).
    assert [i // ROUND for i in got] == sorted(i // ROUND for i in got)
    streams: dict[int, list[int]] = {}
    for i in got:
        streams.setdefault(i - i % STRIDE, []).append(i)
    # Each stream: a gap-free run from its start, in order, holding at least every
    # acknowledged put (puts that landed unacknowledged may follow).
    for acked in rounds:
        for first, printed in acked.items():
            run = streams.pop(first, [])
            assert run == list(range(first, first + len(run)))
            assert len(run) >= len(printed), (first, len(run), len(printed))
    assert streams == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sync_every", "rounds", "most", "workers"),
    [(2500, 20, 4000, 1), (1, 10, 300, 1), (2500, 8, 4000, 8), (1, 8, 600, 16)],
    ids=["default-sync", "sync_every=1", "default-sync-8-producers",
         "sync_every=1-16-producers"],
)
async def test_producer_killed_loses_no_acknowledged_put(tmp_path: Path, sync_every: int,
                                                         rounds: int, most: int,
                                                         workers: int) -> None:
    rng = random.Random(sync_every * workers)
    recovered: list[int] = []
    acked = [await _producer_round(tmp_path, r, sync_every, 4096, rng, most, workers,
                                   recovered)
             for r in range(rounds)]
    assert sum(len(v) for a in acked for v in a.values()) > 0
    if sync_every > 1:
        # The meta was stale at most kills: records past it were recovered, not orphaned.
        assert sum(recovered) > 0, recovered
    await _check_all_acknowledged(tmp_path / "q", acked)


@pytest.mark.slow
async def test_producer_killed_during_open(tmp_path: Path) -> None:
    # Kill before the child is ready, at a random moment of import, recovery or the first put.
    rng = random.Random(7)
    acked = [await _producer_round(tmp_path, 0, 2500, 1000, rng, 3000)]
    assert acked[0][0] == list(range(len(acked[0][0])))
    for r in range(1, 7):
        child = await Child.spawn(tmp_path / "stderr.txt", "produce", str(tmp_path / "q"), "q",
                                  str(r * ROUND), "2500", "1000", "1")
        lines: list[str] = []
        if rng.random() < 0.5:
            line = await child.line()  # READY: kill during the first puts
            if line is not None:
                lines.append(line)
        child.kill()
        lines += await child.rest()
        await child.wait()
        acked.append({r * ROUND: [int(x) for x in lines if not x.startswith("READY")]})
    await _check_all_acknowledged(tmp_path / "q", acked)


@pytest.mark.slow
async def test_consumer_killed_at_least_once(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    total = 3000
    async with DiskQueue(directory, "q", max_bytes_per_file=8192) as q:
        await q.put_many([child_msg(i) for i in range(total)])
    rng = random.Random(11)
    last_synced = -1  # highest index whose get() returned before a completed sync()
    last_got = -1  # highest index whose get() returned
    for _ in range(12):
        if last_got == total - 1:
            break
        every = rng.choice([1, 7, 50])
        child = await Child.spawn(tmp_path / "stderr.txt", "consume", str(directory), "q",
                                  str(every))
        target = rng.choice([0, 1, rng.randrange(2, 400)])
        events = await _kill_after_gets(child, min(target, total - 1 - last_got))
        got = [int(e[2:]) for e in events if e.startswith("G ")]
        if got:
            # Not redelivered if synced; nothing skipped: the first is in (synced, got + 1].
            assert last_synced < got[0] <= last_got + 1, (last_synced, last_got, got[0])
            assert got == list(range(got[0], got[0] + len(got)))
            last_got = got[-1]
        synced = [int(e[2:]) for e in events if e.startswith("S ")]
        if synced:
            last_synced = synced[-1]
    async with DiskQueue(directory, "q") as q:
        rest = [msg_index(await q.get()) for _ in range(q.qsize())]
    if rest:
        assert last_synced < rest[0] <= last_got + 1
        assert rest == list(range(rest[0], total))
    else:
        assert last_got == total - 1
    assert last_got >= 0  # some rounds really consumed


@pytest.mark.slow
async def test_consumer_killed_while_its_rounds_store_the_meta_natively(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer's count rounds store the meta on the native meta thread, and consumed
    # segments are removed on the remover's thread: killed at random points, nothing is
    # skipped, and what comes again after a restart is at most the messages since a
    # stored meta (sync_every plus the small read-ahead).
    pytest.importorskip("aiodiskqueue._core._writer", reason="the native module is not built")
    monkeypatch.setenv("AIODISKQUEUE_PURE_PYTHON", "0")  # the child too, whatever the suite runs
    directory = tmp_path / "q"
    total, sync_every = 3000, 20
    async with DiskQueue(directory, "q", max_bytes_per_file=8192) as q:
        await q.put_many([child_msg(i) for i in range(total)])
    rng = random.Random(13)
    last_got = -1
    native = False
    for _ in range(14):
        if last_got == total - 1:
            break
        child = await Child.spawn(tmp_path / "stderr.txt", "drain", str(directory), "q",
                                  str(sync_every))
        target = rng.choice([1, rng.randrange(2, 600)])
        events = await _kill_after_gets(child, min(target, total - 1 - last_got))
        native = native or "M" in events
        got = [int(e[2:]) for e in events if e.startswith("G ")]
        if got:
            # Nothing skipped; redelivered at most what the rounds may leave unstored
            # (sync_every, a 4 KiB read-ahead of about 40 messages, a round in flight).
            assert last_got - 3 * sync_every - 80 < got[0] <= last_got + 1, (last_got, got[0])
            assert got == list(range(got[0], got[0] + len(got)))
            last_got = max(last_got, got[-1])
    assert native, "no round stored the meta on the native meta thread"
    async with DiskQueue(directory, "q", max_bytes_per_file=8192) as q:
        rest = [msg_index(await q.get()) for _ in range(q.qsize())]
    if rest:
        assert last_got - 3 * sync_every - 80 < rest[0] <= last_got + 1
        assert rest == list(range(rest[0], total))
    else:
        assert last_got == total - 1
