"""The public queue: :class:`DiskQueue`."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, cast, final

from ._core.buffers import QUEUE_OPEN, Lifecycle
from ._core.consumer import ConsumerEngine
from ._core.engine import Engine
from ._core.marker import EmptyMarker
from ._core.options import (
    DEFAULTS,
    Options,
    Statistics,
    as_bytes,
    check_max_items,
    check_name,
)
from ._core.producer import ProducerEngine
from ._format.codec import HEADER_SIZE
from ._format.group import is_group
from ._format.layout import Layout
from ._format.roles import check_role
from .errors import (
    DiskQueueError,
    GroupNameConflict,
    MessageSizeError,
    QueueClosed,
    QueueEmpty,
    QueueFull,
)


@final
class DiskQueue:
    """A persistent FIFO queue of byte messages, stored like go-diskqueue stores it.

    Use ``async with DiskQueue(directory, name, **options) as q`` or
    ``q = await DiskQueue.open(directory, name, **options)`` and ``await q.aclose()``.
    Messages are ``bytes``; ``put`` and ``get`` follow :class:`asyncio.Queue`.

    Durability (see the README for the full contract): with the default
    ``sync_every=2500``, ``await put()`` returns once the record is written to
    the operating system, so a killed process loses nothing that was put. With
    ``sync_every=1`` it returns once the record is fsynced; concurrent puts
    share one fsync.

    A damaged segment is renamed ``.bad`` and skipped (counted in
    ``statistics().bad_files``); with ``strict=True`` nothing is changed and
    opening or reading raises CorruptionError instead.

    ``role``: ``"both"`` (the default) opens the whole queue, as go-diskqueue does.
    ``"producer"`` opens its put side only and ``"consumer"`` its get side only, so
    that a producer and a consumer (two processes, or two objects of one) hold the
    queue at once; the other side's calls raise RoleError. The consumer sees a
    message once its ``put()`` has returned; a producer's ``qsize()`` and ``full()``
    count from the consumer's last stored position (at most ``sync_every`` takes or
    ``sync_interval`` seconds old). ``max_bytes_per_file`` and the message size
    limits must agree with the live other role's (OptionConflict otherwise).

    Options are keyword-only: the fields of ``Options`` (``aiodiskqueue._core.options``,
    the one definition of each, its default and its check), with their defaults.

    Raises TypeError or ValueError at construction for a bad option.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str,
        role: str = "both",
        *,
        max_bytes_per_file: int = DEFAULTS.max_bytes_per_file,
        min_msg_size: int = DEFAULTS.min_msg_size,
        max_msg_size: int = DEFAULTS.max_msg_size,
        sync_every: int = DEFAULTS.sync_every,
        sync_interval: float = DEFAULTS.sync_interval,
        maxsize: int = DEFAULTS.maxsize,
        read_buffer_bytes: int = DEFAULTS.read_buffer_bytes,
        write_buffer_bytes: int = DEFAULTS.write_buffer_bytes,
        strict: bool = DEFAULTS.strict,
        spin_us: int = DEFAULTS.spin_us,
        inline_writes: bool = DEFAULTS.inline_writes,
        file_mode: int = DEFAULTS.file_mode,
        dir_mode: int = DEFAULTS.dir_mode,
    ) -> None:
        # Every keyword parameter is a field of Options (tests/test_options_one_definition.py
        # keeps the two equal): the names are not written out a second time.
        options = {k: v for k, v in locals().items() if k in Options.NAMES}
        self._setup(directory, name, Options.from_keywords("DiskQueue", options), role)

    def _setup(self, directory: str | os.PathLike[str], name: str, opts: Options,
               role: str = "both") -> None:
        self._layout = Layout(os.fspath(directory), check_name(name), opts.file_mode,
                              opts.dir_mode)
        self._role = check_role(role)
        if role == "both":
            self._e = Engine(self._layout, opts)
        else:
            # A role's engine offers the same in-memory surface (QueueBuffers) that every
            # method here uses; the other side's calls raise RoleError.
            cls = ProducerEngine if role == "producer" else ConsumerEngine
            self._e = cast(Engine, cls(self._layout, opts))
        self._empties = EmptyMarker(self._layout)  # made before an empty message is durable
        self._closing: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ life cycle

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str, **options: Any) -> DiskQueue:
        """Open (creating if needed) queue ``name`` in ``directory``.

        Raises QueueLocked if the queue (or, with a ``role``, that role) is open in
        another process or object, QueueNotFound for a consumer of a queue that does
        not exist, OptionConflict if an option contradicts the other role's,
        GroupNameConflict if a queue group ``name`` exists in ``directory``,
        DiskQueueError if its files cannot be read or created.
        """
        q = cls(directory, name, **options)
        await q._start()
        return q

    async def __aenter__(self) -> DiskQueue:
        if self._e.state is Lifecycle.NEW:
            await self._start()
        return self

    async def _start(self) -> None:
        # A queue group of this name keeps its shards in NAME.group/: opening a plain
        # queue beside it would mix the two.
        lay = self._layout
        if is_group(lay.directory, lay.name):
            raise GroupNameConflict(lay.directory, lay.name, "queue")
        await self._e.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Write what is pending, sync data and meta, release the files; idempotent.

        Blocked ``get()`` calls raise QueueClosed (``async for`` ends). The final
        sync runs to completion even if the caller is cancelled.
        """
        e = self._e
        e.begin_close()
        if e.task is None:
            return
        await asyncio.shield(e.task)
        await asyncio.shield(self._empties.ensure_if_wanted_quietly())

    def shutdown(self, immediate: bool = False) -> None:
        """Refuse new puts; ``get()`` drains what is left, then raises QueueClosed.

        With ``immediate=True`` blocked and later ``get()`` calls raise QueueClosed
        at once. Either way nothing stored is deleted: the messages stay on disk
        for the next open. Call ``aclose()`` afterwards to release the files.
        """
        self._e.shutdown(immediate)

    def __del__(self, _warn: Any = warnings.warn) -> None:
        e = getattr(self, "_e", None)
        if e is not None and e.state in (Lifecycle.OPEN, Lifecycle.SHUTDOWN):
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        e = self._e
        read_file, read_pos = e.consumer_at()
        return (f"<DiskQueue {self._layout.name!r} in {self._layout.directory!r} "
                f"state={e.state.value} depth={e.qsize()} read={read_file},{read_pos} "
                f"write={e.write_at[0]},{e.write_at[1]}>")

    # ------------------------------------------------------------------ put

    def put_nowait(self, item: bytes | bytearray | memoryview) -> None:
        """Accept ``item`` for the next write batch without waiting for it.

        The message is written within the current event loop iteration's batch;
        a write failure is logged and raised by the next ``sync()``.

        Raises QueueFull if the queue is at ``maxsize`` or its write buffer is full,
        MessageSizeError if the size is out of bounds, TypeError for a non-bytes
        item, QueueClosed after ``shutdown()`` or ``aclose()``.
        """
        e = self._e
        data = as_bytes(item)
        n = len(data)
        e.check_put(n)
        if e.maxsize and e.depth + e.unwritten >= e.maxsize:
            raise QueueFull(f"queue is at maxsize={e.maxsize}")
        if e.pending_bytes >= e.opts.write_buffer_bytes:
            raise QueueFull(f"write buffer is full ({e.pending_bytes} bytes pending)")
        if not n:
            self._empties.start(e.loop)  # type: ignore[arg-type]  # open: it has a loop
        e.accept([data], n + HEADER_SIZE)

    async def put(self, item: bytes | bytearray | memoryview) -> None:
        """Put ``item`` at the end of the queue.

        Returns once the record is written to the OS (``sync_every > 1``) or
        fsynced (``sync_every=1``). Waits first while the queue is at ``maxsize``.
        If the call is cancelled after the message was accepted, the message
        may still be stored. A producer alone on the queue may go on without
        suspending for a few puts in a row, as with ``asyncio.Queue.put``.
        The queue's first empty message waits until its marker file
        (``NAME.diskqueue.empty``) is durable: recovery keeps empty records only
        in a queue that has one.

        Raises MessageSizeError, TypeError, QueueClosed as ``put_nowait`` does,
        and DiskQueueError (chained to the OSError) if the write fails (then
        nothing of its batch is stored) or the marker cannot be made.
        """
        e = self._e
        data = item if type(item) is bytes else as_bytes(item)
        n = len(data)
        if n < e.min_size or n > e.max_size:
            raise MessageSizeError(n, e.min_size, e.max_size)
        if not n:
            await self._empties.ensure()
        if e.maxsize:
            await e.wait_not_full()
        if e.state is not QUEUE_OPEN:
            raise e.closed_error()
        fut = e.loop.create_future()  # type: ignore[union-attr]
        if e._direct_left and e.write_one(data, n + HEADER_SIZE, fut):
            if fut.done():  # written and applied (or failed): no need to suspend
                fut.result()
                return
        else:
            e.accept([data], n + HEADER_SIZE, fut)
        await fut

    async def put_many(self, items: Iterable[bytes | bytearray | memoryview]) -> None:
        """Put every item, in order, as one batch; returns when all are written.

        All items are checked first: if any is invalid nothing is put.
        Does not wait for ``maxsize`` room (a batch may overshoot it).

        Raises as ``put`` does.
        """
        e = self._e
        datas: list[bytes] = list(items)  # type: ignore[arg-type]  # checked next
        if not all(type(d) is bytes for d in datas):
            datas = [as_bytes(d) for d in datas]
        if not datas:
            if e.state is not QUEUE_OPEN:
                raise e.closed_error()
            return
        lens = list(map(len, datas))
        lo, hi = e.min_size, e.max_size
        shortest = min(lens)
        if shortest < lo or max(lens) > hi:
            bad = next(n for n in lens if n < lo or n > hi)
            raise MessageSizeError(bad, lo, hi)
        if not shortest:
            await self._empties.ensure()
        if e.state is not QUEUE_OPEN:
            raise e.closed_error()
        fut = e.loop.create_future()  # type: ignore[union-attr]
        e.accept(datas, sum(lens) + HEADER_SIZE * len(lens), fut)
        await fut

    # ------------------------------------------------------------------ get

    def get_nowait(self) -> bytes:
        """Remove and return the oldest message if one is ready in memory.

        Raises QueueEmpty if none is ready (it may still be on its way from
        disk: ``get()`` waits for it), QueueClosed if the queue is closed or
        shut down and drained.
        """
        return self._e.take()

    async def get(self) -> bytes:
        """Remove and return the oldest message, waiting until one is available.

        Cancelling ``get()`` leaves the queue unchanged: a waiter only wakes the
        task, the message is taken after the wake-up.

        Raises QueueClosed when the queue is closed, or shut down and drained;
        CorruptionError (``strict=True`` only) when the next record is damaged:
        nothing is renamed or skipped, and puts keep working.
        """
        e = self._e
        if not e.ready:
            await e.wait_ready()
        return e.take()

    async def get_many(self, max_items: int) -> list[bytes]:
        """Return between 1 and ``max_items`` messages, waiting for the first one.

        Raises TypeError or ValueError unless ``max_items`` is an int >= 1, QueueClosed
        as ``get()`` does.
        """
        check_max_items(max_items)
        out = [await self.get()]
        if max_items > 1:
            self._e.take_more(out, max_items - 1)
        return out

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            return self._e.take()  # a message is ready: no wait, no second check
        except QueueEmpty:
            pass
        except QueueClosed:
            raise StopAsyncIteration from None
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ size

    def qsize(self) -> int:
        """Messages put and not yet taken (written or still pending)."""
        return self._e.qsize()

    def __len__(self) -> int:
        return self._e.qsize()

    def empty(self) -> bool:
        """True if ``qsize() == 0``."""
        return self._e.qsize() == 0

    def full(self) -> bool:
        """True if ``maxsize > 0`` and ``qsize() >= maxsize``; never true when unbounded."""
        e = self._e
        return bool(e.maxsize) and e.qsize() >= e.maxsize

    @property
    def maxsize(self) -> int:
        """Bound on ``qsize()`` for ``put()``; 0 means unbounded."""
        return self._e.maxsize

    @property
    def role(self) -> str:
        """``"producer"`` (the put side only), ``"consumer"`` (the get side only) or
        ``"both"``."""
        return self._role

    @property
    def name(self) -> str:
        """The queue's name (its file name prefix)."""
        return self._layout.name

    @property
    def directory(self) -> str:
        """The directory holding the queue's files."""
        return self._layout.directory

    # ------------------------------------------------------------------ sync / purge / stats

    async def sync(self) -> None:
        """fsync the data and store the meta file now, with every put accepted so far
        (and the empty-message marker, if an empty message was put).

        Raises DiskQueueError if the fsync, the marker or a ``put_nowait`` batch
        since the last ``sync()`` failed; QueueClosed if the queue is closed.
        """
        e = self._e
        await e.request_sync()
        err = e.take_write_error()
        if err is not None:
            raise err
        await self._empties.ensure_if_wanted()

    async def purge(self) -> None:
        """Drop every message not yet taken (go-diskqueue's ``Empty()``).

        Messages put before the call are dropped, even if still pending; later
        puts are kept. The segment files are deleted; the empty-message marker
        (``NAME.diskqueue.empty``) is kept.

        Raises QueueClosed if the queue is closed, DiskQueueError on I/O errors.
        """
        e = self._e
        await e.request_purge()
        e.wake_all_putters()

    def statistics(self) -> Statistics:
        """A frozen snapshot of positions, depth and counters."""
        return self._e.statistics()

    # ------------------------------------------------------------------ the ack layer's API
    # An AckQueue (aiodiskqueue.ack) runs a DiskQueue as its data queue and takes messages
    # in batches, gives back those it could not deliver, and stores the meta only in its
    # own commits. These methods are for it alone: not public, no compatibility promise.

    @classmethod
    def _with_options(cls, directory: str | os.PathLike[str], name: str,
                      opts: Options, role: str = "both") -> DiskQueue:
        """A queue made with options already checked (derived from the AckQueue's own),
        opened whole or as ``role``.

        Raises ValueError for an unknown role.
        """
        q = cls.__new__(cls)
        q._setup(directory, name, opts, role)
        return q

    def _n_ready(self) -> int:
        """Messages read ahead into memory: that many ``get_nowait()`` calls succeed."""
        return len(self._e.ready)

    def _take_more(self, out: list[bytes], max_items: int) -> None:
        """Append up to ``max_items`` more ready messages to ``out``, with the bookkeeping
        of that many ``get_nowait()`` calls in one step.

        ``out`` holds only messages taken in the same step (the first by
        ``get_nowait()``), not yet handed to anyone else.
        """
        self._e.take_more(out, max_items)

    def _untake(self, payloads: list[bytes]) -> None:
        """Give back the last ``payloads`` taken, in order, with nothing taken since: the
        next ``get_nowait()`` returns the first of them again."""
        self._e.untake(payloads)

    async def _wait_ready(self) -> None:
        """Wait until ``get_nowait()`` has a message (or raises what ``get()`` would), taking
        nothing: for a reader that waits on several queues at once (a queue group's
        consumer). Cancelling it leaves the queue unchanged.
        """
        await self._e.wait_ready()

    def _hold_meta(self) -> None:
        """Close without storing a meta file: the one on disk stays as it is.

        For a layer that keeps its own record of what was taken and could not store it
        (a meta past those records would lose them on the next open). A consumer role
        holds its meta the same way; a producer raises RoleError (it stores no read
        position).
        """
        self._e.hold_meta()


__all__ = ["DiskQueue", "DiskQueueError"]
