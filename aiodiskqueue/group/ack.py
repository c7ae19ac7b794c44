"""The public queue group of NSQ-style deliveries: :class:`AckQueueGroup` (the life cycle,
the producer's claim and the consumer's reader are :class:`~.queue._Group`'s)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, final

from .._core.options import number
from ..ack import AckQueue, Message
from ..ack.options import AckOptions
from ..errors import DiskQueueError
from ._reader import ShardHooks
from .queue import _Group


@final
class AckQueueGroup(_Group[AckQueue, Message]):
    """A queue group whose consumers deliver NSQ-style: a message is in flight until
    finished or requeued, timeouts, dead letters, as :class:`~aiodiskqueue.AckQueue`.

    Each shard is an AckQueue; a consumer holds the consumer role of its shards, so
    the in-flight messages, the ack log and the dead letters (``NAME.dead-letters``
    inside the shard) are the consumer process's, per shard; ``max_in_flight`` counts
    per shard. A take-over delivers again what the dead consumer had in flight (the
    shard's ack log has them). A producer puts ready messages (no ``delay``: deferred
    messages live in the consumer's ack log). A raw-format consumer may be fed by
    :class:`QueueGroup` producers. The options are AckQueue's; the group's layout,
    roles, ``retention`` and ``settle_timeout`` (default: ``msg_timeout``) are as for
    :class:`QueueGroup`.
    """

    _kind = "AckQueueGroup"

    def __init__(self, directory: str | os.PathLike[str], name: str, role: str = "producer",
                 *, retention: float | None = None, settle_timeout: float | None = None,
                 **options: Any) -> None:
        o = AckOptions.from_keywords("AckQueueGroup",
                                     {k: v for k, v in options.items() if k != "clock"})
        self._options = options
        self._max_msg_timeout = o.max_msg_timeout
        super().__init__(directory, name, role, retention,
                         o.msg_timeout if settle_timeout is None else settle_timeout,
                         o.data_options())

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str, role: str = "producer",
                   **options: Any) -> AckQueueGroup:
        """Open (creating if needed) group ``name`` in ``directory`` as ``role``.

        Raises as :meth:`QueueGroup.open` does.
        """
        g = cls(directory, name, role, **options)
        await g._start()
        return g

    async def __aenter__(self) -> AckQueueGroup:
        await super().__aenter__()
        return self

    async def _open_shard(self, path: str, role: str) -> AckQueue:
        return await AckQueue.open(path, self._lay.name, role=role, **self._options)

    def _hooks(self) -> ShardHooks[AckQueue, Message]:
        async def open_consumer(path: str) -> AckQueue:
            return await self._open_shard(path, "consumer")

        return ShardHooks(open_consumer, _ack_take, _ack_in_flight, _ack_keeps)

    def get_nowait(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver a message ready in one of this consumer's shards, the shards taking
        turns; FIFO within each shard. ``msg_timeout`` as for :meth:`get`.

        Raises QueueEmpty if none is ready (or each shard has ``max_in_flight`` out),
        QueueClosed once closed, RoleError on a producer, ValueError for a bad
        ``msg_timeout``, ShardDamaged as :meth:`QueueGroup.get` does.
        """
        reader = self._the_reader("get_nowait()")
        return reader.take(self._taker(msg_timeout))

    async def get(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver the next message of this consumer's shards, waiting for one; it is in
        flight until finished, requeued or timed out (``AckQueue.get()``). Shards take
        turns; order is FIFO within a shard. ``msg_timeout`` overrides the queue's for
        this delivery (at most ``max_msg_timeout``). Cancelling it delivers nothing.

        Raises QueueClosed once closed, RoleError on a producer, ValueError for a bad
        ``msg_timeout``, ShardDamaged as :meth:`QueueGroup.get` does.
        """
        reader = self._the_reader("get()")
        return await reader.get(self._taker(msg_timeout))

    def _taker(self, msg_timeout: float | None) -> Callable[[AckQueue], Message] | None:
        if msg_timeout is None:
            return None
        t = number("msg_timeout", msg_timeout, positive=True)
        if t > self._max_msg_timeout:
            raise ValueError(f"msg_timeout must be <= max_msg_timeout={self._max_msg_timeout}, "
                             f"got {msg_timeout}")
        return lambda q: q.get_nowait(msg_timeout=t)

    async def put(self, body: bytes | bytearray | memoryview) -> None:
        """Publish ``body`` into this producer's shard (``AckQueue.put()`` of a producer).

        Raises RoleError on a consumer, otherwise as ``AckQueue.put()``.
        """
        await self._the_producer("put()").put(body)

    async def put_many(self, bodies: Iterable[bytes | bytearray | memoryview]) -> None:
        """Publish every body, in order, as one batch into this producer's shard.

        Raises RoleError on a consumer, otherwise as ``AckQueue.put_many()``.
        """
        await self._the_producer("put_many()").put_many(bodies)


def _ack_take(q: AckQueue) -> Message:
    return q.get_nowait()


def _ack_in_flight(q: AckQueue) -> int:
    return q.statistics().in_flight


def _ack_keeps(q: AckQueue) -> bool:
    st = q.statistics()
    if st.deferred:
        return True
    try:
        return bool(q.dead_letters.qsize())
    except DiskQueueError:
        return False  # max_attempts=0: no dead-letter queue
