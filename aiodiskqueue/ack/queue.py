"""Reliable delivery: :class:`AckQueue`, NSQ's in-flight semantics kept across a crash.

Design
------
Three stores, all in the queue's directory:

* the data queue ``NAME`` (a :class:`~aiodiskqueue.DiskQueue`): messages put
  without a delay, in FIFO order; in ``format="nsq"`` each payload is nsqd's
  message layout, so a channel diskqueue written by nsqd opens as is;
* the ack log ``NAME.ack.%06d.log`` (:mod:`.log`, :mod:`.journal`):
  every message taken out of the data queue or put with a delay, with its due
  time and attempts, and a ``D`` record once it is finished or dead-lettered;
* the dead-letter queue ``NAME.dead`` (a DiskQueue), when ``max_attempts > 0``.

The crash window that matters is between taking a message out of the data
queue and recording it in the log: the data queue must never store a read
position past a message the log does not know. So the data queue runs with its
own syncing switched off and stores its position only in a *commit*, which
(1) stops taking messages, (2) appends an ``H`` record with the data queue's read
position and the number of messages taken so far (``fetch_seq``), (3) writes and
fsyncs the log, (4) syncs the data queue. Commits follow ``sync_every`` (puts,
takes, finishes and requeues count) and ``sync_interval``, like the core.

Between commits the log runs ahead of the data queue: records are written as
soon as the log's I/O thread is free, in the order of the takes. On open, the
data queue's messages up to the last commit's position, then ``fetch_seq -
commit_seq`` more, are exactly those the log accounts for (alive, or finished);
they are skipped, the rest of the data queue is new. So a SIGKILL loses nothing
whichever of the two stores was written last, and anything the log holds (a
finish, a requeue's due time, a delivery's attempt) survives it even before
the next commit. With ``sync_every=1`` a finish, requeue or deferred put waits
only for the log's fsync; a put of a ready message waits for a commit (the data
queue's fsync).

A message taken and finished before its ``E`` record was written never has its
body written twice: its ``D`` record carries the ``fetch_seq`` instead. The
log's space is reclaimed by deleting and compacting whole segments (see
:mod:`.journal`). In memory: messages in flight, the deadline heap, and an
index of deferred entries (their bodies stay on disk until due).

Deadlines: one timer (``Clock.call_at``) armed for the earliest of the in-flight
deadline heap and the deferred heap; items are invalidated lazily and a heap is
rebuilt when more than half of it is stale. ``attempts`` follow nsqd: a record
stores the deliveries so far and a delivery reports one more.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import warnings
from collections import deque
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, Literal, final

from .._core.iothread import IOThread
from .._format import nsq
from ..errors import (
    DiskQueueError,
    MessageNotInFlight,
    MessageSizeError,
    QueueClosed,
    QueueEmpty,
)
from ..queue import DiskQueue
from .clock import Clock, LoopClock, TimerHandle
from .codec import IdGenerator, head_record
from .heap import LazyHeap
from .journal import Entry, Journal, LogState, State
from .log import AckLog, Recovered
from .options import AckOptions, AckStatistics, as_bytes, number

__all__ = ["AckQueue", "AckStatistics", "Message"]

log = logging.getLogger("aiodiskqueue")

_NO_SYNC_EVERY = 2**62  # the data queue stores its position only in our commits
_NO_SYNC_INTERVAL = 1e9
_LOAD_BATCH = 256


class _QState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class _MState(enum.Enum):
    IN_FLIGHT = "in flight"
    FINISHED = "already finished"
    REQUEUED = "already requeued"
    TIMED_OUT = "timed out and requeued"
    DEAD = "dead-lettered"


@final
class Message:
    """One delivery of a message: finish it, requeue it or touch it while it is in flight.

    ``id`` (16 hex characters), ``body``, ``attempts`` (deliveries so far,
    including this one) and ``timestamp`` (ns since the epoch) are plain
    attributes. The timestamp is the put's with ``format="nsq"`` and for a
    deferred put; a raw data record carries none, so its id and timestamp are
    given when it is first taken out of the data queue (and kept from then on,
    once the ack log holds it).

    ``async with msg:`` finishes the message when the block succeeds. When the
    block raises an ``Exception`` the message is requeued with a backoff delay
    (:meth:`AckQueue.backoff`) and the exception is logged and suppressed, so an
    ``async for msg in q: async with msg: ...`` worker keeps going; catch it
    inside the block to handle it yourself. Cancellation and other
    ``BaseException`` requeue at once, without delay, and propagate.
    """

    __slots__ = (
        "_deadline",
        "_delivered_at",
        "_entry",
        "_gen",
        "_q",
        "_state",
        "_timeout",
        "attempts",
        "body",
        "id",
        "timestamp",
    )

    def __init__(self, q: AckQueue, entry: Entry, now: float, timeout: float) -> None:
        self.id: str = entry.msg_id.decode("latin-1")
        self.body: bytes = entry.body or b""
        self.attempts: int = entry.attempts
        self.timestamp: int = entry.timestamp
        self._q = q
        self._entry = entry
        self._state = _MState.IN_FLIGHT
        self._delivered_at = now
        self._timeout = timeout
        self._deadline = now + timeout
        self._gen = 0

    @property
    def in_flight(self) -> bool:
        """True until the message is finished, requeued or timed out."""
        return self._state is _MState.IN_FLIGHT

    @property
    def deadline(self) -> float:
        """When the message times out, on the queue's clock (``Clock.monotonic``)."""
        return self._deadline

    async def finish(self) -> None:
        """NSQ FIN: the message is done and never delivered again.

        With ``sync_every=1`` returns once this is durable; otherwise it is
        durable at the next commit (and written to the OS within a hop).

        Raises MessageNotInFlight if the message is not in flight any more,
        QueueClosed if the queue was closed, DiskQueueError if the commit fails.
        """
        q = self._q
        q._finish(self)
        if q._sync_every == 1:
            await q._wait_log_sync()

    async def requeue(self, delay: float = 0.0) -> None:
        """NSQ REQ: put the message back, to be delivered again after ``delay`` seconds.

        Attempts are kept. With ``sync_every=1`` returns once this is durable.

        Raises ValueError if ``delay`` is negative or above ``max_delay``,
        MessageNotInFlight if the message is not in flight any more, QueueClosed
        if the queue was closed.
        """
        q = self._q
        q._requeue(self, delay)
        if q._sync_every == 1:
            await q._wait_log_sync()

    async def touch(self) -> None:
        """NSQ TOUCH: push the deadline out by the delivery's ``msg_timeout``.

        The new deadline is now + ``msg_timeout``, capped at the delivery time +
        ``max_msg_timeout``, as in nsqd.

        Raises MessageNotInFlight if the message is not in flight any more,
        QueueClosed if the queue was closed.
        """
        self._q._touch(self)

    async def __aenter__(self) -> Message:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool:
        failed = exc_type is not None and issubclass(exc_type, Exception)
        if failed:
            log.warning("message %s (attempt %d) failed; requeued", self.id, self.attempts,
                        exc_info=(exc_type, exc, tb))  # type: ignore[arg-type]
        if self._state is not _MState.IN_FLIGHT or self._q._state is not _QState.OPEN:
            if self._state is _MState.TIMED_OUT:
                log.warning("message %s timed out before its handler ended; it was "
                            "requeued and may be delivered again", self.id)
            return failed
        if exc_type is None:
            await self.finish()
        elif failed:
            await self.requeue(self._q.backoff(self.attempts))
        else:  # cancelled or interrupted: not the message's fault, no delay, no await
            self._q._requeue(self, 0.0)
        return failed

    def __repr__(self) -> str:
        return (f"<Message {self.id} attempts={self.attempts} {self._state.value} "
                f"body={len(self.body)} bytes>")


