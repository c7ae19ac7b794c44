"""The ack log's records that nothing waits for linger before a hop writes them.

A hop wakes the log's I/O thread; sent as soon as the thread is free, a consumer that
waits on the network between messages (the broker's) paid one per few messages. These
tests count the hops by wrapping the pump's ``IOThread.run``; ``LINGER`` is set long so
that no assertion depends on how fast the machine runs, and ``sync_interval`` longer
still, so that no commit (a hop of its own) comes in between.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeAck

from aiodiskqueue import AckQueue
from aiodiskqueue.ack import pump as pump_module

BODY = b"b" * 1024
CHILD = Path(__file__).with_name("ack_child.py")


def count_hops(q: AckQueue) -> list[int]:
    """Count every hop of ``q``'s pump to its I/O thread from now on: ``[sent, done]``."""
    hops = [0, 0]
    io = q._pump._io
    assert io is not None
    run = io.run

    def done(_: Any) -> None:
        hops[1] += 1

    def counted(*args: Any) -> Any:
        hops[0] += 1
        fut = run(*args)
        fut.add_done_callback(done)
        return fut

    io.run = counted  # type: ignore[method-assign,assignment]
    return hops


async def turns(n: int = 50) -> None:
    """Let the event loop run ``n`` times (the pump's task included)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def settle(hops: list[int], until: int) -> None:
    """Wait (at most 10 s: a guard, not a timing assertion) until ``until`` hops are done."""
    for _ in range(1000):
        if hops[1] >= until:
            return
        await asyncio.sleep(0.01)


async def one_lingering(make_ack: MakeAck, monkeypatch: pytest.MonkeyPatch,
                        linger: float) -> tuple[AckQueue, list[int], int]:
    """A queue whose one message was delivered and finished after a commit, with
    ``LINGER`` set to ``linger``: the queue, its hop counter and its log bytes before."""
    monkeypatch.setattr(pump_module, "LINGER", linger)
    q = await make_ack(sync_interval=600.0)
    await q.put(BODY)
    await q.sync()
    hops = count_hops(q)
    log_bytes = q.statistics().log_bytes
    m = await asyncio.wait_for(q.get(), 10)
    await turns()
    await m.finish()
    await turns()
    assert hops[0] == 0  # the records wait for more
    return q, hops, log_bytes


async def test_a_delivery_and_its_finish_linger_then_one_hop_writes_them(
        make_ack: MakeAck, monkeypatch: pytest.MonkeyPatch) -> None:
    q, hops, log_bytes = await one_lingering(make_ack, monkeypatch, 1.0)
    await settle(hops, 1)
    await turns()
    assert hops == [1, 1]
    # Finished while it lingered: the delivery's record is never written with its body.
    written = q.statistics().log_bytes - log_bytes
    assert 0 < written < len(BODY)


async def test_many_records_go_at_once(make_ack: MakeAck,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pump_module, "LINGER", 60.0)
    monkeypatch.setattr(pump_module, "LINGER_RECORDS", 8)
    q = await make_ack(max_in_flight=100, sync_interval=600.0)
    await q.put_many([BODY] * 8)
    await q.sync()
    hops = count_hops(q)
    for _ in range(7):  # a delivery record each
        await asyncio.wait_for(q.get(), 10)
        await turns()
    assert hops[0] == 0
    await asyncio.wait_for(q.get(), 10)  # the 8th: written without waiting for LINGER
    await turns()
    assert hops[0] == 1


async def test_records_something_waits_for_do_not_linger(
        make_ack: MakeAck, monkeypatch: pytest.MonkeyPatch) -> None:
    q, hops, _ = await one_lingering(make_ack, monkeypatch, 60.0)
    # A deferred put returns once its record is written (the guard is 10 s, LINGER a
    # minute): its hop takes the lingering records along.
    await asyncio.wait_for(q.put(BODY, delay=30.0), 10)
    assert hops[0] == 1


async def test_a_commit_writes_the_lingering_records(
        make_ack: MakeAck, tmp_path: Path) -> None:
    """SIGKILL right after a commit while the records of a delivery (m1, in flight) and
    of a finish (m0) still linger: the commit wrote both."""
    d = tmp_path / "q"
    with (tmp_path / "stderr.txt").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), "linger", str(d), stdout=asyncio.subprocess.PIPE,
            stderr=err)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line == b"COMMITTED\n", (tmp_path / "stderr.txt").read_text()
    finally:
        proc.kill()
        assert await proc.wait() == -signal.SIGKILL
    q2 = await make_ack(directory=d, sync_interval=600.0)
    # m1 was in flight: its delivery record is in the log, or the commit's stored
    # position (past m1) would have lost it. m0's finish is there too.
    assert q2.qsize() == 3
    got = sorted([(await asyncio.wait_for(q2.get(), 10)).body for _ in range(3)])
    assert got == [b"m1", b"m2", b"m3"]
