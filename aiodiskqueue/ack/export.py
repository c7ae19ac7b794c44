"""Hand an AckQueue's unfinished messages back to its data queue, for nsqd.

An AckQueue keeps the messages it took from its data queue (in flight,
requeued, deferred) only in its ack log. nsqd reads the data queue alone; at
its own shutdown it writes its in-flight and deferred messages into the
channel's disk queue. :func:`hand_back` does the same for an AckQueue in
nsqd's format: every message the log still holds is appended to the data
queue with its timestamp, id and attempts, and the log forgets it, in one
commit. Deferred messages become due at once (as nsqd's flush does).
"""

from __future__ import annotations

import os
from typing import Any

from .._format import nsq
from .dispatch import Dispatcher
from .pump import LOAD_BATCH, Pump
from .queue import AckQueue


async def _move_logged(d: Dispatcher, pump: Pump) -> int:
    """Right after recovery (nothing in flight, nothing taken yet): log entries to the
    data queue."""
    entries = sorted(d.journal.entries.values(), key=lambda e: e.key)
    d.forget_waiting()
    pump.drop_loading()
    moved = 0
    for start in range(0, len(entries), LOAD_BATCH):
        batch = entries[start:start + LOAD_BATCH]
        await pump.read_bodies([e for e in batch if e.body is None])
        payloads = [nsq.encode(e.timestamp, e.attempts, e.msg_id, e.body)
                    for e in batch if e.body is not None]
        if payloads:
            # On the data queue before the log forgets them: a crash in
            # between delivers them twice, never loses them.
            await pump.data.put_many(payloads)
        for e in batch:
            d.journal.done(e)
        moved += len(payloads)
    d.forget_waiting()
    return moved


async def hand_back(directory: str | os.PathLike[str], name: str, **options: Any) -> int:
    """Move every unfinished message of AckQueue ``name`` into its data queue; return how many.

    The queue must be in nsqd's format (``format="nsq"`` is implied);
    ``options`` are :class:`AckQueue` options (``max_msg_size`` and
    ``max_bytes_per_file`` as the queue was written with). Attempts are kept;
    ``max_attempts`` does not apply (nothing is dead-lettered).

    Raises QueueLocked if the queue is open elsewhere, DiskQueueError on I/O
    errors, TypeError or ValueError for a bad option.
    """
    options = {**options, "format": "nsq", "max_attempts": 0}
    q = AckQueue(directory, name, **options)
    moved = 0

    async def move(d: Dispatcher, pump: Pump) -> None:
        nonlocal moved
        moved = await _move_logged(d, pump)

    await q._start(after_recovery=move)
    await q.aclose()
    return moved


__all__ = ["hand_back"]
