"""A deferred message whose due time passed while the queue was closed is ready at open."""

from __future__ import annotations

from pathlib import Path

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
