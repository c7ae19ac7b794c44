"""Blocking, thread-safe access to a queue: :class:`DiskQueue` and :class:`AckQueue` for sync code.

The engine stays asyncio: every call is run as a coroutine on the event loop that owns
the queue, and the calling thread blocks on its result. The facades:

* ``DiskQueue(directory, name, **options)`` opens the queue on an event-loop thread the
  facade starts and owns (uvloop with ``uvloop=True``); ``close()`` closes the queue and
  stops the thread.
* ``QueueGroup(directory, name, **options)`` is a group producer for a WSGI worker
  process (gunicorn, Django, Flask): it claims a shard of the group on a loop thread
  it owns, and an asyncio consumer process reads the whole group.
* ``DiskQueue.attach(async_queue, loop)`` wraps an open :class:`aiodiskqueue.DiskQueue`
  running on ``loop`` (by default the running loop of the caller), so worker threads and
  asyncio tasks share ONE open queue. The facade does not own the queue: its ``close()``
  only detaches it, and the async side closes the queue.

Names follow :class:`queue.Queue` where the meaning is the same. ``get(timeout=...)``
and ``put_nowait()`` on a full queue raise :class:`Empty` and :class:`Full`, which are
both ``aiodiskqueue.QueueEmpty`` / ``QueueFull`` and ``queue.Empty`` / ``queue.Full``,
so either ``except`` clause catches them.

Guarantees are the core's: ``put()`` returns once the record is written to the OS
(fsynced with ``sync_every=1``); a ``get()`` that times out or is interrupted by
``close()`` takes nothing (the core's waiters only wake a task, the message is taken
after the wake-up). A call must not be made from the loop's own thread (it would wait
for itself): that raises :class:`LoopThreadError`.
"""

from ._ack import SyncAckQueue, SyncMessage
from ._base import Empty, Full, LoopThreadError
from ._group import SyncQueueGroup
from ._queue import SyncDiskQueue

DiskQueue = SyncDiskQueue
"""``aiodiskqueue.sync.DiskQueue``: the name as in the async package."""
AckQueue = SyncAckQueue
"""``aiodiskqueue.sync.AckQueue``: the name as in the async package."""
Message = SyncMessage
"""``aiodiskqueue.sync.Message``: the name as in the async package."""
QueueGroup = SyncQueueGroup
"""``aiodiskqueue.sync.QueueGroup``: a group producer (the name as in the async package)."""

__all__ = ["AckQueue", "DiskQueue", "Empty", "Full", "LoopThreadError", "Message", "QueueGroup",
           "SyncAckQueue", "SyncDiskQueue", "SyncMessage", "SyncQueueGroup"]
