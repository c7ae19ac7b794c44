"""The storage behind topics and channels: the library's :class:`AckQueue`.

This is the only module of the broker that knows which queue class stores the
messages. The rest of the broker sees :class:`Store` and :class:`Delivery`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol, final

from ..ack.files import ack_queue_files, remove_ack_queue_files
from ..ack.queue import AckQueue, Message
from ..errors import MessageNotInFlight, QueueEmpty
from ._options import BrokerOptions


class Delivery(Protocol):
    """One message handed out by a :class:`Store`, in flight until settled."""

    @property
    def id(self) -> bytes:
        """The 16-byte ASCII id sent on the wire."""
        ...

    @property
    def body(self) -> bytes: ...

    @property
    def attempts(self) -> int:
        """Deliveries so far, this one included."""
        ...

    @property
    def timestamp(self) -> int:
        """Publication time, nanoseconds since the epoch."""
        ...

    @property
    def in_flight(self) -> bool:
        """False once finished, requeued, or taken back by the store after its deadline."""
        ...

    async def finish(self) -> None:
        """Done: never delivered again. Raises StoreError if no longer in flight."""
        ...

    async def requeue(self, delay: float = 0.0) -> None:
        """Deliver again after ``delay`` seconds. Raises StoreError if no longer in flight."""
        ...

    async def touch(self) -> None:
        """Push the deadline back by the timeout. Raises StoreError if no longer in flight."""
        ...


@dataclass(frozen=True, slots=True)
class StoreStats:
    """The figures the broker reports for one store."""

    depth: int
    in_flight: int
    deferred: int
    finished: int
    requeued: int
    timed_out: int
    dead_lettered: int


class Store(Protocol):
    """A durable at-least-once queue of message bodies."""


    async def put(self, body: bytes, delay: float = 0.0) -> None:
        """Store ``body``, deliverable after ``delay`` seconds."""
        ...

    async def put_many(self, bodies: list[bytes], delay: float = 0.0) -> None:
        """Store ``bodies`` in order as one batch, deliverable after ``delay`` seconds."""
        ...

    async def get(self, msg_timeout: float | None = None) -> Delivery:
        """Wait for the next due message and put it in flight.

        ``msg_timeout`` (seconds, at most the store's maximum) is this
        delivery's deadline and that of its touches; None: the store's.
        """
        ...

    def get_nowait(self, msg_timeout: float | None = None) -> Delivery | None:
        """The next due message if one is ready in memory, else None (``msg_timeout`` as
        for get)."""
        ...

    def get_ready(self, limit: int, msg_timeout: float | None = None) -> list[Delivery]:
        """Up to ``limit`` due messages that are ready in memory, in order, now in flight
        (``msg_timeout`` as for get); an empty list if none is."""
        ...

    async def empty(self) -> None:
        """Drop every message that is ready or deferred (nsqd's channel/topic empty).

        Messages in flight stay in flight; the caller settles them.
        """
        ...

    def stats(self) -> StoreStats:
        """Current figures."""
        ...

    async def aclose(self) -> None:
        """Sync and close; in-flight messages are delivered again after the next open."""
        ...


PER_DELIVERY_TIMEOUT: Final = True
"""Whether ``Store.get(msg_timeout)`` honours its argument (a client's IDENTIFY ``msg_timeout``)."""

StoreError = MessageNotInFlight
"""Raised by a finish, requeue or touch of a message that is no longer in flight."""

@final
class _AckDelivery:
    """A :class:`Message` with its id as the 16 bytes the wire carries."""

    __slots__ = ("_m", "attempts", "body", "id", "timestamp")

    def __init__(self, m: Message) -> None:
        self._m = m
        self.id = m.id.encode("latin-1")
        self.body = m.body
        self.attempts = m.attempts
        self.timestamp = m.timestamp

    @property
    def in_flight(self) -> bool:
        """False once finished, requeued or timed out."""
        return self._m.in_flight

    def finish(self) -> Coroutine[Any, Any, None]:
        """FIN. Raises MessageNotInFlight if it is no longer in flight.

        The queue's own coroutine, not a wrapper around it: one FIN per message
        delivered makes this a hot path.
        """
        return self._m.finish()

    async def requeue(self, delay: float = 0.0) -> None:
        """REQ with ``delay`` seconds. Raises MessageNotInFlight if it is no longer in flight."""
        await self._m.requeue(delay)

    async def touch(self) -> None:
        """TOUCH. Raises MessageNotInFlight if it is no longer in flight."""
        await self._m.touch()


@final
class AckStore:
    """A :class:`Store` over an :class:`~aiodiskqueue.AckQueue` in nsqd's message format.

    The queue's ``msg_timeout`` is the broker's default; ``get(msg_timeout)``
    passes a client's IDENTIFY ``msg_timeout`` on to ``AckQueue.get``, which
    applies it to that delivery and its touches.
    """

    def __init__(self, q: AckQueue) -> None:
        self.q = q

    async def put(self, body: bytes, delay: float = 0.0) -> None:
        """Store ``body``; returns once written (fsynced with ``sync_every=1``)."""
        await self.q.put(body, delay=delay)

    async def put_many(self, bodies: list[bytes], delay: float = 0.0) -> None:
        """Store ``bodies`` in order, as one batch (all or none pass the size checks)."""
        await self.q.put_many(bodies, delay=delay)

    async def get(self, msg_timeout: float | None = None) -> Delivery:
        """The next due message, in flight for ``msg_timeout`` seconds (None: the queue's)."""
        return _AckDelivery(await self.q.get(msg_timeout=msg_timeout))

    def get_nowait(self, msg_timeout: float | None = None) -> Delivery | None:
        """The next message if one is ready in memory, now in flight; else None."""
        try:
            return _AckDelivery(self.q.get_nowait(msg_timeout=msg_timeout))
        except QueueEmpty:
            return None

    def get_ready(self, limit: int, msg_timeout: float | None = None) -> list[Delivery]:
        """Up to ``limit`` messages that are ready in memory, in order, now in flight."""
        if limit < 1:
            return []
        try:
            return list(map(_AckDelivery, self.q.get_many_nowait(limit, msg_timeout=msg_timeout)))
        except QueueEmpty:
            return []

    async def empty(self) -> None:
        """Drop every ready and deferred message (``AckQueue.purge``); in-flight ones stay."""
        await self.q.purge()

    def stats(self) -> StoreStats:
        """The queue's depth, in-flight and deferred counts and counters."""
        s = self.q.statistics()
        return StoreStats(depth=s.depth, in_flight=s.in_flight, deferred=s.deferred,
                          finished=s.finished, requeued=s.requeued, timed_out=s.timed_out,
                          dead_lettered=s.dead_lettered)

    async def aclose(self) -> None:
        """Close the queue (in-flight messages are delivered again after the next open)."""
        await self.q.aclose()


def store_files(directory: str, name: str) -> list[str]:
    """Every file of the store ``name`` in ``directory``, sorted (exact names only).

    The AckQueue's data queue, ack log and dead-letter queue
    (:func:`aiodiskqueue.ack.files.ack_queue_files`): queue ``t:a`` never
    claims files of ``t:a.b`` nor of ``t:a.dead``, which are other valid
    topic or channel names.
    """
    return ack_queue_files(directory, name)


async def remove_store(store: Store, directory: str | os.PathLike[str], name: str) -> None:
    """Close ``store`` (named ``name``) and delete its files: nsqd's topic/channel delete.

    Raises DiskQueueError if the store cannot be closed, OSError if a file cannot be deleted.
    """
    await store.aclose()
    d = os.fspath(directory)
    await asyncio.get_running_loop().run_in_executor(None, remove_ack_queue_files, d, name)


async def open_store(directory: str | os.PathLike[str], name: str, opts: BrokerOptions, *,
                     dead_letters: bool = True) -> Store:
    """Open (creating) the store ``name`` in ``directory``: an AckQueue with ``format="nsq"``.

    With ``dead_letters`` the broker's ``max_attempts`` applies (dead letters
    go to the AckQueue's dead-letter queue in ``NAME.dead-letters/``); without,
    attempts are unlimited.

    Raises QueueLocked if another process has it open, DiskQueueError on I/O errors.
    """
    q = await AckQueue.open(directory, name, **opts.queue_options(dead_letters=dead_letters))
    return AckStore(q)


__all__ = ["PER_DELIVERY_TIMEOUT", "AckStore", "Delivery", "Store", "StoreError", "StoreStats",
           "open_store", "remove_store", "store_files"]