@final
class AckQueue:
    """A persistent queue with NSQ's at-least-once delivery, kept across a crash.

    ``get()`` hands out a :class:`Message` that is *in flight* until it is
    finished, requeued or touched; one not finished by its deadline
    (``msg_timeout``) is requeued automatically. ``put(body, delay=...)``
    publishes now or later (NSQ DPUB). Open with ``async with AckQueue(...)`` or
    ``await AckQueue.open(...)``.

    Durability: every message whose ``put()`` returned and that was not
    finished is delivered again after a crash (in-flight ones at once, deferred
    ones when due). A message finished before the last commit is not delivered
    again; with ``sync_every=1`` ``finish()`` returns only once durable.

    Options (keyword-only, checked at once): ``msg_timeout`` (> 0 s),
    ``max_msg_timeout`` (>= msg_timeout, cap for ``touch``), ``max_delay``
    (bound for put and requeue delays), ``max_in_flight`` (>= 1),
    ``max_attempts`` (0 = unlimited, else deliveries before dead-lettering to
    ``NAME.dead``), ``format`` (``"raw"``: the payload is the body; ``"nsq"``:
    nsqd's message layout), ``clock`` (for tests), ``log_segment_bytes``, and
    the :class:`~aiodiskqueue.DiskQueue` options.

    Raises TypeError or ValueError for a bad option.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str,
        *,
        msg_timeout: float = 60.0,
        max_msg_timeout: float = 900.0,
        max_delay: float = 3600.0,
        max_in_flight: int = 1000,
        max_attempts: int = 0,
        format: Literal["raw", "nsq"] = "raw",
        clock: Clock | None = None,
        log_segment_bytes: int = 8 * 2**20,
        max_bytes_per_file: int = 100 * 2**20,
        min_msg_size: int = 0,
        max_msg_size: int = 2**20,
        sync_every: int = 2500,
        sync_interval: float = 2.0,
        maxsize: int = 0,
        read_buffer_bytes: int = 4 * 2**20,
        write_buffer_bytes: int = 16 * 2**20,
    ) -> None:
        self._name = name
        self._directory = os.fspath(directory)
        self._state = _QState.NEW
        o = AckOptions.check(
            msg_timeout=msg_timeout, max_msg_timeout=max_msg_timeout, max_delay=max_delay,
            max_in_flight=max_in_flight, max_attempts=max_attempts, format=format,
            log_segment_bytes=log_segment_bytes, max_bytes_per_file=max_bytes_per_file,
            min_msg_size=min_msg_size, max_msg_size=max_msg_size, sync_every=sync_every,
            sync_interval=sync_interval, maxsize=maxsize, read_buffer_bytes=read_buffer_bytes,
            write_buffer_bytes=write_buffer_bytes)
        self._msg_timeout = o.msg_timeout
        self._max_msg_timeout = o.max_msg_timeout
        self._max_delay = o.max_delay
        self._max_in_flight = o.max_in_flight
        self._max_attempts = o.max_attempts
        self._nsq = o.nsq
        self._format = o.format
        self._segment_bytes = o.log_segment_bytes
        self._sync_every = o.core.sync_every
        self._sync_interval = float(o.core.sync_interval)
        self._min_size = o.min_size
        self._max_size = o.core.max_msg_size
        common: dict[str, Any] = {"max_bytes_per_file": max_bytes_per_file,
                                  "min_msg_size": self._min_size, "max_msg_size": max_msg_size,
                                  "read_buffer_bytes": read_buffer_bytes,
                                  "write_buffer_bytes": write_buffer_bytes}
        self._data = DiskQueue(directory, name, sync_every=_NO_SYNC_EVERY,
                               sync_interval=_NO_SYNC_INTERVAL, maxsize=maxsize, **common)
        self._dead_q: DiskQueue | None = None
        if self._max_attempts:
            self._dead_q = DiskQueue(directory, name + ".dead", sync_every=sync_every,
                                     sync_interval=sync_interval, **common)
        self._clock_arg = clock
        self._ids = IdGenerator()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

        self._in_flight: dict[int, Message] = {}
        self._ready: deque[Entry] = deque()
        self._need_load: deque[Entry] = deque()
        self._dead: list[Entry] = []
        self._deadlines: LazyHeap[Message] = LazyHeap(
            lambda m, gen: m._state is _MState.IN_FLIGHT and m._gen == gen)
        self._dues: LazyHeap[Entry] = LazyHeap(
            lambda e, ver: e.state is State.DEFERRED and e.ver == ver)
        self._n_deferred = 0
        self._timer: TimerHandle | None = None
        self._timer_when: float | None = None

        self._getters: deque[asyncio.Future[None]] = deque()
        self._sync_waiters: list[asyncio.Future[None]] = []  # need a commit
        self._log_waiters: list[asyncio.Future[None]] = []  # need the log fsynced
        # sync_every=1: entries requeued for now, held back until the log sync that
        # records their last delivery, so attempts seen by consumers never go back
        # after a crash. (entry, its ver when held)
        self._held: list[tuple[Entry, int]] = []
        self._purge_waiters: list[asyncio.Future[None]] = []
        self._wake: asyncio.Future[None] | None = None
        self._fetch_task: asyncio.Task[None] | None = None
        self._paused = False
        self._fetch_seq = 0
        self._ops = 0
        self._commit_at = 0.0
        self._dead_dirty = False

        self._finished = 0
        self._requeued = 0
        self._timed_out = 0
        self._dead_lettered = 0
        self._delivered = 0
        self._commits = 0
        self._log_syncs = 0

    # ------------------------------------------------------------------ life cycle

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], name: str,
                   **options: Any) -> AckQueue:
        """Open (creating if needed) the queue ``name`` in ``directory``.

        Raises QueueLocked if it is open elsewhere, DiskQueueError on I/O errors,
        TypeError or ValueError for a bad option.
        """
        q = cls(directory, name, **options)
        await q._start()
        return q

    async def __aenter__(self) -> AckQueue:
        if self._state is _QState.NEW:
            await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._clock: Clock = self._clock_arg or LoopClock(loop)
        await self._data.__aenter__()
        self._io: IOThread | None = None
        try:
            if self._dead_q is not None:
                await self._dead_q.__aenter__()
            self._io = IOThread(f"aiodiskqueue-ack-{self._name}")
            self._store = AckLog(self._directory, self._name, self._segment_bytes)
            try:
                rec: Recovered = await self._io.run(self._store.open)
            except OSError as exc:
                raise DiskQueueError(f"cannot open the ack log of {self._name!r} in "
                                     f"{self._directory!r}: {exc}") from exc
            await self._data.sync()  # the data queue's first meta, before any take
            await self._skip_logged(rec)
            self._fetch_seq = rec.fetch_seq
            self._journal = Journal(rec, self._segment_bytes)
            now, wall = self._clock.monotonic(), self._clock.time_ns()
            for e in sorted(self._journal.entries.values(), key=lambda e: e.key):
                if e.due_ns == 0:
                    e.state = State.LOADING
                    self._need_load.append(e)
                else:
                    self._defer(e, now + (e.due_ns - wall) / 1e9)
            self._state = _QState.OPEN
            await self._commit_now()
        except BaseException:
            self._state = _QState.CLOSED
            await self._close_stores()
            raise
        self._commit_at = loop.time() + self._sync_interval
        self._arm()
        self._task = loop.create_task(self._run(), name=f"aiodiskqueue-ack-{self._name}")

    async def _skip_logged(self, rec: Recovered) -> None:
        """Drop the data queue's messages that the log already accounts for."""
        d = self._data
        skip = rec.fetch_seq
        if rec.commit is not None:
            cseq, cfile, cpos = rec.commit
            skip = rec.fetch_seq - cseq
            st = d.statistics()
            while (st.read_file_num, st.read_pos) < (cfile, cpos) and d.qsize():
                await d.get()
                st = d.statistics()
        for _ in range(skip):
            if not d.qsize():
                log.warning("%s: the ack log has %d more take(s) than the data queue holds",
                            self._name, skip)
                break
            await d.get()

    async def aclose(self) -> None:
        """Write and commit what is pending, close the files; idempotent.

        Messages still in flight stay in the log and are delivered again after
        the next open. Blocked ``get()`` calls raise QueueClosed.
        """
        if self._task is None:
            if self._state is _QState.NEW:
                self._state = _QState.CLOSED
            return
        if self._state is _QState.OPEN:
            self._state = _QState.CLOSING
            self._wake_getters(len(self._getters))
            self._kick()
        await asyncio.shield(self._task)

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_state", None) in (_QState.OPEN, _QState.CLOSING):
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        return (f"<AckQueue {self._name!r} in {self._directory!r} state={self._state.value} "
                f"depth={self.qsize() if self._state is _QState.OPEN else '?'} "
                f"in_flight={len(self._in_flight)} deferred={self._n_deferred}>")

    # ------------------------------------------------------------------ put

    async def put(self, body: bytes | bytearray | memoryview, *, delay: float = 0.0) -> None:
        """Publish ``body``; with ``delay > 0`` it is delivered no earlier than that (NSQ DPUB).

        Returns once the message is written to the OS (``sync_every=1``: once
        durable). A deferred message keeps its due time across a restart. If
        the call is cancelled the message may still be stored.

        Raises TypeError for a non-bytes body, ValueError for a delay outside
        ``[0, max_delay]``, MessageSizeError for a size out of bounds,
        QueueClosed if the queue is not open, DiskQueueError (chained to the
        OSError) if a write fails: a deferred message is then kept in memory and
        written by the next successful hop, so it may still be delivered.
        """
        data = as_bytes(body)
        d = self._check_delay(delay)
        self._check_open()
        if d == 0.0:
            payload = nsq.encode(self._clock.time_ns(), 0, self._ids.next(), data) \
                if self._nsq else data
            await self._data.put(payload)
        else:
            size = len(data) + (nsq.HEADER_SIZE if self._nsq else 0)
            if size < self._min_size or size > self._max_size:
                raise MessageSizeError(size, self._min_size, self._max_size)
            wall = self._clock.time_ns()
            e = Entry(self._journal.new_key(), 0, wall + int(d * 1e9), 0, self._ids.next(),
                      wall, data)
            self._journal.add(e)
            self._defer(e, self._clock.monotonic() + d)
            self._arm()
            fut = self._journal.wait_written()
            self._kick()
            await fut
        self._count_op()
        if self._sync_every == 1:
            # A data record needs the data queue fsynced: a commit. A log entry
            # needs the log fsynced, nothing more.
            await (self._wait_commit() if d == 0.0 else self._wait_log_sync())

    async def put_many(self, bodies: Iterable[bytes | bytearray | memoryview], *,
                       delay: float = 0.0) -> None:
        """Publish every body, in order, as one batch (NSQ MPUB); all share ``delay``.

        Every body is checked first: if one is invalid, nothing is put.

        Raises as :meth:`put` does.
        """
        datas = [as_bytes(b) for b in bodies]
        d = self._check_delay(delay)
        self._check_open()
        extra = nsq.HEADER_SIZE if self._nsq else 0
        for data in datas:
            size = len(data) + extra
            if size < self._min_size or size > self._max_size:
                raise MessageSizeError(size, self._min_size, self._max_size)
        if not datas:
            return
        if d == 0.0:
            if self._nsq:
                now = self._clock.time_ns()
                datas = [nsq.encode(now, 0, self._ids.next(), b) for b in datas]
            await self._data.put_many(datas)
        else:
            wall = self._clock.time_ns()
            due = wall + int(d * 1e9)
            when = self._clock.monotonic() + d
            for data in datas:
                e = Entry(self._journal.new_key(), 0, due, 0, self._ids.next(), wall, data)
                self._journal.add(e)
                self._defer(e, when)
            self._arm()
            fut = self._journal.wait_written()
            self._kick()
            await fut
        for _ in datas:
            self._count_op()
        if self._sync_every == 1:
            await (self._wait_commit() if d == 0.0 else self._wait_log_sync())

    def _check_delay(self, delay: object) -> float:
        d = number("delay", delay, positive=False)
        if d > self._max_delay:
            raise ValueError(f"delay must be <= max_delay={self._max_delay}, got {delay}")
        return d

    # ------------------------------------------------------------------ get

    def get_nowait(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver a message that is ready in memory, without waiting.

        ``msg_timeout`` as for :meth:`get`.

        Raises QueueEmpty if none is ready or ``max_in_flight`` is reached,
        QueueClosed if the queue is not open, ValueError for a bad ``msg_timeout``.
        """
        m = self._try_take(self._check_timeout(msg_timeout))
        if m is None:
            raise QueueEmpty()
        return m

    async def get(self, *, msg_timeout: float | None = None) -> Message:
        """Deliver the next message; it is in flight until finished, requeued or timed out.

        ``msg_timeout`` overrides the queue's for this delivery and its touches
        (as a client's IDENTIFY ``msg_timeout`` does in nsqd); it must be > 0 and
        at most ``max_msg_timeout``. Waits while nothing is ready or
        ``max_in_flight`` messages are out. Cancelling ``get()`` leaves the
        queue unchanged.

        Raises QueueClosed when the queue is closed, ValueError for a bad
        ``msg_timeout``.
        """
        timeout = self._check_timeout(msg_timeout)
        while True:
            m = self._try_take(timeout)
            if m is not None:
                return m
            fut = self._loop.create_future()
            self._getters.append(fut)
            self._kick()
            try:
                await fut
            except BaseException:
                fut.cancel()
                try:
                    self._getters.remove(fut)
                except ValueError:
                    pass
                # Woken but leaving: pass the wake-up on so nothing waits in vain.
                if fut.done() and not fut.cancelled():
                    self._wake_getters(1)
                raise

    async def get_many(self, max_items: int, *, msg_timeout: float | None = None
                       ) -> list[Message]:
        """Deliver between 1 and ``max_items`` messages, waiting for the first one only.

        Raises ValueError if ``max_items < 1``, otherwise as :meth:`get`.
        """
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"max_items must be an int >= 1, got {max_items!r}")
        out = [await self.get(msg_timeout=msg_timeout)]
        timeout = self._check_timeout(msg_timeout)
        while len(out) < max_items and (m := self._try_take(timeout)) is not None:
            out.append(m)
        return out

    def _check_timeout(self, msg_timeout: float | None) -> float:
        if msg_timeout is None:
            return self._msg_timeout
        t = number("msg_timeout", msg_timeout, positive=True)
        if t > self._max_msg_timeout:
            raise ValueError(f"msg_timeout must be <= max_msg_timeout={self._max_msg_timeout}, "
                             f"got {msg_timeout}")
        return t

    def __aiter__(self) -> AckQueue:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None

    def _try_take(self, timeout: float) -> Message | None:
        self._check_open()
        while len(self._in_flight) < self._max_in_flight:
            if self._ready:
                e = self._ready.popleft()
                if e.state is not State.READY:
                    continue
            elif not self._paused:
                try:
                    payload = self._data.get_nowait()
                except DiskQueueError:  # QueueEmpty: nothing read ahead yet
                    return None
                e = self._take(payload)
            else:
                return None
            m = self._deliver(e, timeout)
            if m is not None:
                return m
        return None

    def _take(self, payload: bytes) -> Entry:
        """A message just taken out of the data queue becomes a log entry."""
        self._fetch_seq += 1
        if self._nsq:
            ts, attempts, msg_id, body = nsq.decode(payload)
        else:
            ts, attempts, msg_id, body = self._clock.time_ns(), 0, self._ids.next(), payload
        e = Entry(self._journal.new_key(), self._fetch_seq, 0, attempts, msg_id, ts, body)
        self._journal.add(e)
        self._count_op()
        return e

    def _deliver(self, e: Entry, timeout: float) -> Message | None:
        n = e.attempts + 1
        if self._max_attempts and n > self._max_attempts:
            e.state = State.DEAD
            self._dead.append(e)
            self._kick()
            return None
        e.attempts = n
        e.due_ns = 0
        e.state = State.IN_FLIGHT
        e.ver += 1
        self._journal.update(e)
        now = self._clock.monotonic()
        m = Message(self, e, now, timeout)
        e.msg = m
        self._in_flight[e.key] = m
        self._deadlines.push(m._deadline, m, 0)
        if self._timer_when is None or m._deadline < self._timer_when:
            self._arm()
        self._delivered += 1
        self._kick()
        return m

    # ------------------------------------------------------------------ finish / requeue / touch

    def _check_msg(self, m: Message) -> Entry:
        if m._state is not _MState.IN_FLIGHT:
            raise MessageNotInFlight(m.id, m._state.value)
        if self._state is not _QState.OPEN:
            raise self._closed_error()
        return m._entry

    def _release(self, m: Message, state: _MState) -> Entry:
        e = self._check_msg(m)
        m._state = state
        del self._in_flight[e.key]
        e.msg = None
        self._trim_deadlines()
        self._count_op()
        self._wake_getters(1)
        return e

    def _trim_deadlines(self) -> None:
        self._deadlines.trim(len(self._in_flight))

    def _finish(self, m: Message) -> None:
        e = self._release(m, _MState.FINISHED)
        self._journal.done(e)
        self._finished += 1
        self._kick()

    def _requeue(self, m: Message, delay: float) -> None:
        d = self._check_delay(delay)
        e = self._release(m, _MState.REQUEUED)
        self._requeued += 1
        if self._max_attempts and e.attempts >= self._max_attempts:
            self._make_due(e)  # out of attempts: dead-lettered now, waiting is pointless
        elif d == 0.0 and self._sync_every == 1:
            self._held.append((e, e.ver))  # released by the next log sync or commit
        elif d == 0.0:
            self._make_due(e)
        else:
            e.due_ns = self._clock.time_ns() + int(d * 1e9)
            self._journal.update(e)
            self._defer(e, self._clock.monotonic() + d)
            self._arm()
        self._kick()

    def _touch(self, m: Message) -> None:
        self._check_msg(m)
        now = self._clock.monotonic()
        deadline = min(now + m._timeout, m._delivered_at + self._max_msg_timeout)
        if deadline != m._deadline:
            m._deadline = deadline
            m._gen += 1
            self._deadlines.push(deadline, m, m._gen)
            self._trim_deadlines()
            if self._timer_when is None or deadline < self._timer_when:
                self._arm()

    def backoff(self, attempts: int) -> float:
        """The requeue delay of ``async with msg`` after a failure.

        1 s after the first attempt, doubling with each attempt, capped at ``max_delay``.
        """
        return min(self._max_delay, 2.0 ** min(max(attempts - 1, 0), 40))

    # ------------------------------------------------------------------ due times and the timer

    def _defer(self, e: Entry, when: float) -> None:
        e.state = State.DEFERRED
        e.ver += 1
        self._n_deferred += 1
        self._dues.push(when, e, e.ver)
        if e.log_state is LogState.WRITTEN:
            e.body = None  # on disk: read back when due

    def _make_due(self, e: Entry) -> None:
        e.ver += 1
        if e.body is not None:
            self._make_ready(e)
        else:
            e.state = State.LOADING
            self._need_load.append(e)
            self._kick()

    def _make_ready(self, e: Entry) -> None:
        """A due entry with its body in memory: ready, or dead if out of attempts."""
        if self._max_attempts and e.attempts >= self._max_attempts:
            e.state = State.DEAD
            self._dead.append(e)
            self._kick()
            return
        e.state = State.READY
        self._ready.append(e)
        self._wake_getters(1)

    def _arm(self) -> None:
        """Arm the one timer for the earliest deadline or due time."""
        when = self._deadlines.first()
        due = self._dues.first()
        if due is not None and (when is None or due < when):
            when = due
        if when == self._timer_when:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_when = when
        if when is not None and self._state in (_QState.OPEN, _QState.NEW):
            self._timer = self._clock.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_when = None
        if self._state is not _QState.OPEN:
            return
        now = self._clock.monotonic()
        for m in self._deadlines.pop_due(now):
            m._state = _MState.TIMED_OUT
            e = m._entry
            del self._in_flight[e.key]
            e.msg = None
            self._timed_out += 1
            self._make_due(e)
            self._wake_getters(1)
        for e in self._dues.pop_due(now):
            self._n_deferred -= 1
            self._make_due(e)
        self._dues.trim(self._n_deferred)
        self._arm()

    # ------------------------------------------------------------------ the pump

    def _kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def _wake_getters(self, n: int) -> None:
        g = self._getters
        while n > 0 and g:
            w = g.popleft()
            if not w.done():
                w.set_result(None)
                n -= 1

    def _count_op(self) -> None:
        self._ops += 1
        if self._ops >= self._sync_every:
            self._kick()

    async def _wait_commit(self) -> None:
        self._check_open()
        fut = self._loop.create_future()
        self._sync_waiters.append(fut)
        self._kick()
        await fut

    async def _wait_log_sync(self) -> None:
        self._check_open()
        fut = self._loop.create_future()
        self._log_waiters.append(fut)
        self._kick()
        await fut

    async def sync(self) -> None:
        """Commit now: write and fsync the log, then sync the data queue.

        Raises QueueClosed if the queue is not open, DiskQueueError if it fails.
        """
        await self._wait_commit()

    def _commit_due(self) -> bool:
        # With sync_every=1 durability comes from the waiters: most need only
        # the log fsynced (finish, requeue, deferred put), a cheaper step.
        if self._sync_waiters or (self._sync_every > 1 and self._ops >= self._sync_every):
            return True
        return self._ops > 0 and self._loop.time() >= self._commit_at

    async def _run(self) -> None:
        try:
            while self._state is _QState.OPEN:
                if self._purge_waiters:
                    await self._purge()
                elif self._dead:
                    await self._dead_letter()
                elif self._commit_due():
                    await self._commit()
                elif self._log_waiters:
                    await self._log_sync()
                elif self._journal.pending or self._journal.waiters or self._want_load() \
                        or self._space_work():
                    await self._hop(False)
                else:
                    await self._idle()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("%s: ack queue pump failed", self._name)
                self._error = exc
        finally:
            await self._finish_close()

    def _want_load(self) -> bool:
        return bool(self._need_load) and len(self._ready) < max(_LOAD_BATCH, len(self._getters))

    def _space_work(self) -> bool:
        segs = self._journal.segs
        if len(segs) < 2:
            return False
        oldest = segs[min(segs)]
        if oldest.live == 0:
            return True
        total = sum(s.size for s in segs.values())
        return total > 2 * self._journal.live_bytes() + self._segment_bytes

    async def _idle(self) -> None:
        loop = self._loop
        self._wake = loop.create_future()
        waits: list[asyncio.Future[Any]] = [self._wake]
        if (self._getters and not self._ready and not self._paused
                and len(self._in_flight) < self._max_in_flight):
            if self._fetch_task is None or self._fetch_task.done():
                self._fetch_task = loop.create_task(self._fetch())
            waits.append(self._fetch_task)
        timer = None
        if self._ops > 0:
            timer = loop.call_at(self._commit_at, self._kick)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if timer is not None:
                timer.cancel()

    async def _fetch(self) -> None:
        payload = await self._data.get()
        # Same step as the take: the fetch_seq order is the data queue's order.
        self._make_ready(self._take(payload))

    async def _stop_fetch(self) -> None:
        t = self._fetch_task
        if t is not None:
            if not t.done():
                t.cancel()
            await asyncio.wait([t])
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, QueueClosed):
                    log.error("%s: taking from the data queue failed: %r", self._name, exc)
            self._fetch_task = None

    async def _hop(self, sync: bool) -> None:
        assert self._io is not None
        reads: list[Entry] = []
        while self._need_load and len(reads) < _LOAD_BATCH:
            e = self._need_load.popleft()
            if e.state is State.LOADING:
                reads.append(e)
        built = self._journal.build(sync, reads)
        if built is None:
            return
        try:
            res = await self._io.run(self._store.run, built.job)
        except OSError as exc:
            err = DiskQueueError(f"write to the ack log of {self._name!r} failed: {exc}")
            err.__cause__ = exc
            log.error("%s", err)
            self._journal.fail(built, err)
            self._need_load.extendleft(reversed(reads))
            if sync:
                raise err from exc
            await asyncio.sleep(min(1.0, self._sync_interval))  # back off before retrying
            return
        written, lost = self._journal.apply(built, res)
        if built.job.sync:
            self._log_syncs += 1
        for e in lost:
            log.error("%s: message %s lost: its ack log record is damaged", self._name, e.key)
            if e.state is State.DEFERRED:
                self._n_deferred -= 1
            self._journal.done(e)
        for e, payload in zip(built.reads, res.read_payloads, strict=True):
            if payload is None:
                if e.state is State.LOADING:
                    log.error("%s: message %s lost: its ack log record is damaged",
                              self._name, e.key)
                    self._journal.done(e)
                continue
            ts, _, msg_id, body = nsq.decode(payload)
            e.timestamp, e.msg_id, e.body = ts, msg_id, body
            if e.state is State.LOADING:
                self._make_ready(e)
        for e in written:
            if e.state is State.DEFERRED:
                e.body = None
        if self._ready:
            self._wake_getters(len(self._ready))

    async def _log_sync(self) -> None:
        """fsync the log with everything appended so far (not a commit: see the module doc).

        The data queue keeps its older position; on open the log's entries past
        the last commit are skipped in it by count, so this is enough to make a
        finish, requeue or deferred put durable.
        """
        waiters, self._log_waiters = self._log_waiters, []
        await self._durable_step(self._hop(True), waiters)

    async def _commit(self) -> None:
        waiters = self._sync_waiters + self._log_waiters
        self._sync_waiters, self._log_waiters = [], []
        await self._durable_step(self._commit_now(), waiters, "commit")

    async def _durable_step(self, step: Coroutine[Any, Any, None],
                            waiters: list[asyncio.Future[None]], what: str = "") -> None:
        """Run a log sync or commit, then settle its waiters and the held requeues.

        On success, requeued entries held for it become due; on failure they stay
        held for the next step and every waiter gets the error.
        """
        held, self._held = self._held, []
        try:
            await step
        except (DiskQueueError, OSError) as exc:
            if what:
                log.error("%s: %s failed: %s", self._name, what, exc)
            self._held[:0] = held
            for w in waiters:
                if not w.done():
                    w.set_exception(exc)
            return
        for e, ver in held:
            if e.ver == ver:  # not purged or otherwise moved on meanwhile
                self._make_due(e)
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _commit_now(self, resume: bool = True) -> None:
        """Stop taking, write and fsync the log with a head record, then sync the data queue.

        With ``resume=False`` taking stays stopped (the caller resumes it).
        """
        self._ops = 0
        self._commit_at = self._loop.time() + self._sync_interval
        self._paused = True
        try:
            await self._stop_fetch()
            st = self._data.statistics()
            self._journal.head(head_record(self._fetch_seq, self._fetch_seq, st.read_file_num,
                                           st.read_pos, self._journal.next_key))
            await self._hop(True)
            if self._dead_dirty and self._dead_q is not None:
                self._dead_dirty = False
                await self._dead_q.sync()
            await self._data.sync()
            self._commits += 1
        finally:
            if resume:
                self._paused = False
                if self._getters:
                    self._wake_getters(len(self._getters))

    async def purge(self) -> None:
        """Drop every message that is ready or deferred (nsqd's channel empty).

        Messages in flight stay in flight and can still be finished or
        requeued; messages on their way to the dead-letter queue go there.
        Puts that returned before the call are dropped, later ones are kept.
        The data queue's files are deleted (its ``purge()``).

        Raises QueueClosed if the queue is not open, DiskQueueError if a write fails.
        """
        self._check_open()
        fut = self._loop.create_future()
        self._purge_waiters.append(fut)
        self._kick()
        await fut

    async def _purge(self) -> None:
        waiters, self._purge_waiters = self._purge_waiters, []
        try:
            # First a commit with taking stopped: the log then counts no take past
            # its last head, so the data queue's new position after its purge
            # (stored by the purge itself) never makes an open skip later messages.
            await self._commit_now(resume=False)
            await self._data.purge()
            for e in list(self._journal.entries.values()):
                if e.state in (State.READY, State.LOADING, State.DEFERRED):
                    self._journal.done(e)
            for e, ver in self._held:  # requeued before the purge: dropped with the rest
                if e.ver == ver:
                    e.ver += 1
                    self._journal.done(e)
            self._held.clear()
            self._ready.clear()
            self._need_load.clear()
            self._dues.clear()
            self._n_deferred = 0
            self._arm()
            await self._commit_now()
        except (DiskQueueError, OSError) as exc:
            self._paused = False
            self._wake_getters(len(self._getters))
            for w in waiters:
                if not w.done():
                    w.set_exception(exc)
        else:
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def _dead_letter(self) -> None:
        batch, self._dead = self._dead, []
        assert self._dead_q is not None
        payloads = [nsq.encode(e.timestamp, e.attempts, e.msg_id, e.body or b"")
                    if self._nsq else (e.body or b"") for e in batch]
        try:
            await self._dead_q.put_many(payloads)
        except DiskQueueError as exc:
            log.error("%s: dead-lettering %d message(s) failed: %s", self._name, len(batch), exc)
            self._dead[:0] = batch
            await asyncio.sleep(min(1.0, self._sync_interval))
            return
        for e in batch:
            self._journal.done(e)
            self._count_op()
        self._dead_lettered += len(batch)
        self._dead_dirty = True

    async def _finish_close(self) -> None:
        self._state = _QState.CLOSING
        try:
            if self._dead:
                await self._dead_letter()
            await self._commit_now()
        except DiskQueueError as exc:
            log.error("%s: final commit failed: %s", self._name, exc)
        except BaseException:
            log.exception("%s: final commit failed", self._name)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._state = _QState.CLOSED
        err = self._closed_error()
        for w in self._sync_waiters + self._log_waiters + self._purge_waiters:
            if not w.done():
                w.set_exception(err)
        self._sync_waiters, self._log_waiters, self._purge_waiters = [], [], []
        self._wake_getters(len(self._getters))
        await self._close_stores()

    async def _close_stores(self) -> None:
        await self._data.aclose()
        if self._dead_q is not None:
            await self._dead_q.aclose()
        io = self._io
        if io is not None:
            try:
                await io.run(self._store.close)
            except OSError:
                log.exception("%s: closing the ack log failed", self._name)
            io.stop()
            self._io = None

    # ------------------------------------------------------------------ state and figures

    def _check_open(self) -> None:
        if self._state is not _QState.OPEN:
            raise self._closed_error()

    def _closed_error(self) -> DiskQueueError:
        if self._error is not None:
            return DiskQueueError(f"ack queue {self._name!r} is broken: {self._error!r}")
        if self._state is _QState.NEW:
            return QueueClosed(f"ack queue {self._name!r} is not open yet")
        return QueueClosed(f"ack queue {self._name!r} is closed")

    def qsize(self) -> int:
        """Messages ready to deliver (not in flight, not deferred)."""
        # Entries in _ready are READY until taken (purge clears the deque).
        return self._data.qsize() + len(self._ready) + len(self._need_load)

    def empty(self) -> bool:
        """True if nothing is ready, in flight or deferred."""
        return not (self.qsize() or self._in_flight or self._n_deferred)

    @property
    def dead_letters(self) -> DiskQueue:
        """The dead-letter queue ``NAME.dead``, open while this queue is open.

        Raises DiskQueueError if ``max_attempts`` is 0 (there is none).
        """
        if self._dead_q is None:
            raise DiskQueueError(f"ack queue {self._name!r} has no dead-letter queue "
                                 "(max_attempts is 0)")
        return self._dead_q

    @property
    def name(self) -> str:
        """The queue's name (the data queue's file name prefix)."""
        return self._name

    @property
    def directory(self) -> str:
        """The directory holding the queue's files."""
        return self._directory

    @property
    def format(self) -> str:
        """``"raw"`` or ``"nsq"``."""
        return self._format

    def statistics(self) -> AckStatistics:
        """A frozen snapshot of counters and sizes."""
        j = getattr(self, "_journal", None)
        return AckStatistics(
            depth=self.qsize(),
            in_flight=len(self._in_flight),
            deferred=self._n_deferred,
            finished=self._finished,
            requeued=self._requeued,
            timed_out=self._timed_out,
            dead_lettered=self._dead_lettered,
            delivered=self._delivered,
            commits=self._commits,
            log_syncs=self._log_syncs,
            log_bytes=j.bytes_on_disk() if j is not None else 0,
            log_segments=len(j.segs) if j is not None else 0,
            queue=self._data.statistics(),
        )
