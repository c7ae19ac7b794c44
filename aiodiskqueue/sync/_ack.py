"""The blocking facade of a reliable-delivery queue: :class:`SyncAckQueue`, :class:`SyncMessage`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, final

from ..ack import AckStatistics
from ..ack import queue as _ack_queue
from ..errors import QueueClosed, QueueEmpty
from ._base import Empty, _check_timeout, _Facade, _get_within
from ._queue import SyncDiskQueue

__all__ = ["SyncAckQueue", "SyncMessage"]


@final
class SyncMessage:
    """One delivery of an :class:`AckQueue` message, for a thread.

    ``id``, ``body``, ``attempts`` and ``timestamp`` as on
    :class:`aiodiskqueue.Message`. ``with msg:`` finishes the message when the
    block succeeds and requeues it (with backoff, the failure logged and
    re-raised) when it raises, exactly as ``async with`` does.
    """

    __slots__ = ("_facade", "_m", "attempts", "body", "id", "timestamp")

    def __init__(self, facade: SyncAckQueue, m: _ack_queue.Message) -> None:
        self._facade = facade
        self._m = m
        self.id: str = m.id
        self.body: bytes = m.body
        self.attempts: int = m.attempts
        self.timestamp: int = m.timestamp

    @property
    def message(self) -> _ack_queue.Message:
        """The async message behind this one (use it only on the queue's loop)."""
        return self._m

    @property
    def in_flight(self) -> bool:
        """True until the message is finished, requeued or timed out."""
        return self._facade._peek(lambda: self._m.in_flight)

    def finish(self) -> None:
        """NSQ FIN, as :meth:`aiodiskqueue.Message.finish`.

        Raises MessageNotInFlight, QueueClosed, DiskQueueError as it does.
        """
        self._facade._call(self._m.finish())

    def requeue(self, delay: float = 0.0) -> None:
        """NSQ REQ, as :meth:`aiodiskqueue.Message.requeue`.

        Raises ValueError, MessageNotInFlight, QueueClosed as it does.
        """
        self._facade._call(self._m.requeue(delay))

    def touch(self) -> None:
        """NSQ TOUCH, as :meth:`aiodiskqueue.Message.touch`.

        Raises MessageNotInFlight, QueueClosed as it does.
        """
        self._facade._call(self._m.touch())

    def __enter__(self) -> SyncMessage:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._facade._call(self._m.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return f"<sync {self._m!r}>"


@final
class SyncAckQueue(_Facade[_ack_queue.AckQueue]):
    """A blocking, thread-safe :class:`aiodiskqueue.AckQueue` for threads and sync code.

    Opened and attached as :class:`DiskQueue`; ``get()`` returns a sync
    :class:`Message` to ``finish()`` or ``requeue()`` from any thread. ``role=``
    (``"producer"``, ``"consumer"`` or ``"both"``) is passed on as to the async queue.

    Raises as :meth:`aiodiskqueue.AckQueue.open` does.
    """

    _kind = "ack queue"

    def __init__(self, directory: str | os.PathLike[str], name: str, *, uvloop: bool = False,
                 **options: Any) -> None:
        q, loop, runner = self._start(
            lambda: _ack_queue.AckQueue.open(directory, name, **options), name, uvloop)
        super().__init__(q, loop, runner)

    @classmethod
    def attach(cls, queue: _ack_queue.AckQueue,
               loop: asyncio.AbstractEventLoop | None = None) -> SyncAckQueue:
        """A facade over the open ``queue`` on ``loop`` (default: the running loop).

        ``close()`` of the facade detaches it; whoever opened ``queue`` closes it.

        Raises DiskQueueError if no loop is given and none is running.
        """
        self = cls.__new__(cls)
        _Facade.__init__(self, queue, cls._attach_loop(loop), None)
        return self

    @property
    def queue(self) -> _ack_queue.AckQueue:
        """The async queue behind this facade (use it only on :attr:`loop`)."""
        return self._q

    @property
    def role(self) -> str:
        """``"producer"``, ``"consumer"`` or ``"both"`` (``role=`` of the async queue)."""
        return self._q.role

    def put(self, body: bytes | bytearray | memoryview, *, delay: float = 0.0) -> None:
        """As the async ``put()``: publish ``body`` (after ``delay`` seconds); returns once written.

        Raises as :meth:`aiodiskqueue.AckQueue.put` does.
        """
        self._call(self._q.put(body, delay=delay))

    def put_many(self, bodies: Iterable[bytes | bytearray | memoryview], *,
                 delay: float = 0.0) -> None:
        """As the async ``put_many()``: one batch, every body checked first."""
        self._call(self._q.put_many(list(bodies), delay=delay))

    def get(self, block: bool = True, timeout: float | None = None, *,
            msg_timeout: float | None = None) -> SyncMessage:
        """Deliver the next message; it is in flight until finished, requeued or timed out.

        Waits unless ``block=False``, at most ``timeout`` seconds if given; a get
        that times out delivers nothing. ``msg_timeout`` as for the async ``get()``.

        Raises Empty if nothing is delivered in time, QueueClosed when the queue
        is closed, ValueError for a negative timeout or a bad ``msg_timeout``.
        """
        t = _check_timeout(timeout)
        q = self._q
        if not block:
            def take() -> _ack_queue.Message:
                try:
                    return q.get_nowait(msg_timeout=msg_timeout)
                except Empty:
                    raise
                except QueueEmpty:
                    raise Empty("no message ready") from None

            return SyncMessage(self, self._peek(take))
        m = self._call(_get_within(lambda: q.get(msg_timeout=msg_timeout), t))
        return SyncMessage(self, m)

    def get_nowait(self, *, msg_timeout: float | None = None) -> SyncMessage:
        """``get(block=False)``."""
        return self.get(block=False, msg_timeout=msg_timeout)

    def __iter__(self) -> Iterator[SyncMessage]:
        """Deliver messages until the queue is closed."""
        while True:
            try:
                yield self.get()
            except QueueClosed:
                return

    def statistics(self) -> AckStatistics:
        """A frozen snapshot of counters and sizes, taken on the loop."""
        return self._peek(self._q.statistics)

    @property
    def dead_letters(self) -> SyncDiskQueue:
        """The dead-letter queue (``NAME`` in ``NAME.dead-letters/``), as an attached sync facade.

        Raises DiskQueueError if ``max_attempts`` is 0 (there is none).
        """
        return SyncDiskQueue.attach(self._q.dead_letters, self._loop)

    def __enter__(self) -> SyncAckQueue:
        return self
