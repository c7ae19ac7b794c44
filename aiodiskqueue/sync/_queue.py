"""The blocking facade of a byte queue: :class:`SyncDiskQueue`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from typing import Any, final

from .. import queue as _core_queue
from .._core.options import Statistics
from ..errors import DiskQueueError, QueueClosed, QueueEmpty, QueueFull
from ._base import (
    _ROOM_POLL_MAX,
    _ROOM_POLL_MIN,
    Empty,
    Full,
    LoopThreadError,
    _check_timeout,
    _Facade,
    _get_within,
    _Waiter,
)

__all__ = ["SyncDiskQueue"]


@final
class SyncDiskQueue(_Facade[_core_queue.DiskQueue]):
    """A blocking, thread-safe :class:`aiodiskqueue.DiskQueue` for threads and sync code.

    ``DiskQueue(directory, name, uvloop=False, **options)`` opens the queue (the
    async queue's options, and its ``role``) on an event-loop thread this object owns; close it
    with ``close()`` or ``with``. ``DiskQueue.attach(q, loop)`` shares an open
    async queue instead. Every method may be called from any thread.

    Raises as :meth:`aiodiskqueue.DiskQueue.open` does.
    """

    _kind = "queue"

    def __init__(self, directory: str | os.PathLike[str], name: str, *, uvloop: bool = False,
                 **options: Any) -> None:
        q, loop, runner = self._start(
            lambda: _core_queue.DiskQueue.open(directory, name, **options), name, uvloop)
        super().__init__(q, loop, runner)
        self._init_batch()

    @classmethod
    def attach(cls, queue: _core_queue.DiskQueue,
               loop: asyncio.AbstractEventLoop | None = None) -> SyncDiskQueue:
        """A facade over ``queue``, open on ``loop`` (default: the running loop).

        The queue is shared: async tasks keep using it directly. ``close()`` of
        the facade detaches it; whoever opened ``queue`` closes it.

        Raises DiskQueueError if no loop is given and none is running.
        """
        self = cls.__new__(cls)
        _Facade.__init__(self, queue, cls._attach_loop(loop), None)
        self._init_batch()
        return self

    # Puts of an unbounded queue from many threads are gathered: each thread appends
    # its message and waits on a lock; the loop takes everything gathered so far in
    # one hop and stores it with one put_many (one batch, one write), then releases
    # the waiting threads. Order: the order in which the threads appended.

    def _init_batch(self) -> None:
        self._batch: list[tuple[bytes | bytearray | memoryview, _Waiter]] = []
        self._batch_scheduled = False

    def _put_gathered(self, item: bytes | bytearray | memoryview) -> None:
        if self._on_loop_thread():
            raise LoopThreadError(f"blocking call on the event loop thread of {self!r}; "
                                  "use the async queue there")
        w = _Waiter()
        with self._lock:
            if self._closed:
                raise QueueClosed(f"queue {self._q.name!r} is closed (sync facade)")
            self._batch.append((item, w))
            if not self._batch_scheduled:
                try:
                    self._loop.call_soon_threadsafe(self._drain_batch)
                except RuntimeError:  # the loop is closed
                    self._batch.pop()
                    raise QueueClosed(f"queue {self._q.name!r}: its event loop is closed"
                                      ) from None
                self._batch_scheduled = True
        w.lock.acquire()
        if w.error is not None:
            raise w.error

    def _drain_batch(self) -> None:
        with self._lock:
            batch, self._batch = self._batch, []
            self._batch_scheduled = False
        task = self._loop.create_task(self._write_batch(batch))
        self._tasks.add(task)
        name = self._q.name

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            # Cancelled (close, the end of the loop), even before it started: the
            # callers left waiting raise QueueClosed; a message being written when that
            # happened may have been stored.
            for _, w in batch:
                w.release(QueueClosed(f"queue {name!r} was closed during the call"))

        task.add_done_callback(done)

    async def _write_batch(self, batch: list[tuple[bytes | bytearray | memoryview, _Waiter]]
                           ) -> None:
        q = self._q
        try:
            await q.put_many([item for item, _ in batch])
        except (DiskQueueError, TypeError, ValueError):
            # put_many stores all or nothing: put one by one, so that each caller gets
            # its own outcome (a bad message fails only its own put).
            for item, w in batch:
                try:
                    await q.put(item)
                except (DiskQueueError, TypeError, ValueError) as exc:
                    w.release(exc)
                else:
                    w.release()
        else:
            for _, w in batch:
                w.release()

    @property
    def queue(self) -> _core_queue.DiskQueue:
        """The async queue behind this facade (use it only on :attr:`loop`)."""
        return self._q

    def put(self, item: bytes | bytearray | memoryview, block: bool = True,
            timeout: float | None = None) -> None:
        """Put ``item`` at the end of the queue; returns once it is written to the OS.

        With ``sync_every=1`` returns once it is fsynced. Only a bounded queue
        (``maxsize > 0``) waits for room: at most ``timeout`` seconds, or not at
        all with ``block=False``; the write itself is never cut short.

        A put interrupted in its thread (KeyboardInterrupt) or by ``close()`` of
        an attached facade may still have stored its message, as a cancelled
        async ``put()``.

        Raises Full if there is no room in time, MessageSizeError, TypeError,
        QueueClosed and DiskQueueError as the async ``put()`` does; ValueError
        for a negative timeout.
        """
        t = _check_timeout(timeout)
        q = self._q
        if not q.maxsize:  # never waits for room: block and timeout do not matter
            self._put_gathered(item)
            return
        if block and t is None:
            self._call(q.put(item))
            return

        async def put_within() -> None:
            if q.maxsize:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + (t if block and t is not None else 0.0)
                pause = _ROOM_POLL_MIN
                while q.full():
                    left = deadline - loop.time()
                    if left <= 0:
                        raise Full(f"queue is at maxsize={q.maxsize}")
                    await asyncio.sleep(min(pause, left))
                    pause = min(pause * 2, _ROOM_POLL_MAX)
            # Not full: the core's put() accepts the message without waiting for room.
            await q.put(item)

        self._call(put_within())

    def put_nowait(self, item: bytes | bytearray | memoryview) -> None:
        """Accept ``item`` without waiting, as the async ``put_nowait()``.

        The record is written with the next batch, not yet when this returns (a
        write failure is raised by the next ``sync()``): use ``put()`` to know it
        was written.

        Raises Full if the queue is at ``maxsize`` or its write buffer is full,
        MessageSizeError, TypeError, QueueClosed.
        """
        q = self._q

        def accept() -> None:
            try:
                q.put_nowait(item)
            except Full:
                raise
            except QueueFull as exc:
                raise Full(str(exc)) from None

        self._peek(accept)

    def put_many(self, items: Iterable[bytes | bytearray | memoryview]) -> None:
        """As the async ``put_many()``: one batch, all validated first; returns once written."""
        self._call(self._q.put_many(list(items)))

    def get(self, block: bool = True, timeout: float | None = None) -> bytes:
        """Remove and return the oldest message.

        Waits for one unless ``block=False``; at most ``timeout`` seconds if given.
        A get that times out takes nothing.

        Raises Empty if none comes in time (with ``block=False``: none is ready
        in memory, as ``get_nowait()``), QueueClosed when the queue is closed or
        shut down and drained, CorruptionError as the async ``get()``; ValueError
        for a negative timeout.
        """
        t = _check_timeout(timeout)
        if not block:
            return self.get_nowait()
        return self._call(_get_within(self._q.get, t))

    def get_nowait(self) -> bytes:
        """Take a message that is ready in memory, without waiting.

        Raises Empty if none is ready, QueueClosed as ``get()`` does.
        """
        q = self._q

        def take() -> bytes:
            try:
                return q.get_nowait()
            except Empty:
                raise
            except QueueEmpty:
                raise Empty("no message ready") from None

        return self._peek(take)

    def get_many(self, max_items: int, timeout: float | None = None) -> list[bytes]:
        """Return between 1 and ``max_items`` messages, waiting (at most ``timeout``) for the first.

        Raises Empty on timeout, ValueError if ``max_items < 1``, QueueClosed.
        """
        t = _check_timeout(timeout)
        q = self._q
        return self._call(_get_within(lambda: q.get_many(max_items), t))

    def __iter__(self) -> Iterator[bytes]:
        """Take messages until the queue is closed, or shut down and drained."""
        while True:
            try:
                yield self.get()
            except QueueClosed:
                return

    def full(self) -> bool:
        """True if ``maxsize > 0`` and ``qsize() >= maxsize``."""
        return self._peek(self._q.full)

    @property
    def maxsize(self) -> int:
        """Bound on ``qsize()`` for ``put()``; 0 means unbounded."""
        return self._q.maxsize

    @property
    def role(self) -> str:
        """``"producer"``, ``"consumer"`` or ``"both"`` (``role=`` of the async queue)."""
        return self._q.role

    def shutdown(self, immediate: bool = False) -> None:
        """As the async ``shutdown()``: refuse puts; ``get()`` drains, then raises QueueClosed."""
        q = self._q
        self._peek(lambda: q.shutdown(immediate))

    def statistics(self) -> Statistics:
        """A frozen snapshot of positions, depth and counters, taken on the loop."""
        return self._peek(self._q.statistics)

    def __enter__(self) -> SyncDiskQueue:
        return self
