"""A deferred message whose due time passed while the queue was closed is ready at open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aiodiskqueue import AckQueue
from aiodiskqueue.ack.clock import ManualClock


async def test_message_due_while_closed_is_ready_at_open(tmp_path: Path) -> None:
    clock = ManualClock()
    async with AckQueue(tmp_path, "q", clock=clock) as q:
        await q.put(b"later", delay=30)
        await q.put(b"much-later", delay=300)
        assert q.qsize() == 0 and q.statistics().deferred == 2
    clock.advance(60)  # the first came due while no process had the queue open
    async with AckQueue(tmp_path, "q", clock=clock) as q:
        assert q.qsize() == 1
        assert q.statistics().deferred == 1
        m = await q.get()
        assert m.body == b"later" and m.attempts == 1
        await m.finish()
        assert q.empty() and q.statistics().deferred == 1


@pytest.mark.parametrize("role", ["both", "consumer"])
async def test_a_finish_waiting_for_its_fsync_when_the_queue_closes_succeeds(
        tmp_path: Path, role: str) -> None:
    """The close's final commit fsyncs the log: a finish() waiting for that (sync_every=1)
    returns, it does not raise QueueClosed for a FIN that is durable (a queue group
    closes a shard it hands over as soon as its last message in flight is finished)."""
    async with AckQueue(tmp_path, "q", "producer" if role == "consumer" else "both") as p:
        await p.put(b"y")
    q = await AckQueue.open(tmp_path, "q", role=role, sync_every=1)
    msg = await q.get()
    finishing = asyncio.ensure_future(msg.finish())
    await asyncio.sleep(0)  # finish() waits for the log's fsync
    await q.aclose()
    await finishing
    async with AckQueue(tmp_path, "q", role) as q:
        assert q.qsize() == 0 and q.statistics().in_flight == 0
