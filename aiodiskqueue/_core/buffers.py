"""The in-memory side of an open queue, shared by the API and the ioLoop.

:class:`QueueBuffers` holds what is accepted and not yet written (``pending``),
what is read ahead and not yet taken (``ready``), the counts that tie them, and
the futures that callers and the ioLoop wait on. The bookkeeping of a put and a
take are its methods: :class:`~aiodiskqueue.DiskQueue` calls them and writes no
field itself, so one class keeps ``qsize() == depth + unwritten`` true.

:class:`~aiodiskqueue._core.engine.Engine` is its subclass: the task that moves
the buffers to and from disk. Nothing here does I/O or blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from typing import Any

from .._format.codec import HEADER_SIZE
from .._format.layout import Layout
from .._format.meta import Meta
from .._format.scan import Record
from ..errors import (
    CorruptionError,
    DiskQueueError,
    MessageSizeError,
    QueueClosed,
    QueueEmpty,
    QueuePermissionError,
)
from .options import MiB, Options, Statistics
from .position import Runs, Stretch


class Lifecycle(enum.Enum):
    """Life cycle of a queue object."""

    NEW = "new"
    OPEN = "open"
    SHUTDOWN = "shutdown"  # no more puts; gets drain what is left
    CLOSING = "closing"
    CLOSED = "closed"
    BROKEN = "broken"  # the engine failed; every call raises


# The members the per-call paths compare with, as module constants (here and in queue.py):
# a member looked up through its class costs ~0.1 us on Python 3.11.
QUEUE_OPEN = Lifecycle.OPEN
QUEUE_SHUTDOWN = Lifecycle.SHUTDOWN

# At most this many takes under one quota: a quota sized at the mean message size may
# run past the low-water mark when sizes vary, and never by more than this.
GRANT_MAX = 1024


def wake(fut: asyncio.Future[Any] | None) -> None:
    """Resolve ``fut`` with None unless it is None or already done."""
    if fut is not None and not fut.done():
        fut.set_result(None)


def describe_error(exc: BaseException) -> str:
    """A short text for ``exc``: for an OSError its message, errno name and file."""
    if isinstance(exc, QueuePermissionError):
        return str(exc)  # names the file, its mode and owner
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f" on {exc.filename}" if exc.filename else ""
        return f"{exc.strerror} ({name}){where}"
    if isinstance(exc, DiskQueueError) and isinstance(exc.__cause__, OSError):
        return describe_error(exc.__cause__)
    return repr(exc)


def broken_error(name: str, exc: BaseException) -> DiskQueueError:
    """The error for a call on queue ``name``, broken by ``exc``."""
    if isinstance(exc, QueuePermissionError):  # still a PermissionError, for the caller
        denied = QueuePermissionError(
            exc.path, exc.mode, exc.uid, exc.gid,
            f"queue {name!r} is broken: {exc}; close it and open it again once this "
            "process may read the file")
        denied.__cause__ = exc
        return denied
    err = DiskQueueError(
        f"queue {name!r} is broken: {describe_error(exc)}; nothing more is "
        "written or read through this queue object. What was stored before stays on "
        "disk: close it and open the queue again once the cause is fixed (for "
        "example, the filesystem is writable again or has free space)")
    err.__cause__ = exc
    return err


def fail(waiters: list[asyncio.Future[None]], exc: BaseException) -> None:
    """Fail every waiter that is not done yet with ``exc``."""
    for w in waiters:
        if not w.done():
            w.set_exception(exc)


def succeed(waiters: list[asyncio.Future[None]]) -> None:
    """Resolve every waiter that is not done yet."""
    for w in waiters:
        if not w.done():
            w.set_result(None)


class QueueBuffers:
    """Accepted puts, read-ahead records, their counts and the waiters of one queue."""

    def __init__(self, layout: Layout, opts: Options) -> None:
        # The take quota (see take): ready messages the next takes may hand out with no
        # check but this count. While one is out, depth and gets lag by the messages
        # taken under it (_granted - quota); their properties add that in, and setting
        # either, or a change of what a grant assumed, ends it (settle). The write paths
        # add to _depth directly: a grant assumes nothing about depth.
        self.quota = 0
        self._granted = 0
        self._depth = 0
        self._gets = 0
        self._refill_at = -1
        self.layout = layout
        self.opts = opts
        self.min_size = opts.min_msg_size
        self.max_size = opts.max_msg_size
        self.sync_every = opts.sync_every
        self.maxsize = opts.maxsize
        self.state = Lifecycle.NEW
        self.shutdown_immediate = False
        self.error: BaseException | None = None  # why the queue is BROKEN
        self.write_error: DiskQueueError | None = None  # a put_nowait batch that failed

        # Write side: accepted, not yet written. ``unwritten`` also counts the batch in flight.
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.put_waiters: list[asyncio.Future[None]] = []
        self.unwritten = 0
        self.write_at = (0, 0)

        # Read side: read ahead, not yet taken: payloads alone; ``runs`` knows where they
        # lie on disk, and so the consumer position (see consumer_at).
        self.ready: deque[bytes] = deque()
        self.ready_bytes = 0  # payload bytes in ready
        self.runs = Runs()
        # The next read goes out once half of the read-ahead is taken, or 1 MiB of it if
        # that comes first: a consumer of get_many() takes ready messages in 0.1-0.2 us
        # each, so half of 4 MiB lasted less than the read of the next 2 MiB, and it ran
        # dry at each one. (A small read-ahead keeps half: a read per message or two
        # would cost more hops than it saves.)
        self.low_water = max(opts.read_buffer_bytes // 2, opts.read_buffer_bytes - MiB)
        self.read_at = (0, 0)  # read-ahead cursor
        self.epoch = 0  # bumped by purge: results of older hops are stale
        self.corruption: CorruptionError | None = None  # strict mode: reading stopped here

        self.getters: deque[asyncio.Future[None]] = deque()
        self.putters: deque[asyncio.Future[None]] = deque()  # blocked by maxsize
        self.sync_waiters: list[asyncio.Future[None]] = []
        self.purge_waiters: list[asyncio.Future[None]] = []
        # Messages written or taken since the last sync round started. Whatever changes
        # it but a take calls sync_counted() after.
        self.since_sync = 0
        # Messages a take has popped and not yet returned to its caller (count, payload
        # bytes): a meta stored meanwhile leaves them unconsumed (see stored_at).
        self.handing = 0
        self.handing_bytes = 0

        self.puts = 0
        self.syncs = 0
        self.bad_files = 0
        self.bytes_on_disk = 0
        self.recovered = 0

        # What the ioLoop sleeps on between hops.
        self.put_req: asyncio.Future[None] | None = None
        self.sync_req: asyncio.Future[None] | None = None
        self.purge_req: asyncio.Future[None] | None = None
        self.exit_req: asyncio.Future[None] | None = None
        self.read_slot: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.native_lane = False  # appends go to the native write lane

    def kick(self) -> bool:
        """A put landed in an empty pending batch (the engine may send it at once). True
        if the engine took care of the batch: the ioLoop need not wake."""
        return False

    def write_one(self, data: bytes, size: int, waiter: asyncio.Future[None]) -> bool:
        """Write one awaited put (``size`` bytes as a record) from ``put()`` itself, if
        the engine lets a lone producer do that now (``_direct_left``); False if not (the
        put takes the usual way). ``waiter`` is done when the write is."""
        return False

    def refill(self) -> None:
        """The ready messages fell to the low-water mark while more wait on disk."""
        self.refill_at = -1
        wake(self.read_slot)

    # ------------------------------------------------------------------ counters

    @property
    def depth(self) -> int:
        """Messages written and not yet taken (ready messages included)."""
        return self._depth - self._granted + self.quota

    @depth.setter
    def depth(self, value: int) -> None:
        self.settle()
        self._depth = value

    @property
    def gets(self) -> int:
        """Messages taken since the queue was opened."""
        return self._gets + self._granted - self.quota

    @gets.setter
    def gets(self, value: int) -> None:
        self.settle()
        self._gets = value

    def sync_counted(self) -> None:
        """``since_sync`` changed other than by a take (writes counted, a round started):
        end a take quota whose takes would now include the one that makes a sync round
        due, which must run the checks."""
        since = self.since_sync
        if self.quota and since < self.sync_every <= since + self.quota:
            self.settle()

    @property
    def refill_at(self) -> int:
        """take() sets the read slot once ready_bytes falls to this; -1 while no armed
        slot waits (the busy engine checks for reads after every hop itself)."""
        return self._refill_at

    @refill_at.setter
    def refill_at(self, value: int) -> None:
        if value > self._refill_at:
            self.settle()  # a quota granted before did not stop at this mark
        self._refill_at = value

    def settle(self) -> None:
        """End the take quota: the counters take in the messages taken under it. Called
        by every change to what a grant assumed (the counters, the low-water mark, the
        state, a parked putter, messages leaving or joining the front of ``ready``).

        A reader on another thread (``statistics()`` from a metrics scrape) that runs
        between its steps may see depth and gets off by the quota's takes for
        that moment, as it may see a batch between depth and unwritten."""
        k = self._granted - self.quota
        self.quota = self._granted = 0
        if k:
            self._depth -= k
            self._gets += k

    def _grant(self) -> None:
        """Let the next takes skip every check but the quota: as many as can come before
        one of them has something to do (see take)."""
        ready = self.ready
        n = len(ready)
        if not n or self.putters or self.state is not QUEUE_OPEN:
            return
        to_sync = self.sync_every - self.since_sync
        if 0 < to_sync <= n:
            n = to_sync - 1  # the take that makes a round due goes the checked way
        if self._refill_at >= 0:
            # Takes that leave more than the low-water mark, at the ready messages'
            # mean size (rounded up); the checked take after them looks at the bytes.
            size = max(1, -(-self.ready_bytes // len(ready)))
            n = min(n, (self.ready_bytes - self._refill_at - 1) // size)
        if n > 0:
            self.quota = self._granted = min(n, GRANT_MAX)

    # ------------------------------------------------------------------ size and state

    def qsize(self) -> int:
        """Messages accepted and not yet taken."""
        return self.depth + self.unwritten

    def consumer_at(self) -> tuple[int, int]:
        """The consumer position: ``(file_num, offset)`` just past the last message taken."""
        ready = self.ready
        return self.runs.at(len(ready), self.ready_bytes + HEADER_SIZE * len(ready))

    def stored_at(self) -> tuple[int, int]:
        """The consumer position a meta stored now holds: :meth:`consumer_at` less the
        messages a take is handing out (popped, not yet returned). A round that a take
        starts runs beside the caller on another thread: were the caller killed before
        it had them, or while it handles them without an await, they must come again."""
        n = len(self.ready) + self.handing
        return self.runs.at(n, self.ready_bytes + self.handing_bytes + HEADER_SIZE * n)

    def add_ready(self, batch: list[Record] | Stretch, payload_bytes: int) -> None:
        """Records read or handed over (``payload_bytes`` of payloads) join the
        read-ahead: a :class:`Stretch`, or ``(payload, file_num, end)`` records."""
        if isinstance(batch, Stretch):
            self.runs.add(batch.file_num, batch.start, batch.end, len(batch.payloads),
                          len(self.ready))
            self.ready.extend(batch.payloads)
        else:
            self.ready.extend(self.runs.add_records(batch, len(self.ready)))
        self.ready_bytes += payload_bytes

    def closed_error(self) -> DiskQueueError:
        """The error for a call on a queue that is not open."""
        name = self.layout.name
        if self.state is Lifecycle.BROKEN:
            assert self.error is not None
            return broken_error(name, self.error)
        if self.state is Lifecycle.NEW:
            return QueueClosed(f"queue {name!r} is not open yet")
        if self.state is QUEUE_SHUTDOWN:
            return QueueClosed(f"queue {name!r} is shut down")
        return QueueClosed(f"queue {name!r} is closed")

    def landed(self, n: int, waiters: list[asyncio.Future[None]], at: tuple[int, int],
               handoff: list[Record] | Stretch | None, handoff_bytes: int, stale: bool,
               error: DiskQueueError | None = None) -> None:
        """``n`` messages are written up to ``at``: the one path of a finished write, from
        any writer. Count them, hand ``handoff`` to the reader, resolve their ``waiters`` or
        fail them with ``error`` (not known to be durable); a ``stale`` batch (purged since)
        is neither counted nor handed over."""
        self.write_at = at
        self.unwritten -= n
        if not stale:
            self._depth += n  # a take quota stays: it assumes nothing about depth
            if handoff is not None:
                self.add_ready(handoff, handoff_bytes)
                self.read_at = at
        if error is None:
            succeed(waiters)
        else:
            fail(waiters, error)

    def wake_waiters(self) -> None:
        """Wake as many put() calls blocked on maxsize as there is room for, and get() calls
        as messages are ready: the one place a waiter is woken for room or a message."""
        putters = self.putters
        if putters:
            room = self.maxsize - self.qsize()
            while putters and room > 0:
                w = putters.popleft()
                if not w.done():  # a cancelled one takes no room
                    w.set_result(None)
                    room -= 1
        getters, ready = self.getters, self.ready
        if getters and ready:
            for _ in range(min(len(ready), len(getters))):
                wake(getters.popleft())

    def wake_all_getters(self) -> None:
        """Wake every blocked get() so it can see a state change."""
        while self.getters:
            wake(self.getters.popleft())

    def wake_all_putters(self) -> None:
        """Wake every put() blocked on maxsize so it can see a state change."""
        while self.putters:
            wake(self.putters.popleft())

    def shutdown(self, immediate: bool) -> None:
        """Refuse new puts; with ``immediate`` also new and blocked gets."""
        self.settle()
        if self.state is QUEUE_OPEN:
            self.state = QUEUE_SHUTDOWN
        self.shutdown_immediate = self.shutdown_immediate or immediate
        self.wake_all_getters()
        self.wake_all_putters()

    def begin_close(self) -> bool:
        """Move an open or shut-down queue to CLOSING and wake every waiter.

        Returns True if the ioLoop was asked to exit now. A queue never opened is
        just marked CLOSED.
        """
        if self.state is Lifecycle.NEW:
            self.state = Lifecycle.CLOSED
        if self.state not in (QUEUE_OPEN, QUEUE_SHUTDOWN):
            return False
        self.settle()
        self.state = Lifecycle.CLOSING
        self.wake_all_getters()
        self.wake_all_putters()
        wake(self.exit_req)
        return True

    def statistics(self) -> Statistics:
        """A frozen snapshot of positions, depth and counters."""
        read_file, read_pos = self.consumer_at()
        return Statistics(
            depth=self.qsize(),
            read_file_num=read_file,
            read_pos=read_pos,
            write_file_num=self.write_at[0],
            write_pos=self.write_at[1],
            bad_files=self.bad_files,
            bytes_on_disk=self.bytes_on_disk,
            puts=self.puts,
            gets=self.gets,
            syncs=self.syncs,
            ready=len(self.ready),
            pending_writes=self.unwritten,
            recovered=self.recovered,
            write_path="native" if self.native_lane else "python",
        )

    # ------------------------------------------------------------------ put

    def check_put(self, n: int) -> None:
        """Raise MessageSizeError for a size out of bounds, the closed error if not open."""
        if n < self.min_size or n > self.max_size:
            raise MessageSizeError(n, self.min_size, self.max_size)
        if self.state is not QUEUE_OPEN:
            raise self.closed_error()

    def accept(self, datas: list[bytes], nbytes: int,
               waiter: asyncio.Future[None] | None = None) -> None:
        """Add messages (``nbytes`` as records) and their waiter, if any, to the pending
        batch. If the batch was empty, wake the ioLoop, or let the engine send it to
        the write lane at once (a busy ioLoop looks at it after its hop anyway)."""
        was_empty = not self.pending
        self.pending.extend(datas)
        self.pending_bytes += nbytes
        self.unwritten += len(datas)
        self.puts += len(datas)
        if waiter is not None:
            self.put_waiters.append(waiter)
        if was_empty:
            if self.native_lane and self.kick():
                return
            pr = self.put_req
            if pr is not None and not pr.done():
                pr.set_result(None)

    async def wait_not_full(self) -> None:
        """Wait while the queue is at ``maxsize`` and open."""
        while self.depth + self.unwritten >= self.maxsize and self.state is QUEUE_OPEN:
            self.settle()  # the takes must see a parked putter
            await self._park(self.putters, lambda: self.depth + self.unwritten < self.maxsize)

    async def _park(self, waiters: deque[asyncio.Future[None]],
                    room: Callable[[], bool]) -> None:
        """Wait on a new future in ``waiters`` until woken.

        A waiter only wakes its task and carries nothing, so cancelling it loses no
        message; a wake-up it got but will not use goes to the next waiter while
        ``room()`` says there is something for it.
        """
        fut = self.loop.create_future()  # type: ignore[union-attr]
        waiters.append(fut)
        try:
            await fut
        except BaseException:
            fut.cancel()
            with contextlib.suppress(ValueError):
                waiters.remove(fut)
            if fut.done() and not fut.cancelled() and waiters and room():
                w = waiters.popleft()
                if not w.done():
                    w.set_result(None)
            raise

    # ------------------------------------------------------------------ take

    def take(self) -> bytes:
        """Remove and return the oldest ready message (``get_nowait()``).

        Raises QueueEmpty if none is ready, CorruptionError where strict reading
        stopped, the closed error if the queue is closed or shut down and drained.
        """
        # Under a quota (granted by a checked take, see _grant) the message is ready, the
        # queue open, and no take before the quota ends has anything to do but pop it and
        # count it toward the next sync round: depth and gets catch up when the quota
        # ends (settle).
        q = self.quota
        if q:
            self.quota = q - 1
            payload = self.ready.popleft()
            self.ready_bytes -= len(payload)
            self.since_sync += 1
            return payload
        return self._take_checked()

    def _take_checked(self) -> bytes:
        """:meth:`take` with every check, then a quota for the takes after it."""
        self.settle()
        ready = self.ready
        if not ready or self.state is not QUEUE_OPEN:
            self._may_take()
        payload = ready.popleft()
        self.ready_bytes = left = self.ready_bytes - len(payload)
        self._depth -= 1
        self._gets += 1
        self.since_sync = since = self.since_sync + 1
        # The sync round is asked for once, where since_sync reaches sync_every: the
        # ioLoop checks since_sync itself whenever it runs, and a consumer taking ready
        # messages does not let it run until the buffer is empty.
        if (left <= self.refill_at or since == self.sync_every or self.putters
                or self.state is not QUEUE_OPEN):
            self.handing, self.handing_bytes = 1, len(payload)
            try:
                self._after_take()
            finally:
                self.handing = self.handing_bytes = 0
        self._grant()
        return payload

    def _may_take(self) -> None:
        """Raise what :meth:`take` raises unless a ready message may be taken now (the
        queue is open, or shut down and draining)."""
        if not self.ready:
            if self.corruption is not None:
                raise self.corruption
            if self.state is QUEUE_OPEN and not self.shutdown_immediate:
                raise QueueEmpty()
            if self.state is QUEUE_SHUTDOWN and not self.shutdown_immediate and self.qsize():
                raise QueueEmpty()
            raise self.closed_error()
        if self.state is not QUEUE_OPEN and (self.shutdown_immediate
                                             or self.state is not QUEUE_SHUTDOWN):
            raise self.closed_error()

    def take_more(self, out: list[bytes], max_items: int) -> None:
        """Append up to ``max_items`` more ready messages to ``out`` in one step: the
        same bookkeeping as that many ``take()`` calls. ``out`` holds only messages
        taken in the same step, not yet returned to the caller."""
        ready = self.ready
        k = min(max_items, len(ready))
        if k <= 0:
            return
        self.settle()
        taken = list(starmap(ready.popleft, repeat((), k)))  # a loop in C: half the cost
        out.extend(taken)
        nbytes = sum(map(len, taken))
        self.ready_bytes -= nbytes
        self._depth -= k
        self._gets += k
        self.since_sync += k
        # out holds the messages taken in this same step (the first by take()): in hand.
        self.handing, self.handing_bytes = len(out), nbytes + sum(map(len, out[:-k]))
        try:
            self._after_take()
        finally:
            self.handing = self.handing_bytes = 0

    def untake(self, payloads: list[bytes]) -> None:
        """Put back the last ``payloads`` taken, in order, with nothing taken since: the
        bookkeeping of that many takes undone (the consumer position follows)."""
        k = len(payloads)
        if not k:
            return
        self.settle()
        self.ready.extendleft(reversed(payloads))
        self.ready_bytes += sum(map(len, payloads))
        self._depth += k
        self._gets -= k
        self.since_sync -= k

    def _after_take(self) -> None:
        """Wake whoever waits on room or on a read: the rare part of taking messages."""
        if self.ready_bytes <= self.refill_at:
            self.refill()
        if self.since_sync >= self.sync_every:
            wake(self.sync_req)
        if self.putters:
            self.wake_waiters()
        if self.state is QUEUE_SHUTDOWN and not self.qsize():
            self.wake_all_getters()  # drained: blocked getters raise QueueClosed now

    async def wait_ready(self) -> None:
        """Wait until a message is ready to take.

        Cancelling it leaves the queue unchanged: a waiter only wakes the task.
        Raises what ``take()`` raises when nothing will become ready.
        """
        while not self.ready:
            if self.corruption is not None:
                raise self.corruption
            if self.state is not QUEUE_OPEN and (
                self.state is not QUEUE_SHUTDOWN or self.shutdown_immediate or not self.qsize()
            ):
                raise self.closed_error()
            await self._park(self.getters, lambda: bool(self.ready))

    # ------------------------------------------------------------------ sync / purge

    def request_sync(self) -> asyncio.Future[None]:
        """A future resolved after the next sync round; wakes the ioLoop for it."""
        if self.state not in (QUEUE_OPEN, QUEUE_SHUTDOWN):
            raise self.closed_error()
        fut: asyncio.Future[None] = self.loop.create_future()  # type: ignore[union-attr]
        self.sync_waiters.append(fut)
        wake(self.sync_req)
        return fut

    def take_write_error(self) -> DiskQueueError | None:
        """The failure of a ``put_nowait`` batch since the last call, once."""
        err, self.write_error = self.write_error, None
        return err

    def request_purge(self) -> asyncio.Future[None]:
        """Drop every message accepted so far from memory and ask the ioLoop to delete
        the files; the future resolves when it has."""
        if self.state not in (QUEUE_OPEN, QUEUE_SHUTDOWN):
            raise self.closed_error()
        # Pending puts count as stored-then-purged: they return normally.
        dropped, waiters = self.pending, self.put_waiters
        self.pending, self.put_waiters, self.pending_bytes = [], [], 0
        self.unwritten -= len(dropped)
        succeed(waiters)
        self.settle()
        self.runs.reset(self.consumer_at())  # the dropped ready messages were not taken
        self.ready.clear()
        self.ready_bytes = 0
        self.epoch += 1
        fut: asyncio.Future[None] = self.loop.create_future()  # type: ignore[union-attr]
        self.purge_waiters.append(fut)
        wake(self.purge_req)
        return fut

    def purged(self, meta: Meta) -> None:
        """Take the positions of the meta a purge stored."""
        self.settle()
        self.ready.clear()
        self.ready_bytes = 0
        self.depth = 0
        self.runs.reset(meta.read)
        self.read_at = meta.read
        self.write_at = meta.write
