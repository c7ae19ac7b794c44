"""AckQueue across SIGKILL of a real process: nothing put is lost, due times are kept.

The child (``ack_child.py``) prints as it goes; the test reads its output while
it runs (so the pipe never blocks it), kills it at a random point, reopens.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from aiodiskqueue import AckQueue, DiskQueue
from aiodiskqueue.ack.clock import ManualClock

CHILD = Path(__file__).with_name("ack_child.py")


async def run_and_kill(tmp_path: Path, after: float, *args: str) -> list[list[str]]:
    """Run the child, SIGKILL it ``after`` seconds past its READY line, return all its lines.

    Its output is read all the while, so a full pipe never stops it; the kill
    lands wherever the child happens to be (a line count would not do: the child
    runs ahead of the reader by a pipe's worth of lines).
    """
    with (tmp_path / "stderr.txt").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), *args, stdout=asyncio.subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    lines: list[list[str]] = []
    killed = False
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert first == b"READY\n", (tmp_path / "stderr.txt").read_text()
        kill_at = loop.time() + after
        while (left := kill_at - loop.time()) > 0:
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), left)
            except TimeoutError:
                break
            assert raw, (tmp_path / "stderr.txt").read_text()
            lines.append(raw.decode().split())
        proc.kill()
        killed = True
        rest = await asyncio.wait_for(proc.stdout.read(), 60)  # already in the pipe
        lines += [ln.split() for ln in rest.decode().splitlines() if ln.strip()]
    finally:
        # Kill once only: a second kill() polls, and a poll that reaps the child
        # before asyncio's watcher does makes wait() report 255.
        if not killed and proc.returncode is None:
            proc.kill()
        rc = await proc.wait()
    assert rc == -signal.SIGKILL, (tmp_path / "stderr.txt").read_text()
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sync_every", "rounds", "n", "files"),
    [(2500, 8, 30_000, ()), (1, 6, 20_000, ()), (2500, 8, 30_000, ("4096", "65536"))],
    ids=["default-sync", "sync_every=1", "small-files"],
)
async def test_consumer_killed_loses_nothing(tmp_path: Path, sync_every: int, rounds: int,
                                             n: int, files: tuple[str, ...]) -> None:
    # "small-files": 4 KiB log segments and 64 KiB data files, so that compaction
    # and file rolls happen while the child is killed.
    log_bytes, data_bytes = (int(files[0]), int(files[1])) if files else (8 << 20, 100 << 20)
    async with DiskQueue(tmp_path, "jobs", max_bytes_per_file=data_bytes) as dq:  # raw format
        await dq.put_many([b"%d" % i for i in range(n)])
    rng = random.Random(sync_every)
    printed: set[int] = set()  # printed just before finish()
    finished_at: dict[int, int] = {}  # finish() returned, in round r
    seen_after: list[tuple[int, int]] = []  # (round, idx) of every delivery
    attempts: dict[int, list[int]] = {}  # idx -> attempts of its deliveries, in order
    for r in range(rounds):
        after = rng.choice([0.0, rng.uniform(0, 0.4)])
        lines = await run_and_kill(tmp_path, after, "consume", str(tmp_path), str(sync_every),
                                   str(r), *files)
        for kind, idx, *rest in lines:
            if kind in ("B", "R"):
                seen_after.append((r, int(idx)))
                attempts.setdefault(int(idx), []).append(int(rest[1]))
            if kind == "B":
                printed.add(int(idx))
            elif kind == "F":
                finished_at.setdefault(int(idx), r)
    assert printed, "the child finished nothing"
    assert len(printed) < n, "the child ran dry: nothing left to kill it in the middle of"
    drained: list[int] = []
    async with AckQueue(tmp_path, "jobs", msg_timeout=60.0, max_bytes_per_file=data_bytes,
                        log_segment_bytes=log_bytes) as q:
        # Requeued with a short delay in the last round: deferred (not counted by
        # qsize()) until due, so drain until nothing is ready or deferred.
        while not q.empty() or q.statistics().deferred:
            m = await asyncio.wait_for(q.get(), 30)
            assert m.attempts >= 1
            drained.append(int(m.body))
            attempts.setdefault(int(m.body), []).append(m.attempts)
            await m.finish()
        assert q.statistics().in_flight == 0
    assert printed | set(drained) == set(range(n)), "a message was lost"
    assert len(drained) == len(set(drained))
    if sync_every == 1:
        # finish() returned means durable: never delivered again, in a later round or now.
        for rnd, i in seen_after:
            assert not (i in finished_at and finished_at[i] < rnd), (i, rnd)
        assert not set(drained) & set(finished_at)
        # A requeue returns once durable, so attempts never go back, not even across
        # a kill. (With the default sync a delivery after the last write may be
        # forgotten: "as of the last sync".) Within one round they only grow.
        back = {i: a for i, a in attempts.items() if a != sorted(a)}
        assert not back, list(back.items())[:5]


@pytest.mark.slow
async def test_deferred_messages_keep_due_time_across_kill(tmp_path: Path) -> None:
    # Each round the child puts bodies 0, 1, 2, ... again (the delay of body i is
    # 100 + i % 50 s, as ack_child.defer() chooses), so a delivered body may come from
    # any round. The bound on its due time is the smallest over the rounds that may
    # have stored it: a printed put is due at its t + delay or later; the one put after
    # the last printed line may have landed without being printed (the kill fell
    # between its write and its print), and it started after the previous put's t
    # (or after the child was started). Bounding only by printed lines is wrong:
    # such a put of body k in round 0 is due before the printed put of k in round 1.
    rng = random.Random(5)
    bounds: dict[int, list[int]] = {}  # body -> earliest allowed delivery (wall ns), per round
    printed: set[int] = set()
    n_printed = 0
    for _ in range(3):
        started = time.time_ns()
        lines = await run_and_kill(tmp_path, rng.uniform(0, 0.3), "defer", str(tmp_path),
                                   "100000")
        assert [int(line[1]) for line in lines] == list(range(len(lines)))
        since = started
        for _, idx, t, delay in lines:
            bounds.setdefault(int(idx), []).append(int(t) + int(float(delay) * 1e9))
            since = int(t)
        nxt = len(lines)
        bounds.setdefault(nxt, []).append(since + int((100.0 + nxt % 50) * 1e9))
        printed.update(range(nxt))
        n_printed += nxt
    assert printed
    clock = ManualClock(start=0.0, wall_ns=min(min(b) for b in bounds.values()) - 10**9)
    got: dict[int, int] = {}
    async with AckQueue(tmp_path, "jobs", clock=clock, msg_timeout=1e6,
                        max_msg_timeout=1e6) as q:
        assert q.statistics().deferred >= n_printed
        while q.statistics().deferred or q.qsize():
            while q.qsize():
                m = await asyncio.wait_for(q.get(), 30)
                body = int(m.body)
                got[body] = got.get(body, 0) + 1
                # Never early, and never a body no round can have put.
                assert body in bounds, body
                assert clock.time_ns() >= min(bounds[body]), (body, bounds[body])
                await m.finish()
            clock.advance(1.0)
    assert printed <= set(got)
