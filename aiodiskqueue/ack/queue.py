"""The facade of reliable delivery: :class:`AckQueue` (see the package's design notes in
:mod:`aiodiskqueue.ack`). The background work is :mod:`.pump`, the deadlines and the
timer :mod:`.inflight`, one delivery :mod:`.message`."""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Literal, final

from .._core.options import DEFAULTS
from .._format import nsq
from .._format.layout import dead_letter_layout
from ..errors import DiskQueueError, MessageNotInFlight, MessageSizeError, QueueClosed, QueueEmpty
from ..queue import DiskQueue
from .clock import Clock, LoopClock
from .codec import IdGenerator
from .inflight import InFlight
from .journal import Entry, EntryState, LogState
from .message import DeliveryState, Message
from .options import AckOptions, AckStatistics, as_bytes, number
from .pump import Pump

__all__ = ["AckQueue", "AckStatistics", "Message"]

log = logging.getLogger("aiodiskqueue")

_NO_SYNC_EVERY = 2**62  # the data queue stores its position only in our commits
_NO_SYNC_INTERVAL = 1e9


class QueueState(enum.Enum):
    """The life cycle of an :class:`AckQueue`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


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
    the queue ``NAME`` in the subdirectory ``NAME.dead-letters``), ``format`` (``"raw"``: the payload is the body; ``"nsq"``:
    nsqd's message layout), ``clock`` (for tests), ``log_segment_bytes``, and
    every :class:`~aiodiskqueue.DiskQueue` option, with the same defaults, for
    the data queue (``sync_every`` and ``sync_interval`` set when commits happen;
    the dead-letter queue uses them as they are).

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
    ) -> None:
        self._name = name
        self._directory = os.fspath(directory)
        self._state = QueueState.NEW
        o = AckOptions.check(
            msg_timeout=msg_timeout, max_msg_timeout=max_msg_timeout, max_delay=max_delay,
            max_in_flight=max_in_flight, max_attempts=max_attempts, format=format,
            log_segment_bytes=log_segment_bytes, max_bytes_per_file=max_bytes_per_file,
            min_msg_size=min_msg_size, max_msg_size=max_msg_size, sync_every=sync_every,
            sync_interval=sync_interval, maxsize=maxsize, read_buffer_bytes=read_buffer_bytes,
            write_buffer_bytes=write_buffer_bytes, strict=strict, spin_us=spin_us)
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
                                  "write_buffer_bytes": write_buffer_bytes,
                                  "strict": strict, "spin_us": spin_us}
        self._data = DiskQueue(directory, name, sync_every=_NO_SYNC_EVERY,
                               sync_interval=_NO_SYNC_INTERVAL, maxsize=maxsize, **common)
        self._dead_q: DiskQueue | None = None
        if self._max_attempts:
            dead = dead_letter_layout(self._directory, name)
            self._dead_q = DiskQueue(dead.directory, dead.name, sync_every=sync_every,
                                     sync_interval=sync_interval, **common)
        self._clock_arg = clock
        self._ids = IdGenerator()
        self._pump = Pump(self)

        self._ready: deque[Entry] = deque()
        self._behind: deque[Entry] = deque()
        """Due again (requeued, timed out, deferred): each behind what was queued then."""
        self._need_load: deque[Entry] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._fetch_seq = 0

        self._finished = 0
        self._requeued = 0
        self._timed_out = 0
        self._dead_lettered = 0
        self._delivered = 0

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
        if self._state is QueueState.NEW:
            await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _start(self, after_recovery: Callable[[AckQueue], Awaitable[None]] | None = None
                     ) -> None:
        """Open the files and recover; ``after_recovery`` runs before the first commit."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._clock: Clock = self._clock_arg or LoopClock(loop)
        self._inflight = InFlight(self._clock, on_timeout=self._on_timeout,
                                  on_due=self._make_due, is_open=self._is_open)
        try:
            self._journal = await self._pump.recover()
            self._state = QueueState.OPEN
            if after_recovery is not None:
                await after_recovery(self)
            await self._pump.commit_now()
        except BaseException:
            self._state = QueueState.CLOSED
            await self._pump.close_stores()
            raise
        self._inflight.arm()
        self._pump.start()

    async def aclose(self) -> None:
        """Write and commit what is pending, close the files; idempotent.

        Messages still in flight stay in the log and are delivered again after
        the next open. Blocked ``get()`` calls raise QueueClosed.
        """
        task = self._pump.task
        if task is None:
            if self._state is QueueState.NEW:
                self._state = QueueState.CLOSED
            return
        if self._state is QueueState.OPEN:
            self._state = QueueState.CLOSING
            self._wake_getters(len(self._getters))
            self._pump.kick()
        await asyncio.shield(task)

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_state", None) in (QueueState.OPEN, QueueState.CLOSING):
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        in_flight = len(self._inflight) if hasattr(self, "_inflight") else 0
        deferred = self._inflight.n_deferred if hasattr(self, "_inflight") else 0
        return (f"<AckQueue {self._name!r} in {self._directory!r} state={self._state.value} "
                f"depth={self.qsize() if self._state is QueueState.OPEN else '?'} "
                f"in_flight={in_flight} deferred={deferred}>")

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
            self._check_size(data)
            await self._put_deferred([data], d)
        self._pump.count_op()
        if self._sync_every == 1:
            # A data record needs the data queue fsynced: a commit. A log entry
            # needs the log fsynced, nothing more.
            await (self._pump.wait_commit() if d == 0.0 else self._pump.wait_log_sync())

    async def put_many(self, bodies: Iterable[bytes | bytearray | memoryview], *,
                       delay: float = 0.0) -> None:
        """Publish every body, in order, as one batch (NSQ MPUB); all share ``delay``.

        Every body is checked first: if one is invalid, nothing is put.

        Raises as :meth:`put` does.
        """
        datas = [as_bytes(b) for b in bodies]
        d = self._check_delay(delay)
        self._check_open()
        for data in datas:
            self._check_size(data)
        if not datas:
            return
        if d == 0.0:
            if self._nsq:
                now = self._clock.time_ns()
                datas = [nsq.encode(now, 0, self._ids.next(), b) for b in datas]
            await self._data.put_many(datas)
        else:
            await self._put_deferred(datas, d)
        for _ in datas:
            self._pump.count_op()
        if self._sync_every == 1:
            await (self._pump.wait_commit() if d == 0.0 else self._pump.wait_log_sync())

    def _check_size(self, data: bytes) -> None:
        size = len(data) + (nsq.HEADER_SIZE if self._nsq else 0)
        if size < self._min_size or size > self._max_size:
            raise MessageSizeError(size, self._min_size, self._max_size)

    async def _put_deferred(self, datas: list[bytes], d: float) -> None:
        """Log entries due in ``d`` seconds; returns once written to the OS."""
        wall = self._clock.time_ns()
        due = wall + int(d * 1e9)
        when = self._clock.monotonic() + d
        for data in datas:
            e = Entry(self._journal.new_key(), 0, due, 0, self._ids.next(), wall, data)
            self._journal.add(e)
            self._defer(e, when)
        self._inflight.arm()
        fut = self._journal.wait_written()
        self._pump.kick()
        await fut

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
            self._pump.kick()
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
        while len(self._inflight) < self._max_in_flight:
            behind = self._behind
            if behind and self._behind_first():
                e = behind.popleft()
                if e.state is not EntryState.READY:
                    continue
            elif self._ready:
                e = self._ready.popleft()
                if e.state is not EntryState.READY:
                    continue
            elif not self._pump.paused:
                try:
                    payload = self._data.get_nowait()
                except DiskQueueError:  # QueueEmpty: nothing read ahead yet
                    if behind and not self._data.qsize():
                        e = behind.popleft()
                        if e.state is not EntryState.READY:
                            continue
                    else:
                        return None
                else:
                    e = self._take(payload)
            elif behind and not self._data.qsize():
                # Taking from the data queue is paused for a commit: what was
                # queued ahead of the head of _behind waits, so it waits too.
                e = behind.popleft()
                if e.state is not EntryState.READY:
                    continue
            else:
                return None
            m = self._deliver(e, timeout)
            if m is not None:
                return m
        return None

    def _behind_first(self) -> bool:
        """Whether the head of ``_behind`` is due before the next message of the data queue.

        As nsqd's ``REQ 0`` and timeouts: a message made due again goes behind
        every message that was queued at that moment (read ahead into
        ``_ready`` or still in the data queue), ahead of later ones.
        """
        after = self._behind[0].after
        if self._ready:
            return after < self._ready[0].fetch_seq
        return after <= self._fetch_seq

    def _take(self, payload: bytes) -> Entry:
        """A message just taken out of the data queue becomes a log entry."""
        self._fetch_seq += 1
        if self._nsq:
            ts, attempts, msg_id, body = nsq.decode(payload)
        else:
            ts, attempts, msg_id, body = self._clock.time_ns(), 0, self._ids.next(), payload
        e = Entry(self._journal.new_key(), self._fetch_seq, 0, attempts, msg_id, ts, body)
        self._journal.add(e)
        self._pump.count_op()
        return e

    def _deliver(self, e: Entry, timeout: float) -> Message | None:
        n = e.attempts + 1
        if self._max_attempts and n > self._max_attempts:
            self._to_dead_letters(e)
            return None
        e.attempts = n
        e.due_ns = 0
        e.state = EntryState.IN_FLIGHT
        e.ver += 1
        self._journal.update(e)
        m = Message(self, e, self._clock.monotonic(), timeout)
        e.msg = m
        self._inflight.add(m)
        self._delivered += 1
        self._pump.kick()
        return m

    # ------------------------------------------------------------------ finish / requeue / touch

    def _check_msg(self, m: Message) -> Entry:
        if m._state is not DeliveryState.IN_FLIGHT:
            raise MessageNotInFlight(m.id, m._state.value)
        if self._state is not QueueState.OPEN:
            raise self._closed_error()
        return m._entry

    def _release(self, m: Message, state: DeliveryState) -> Entry:
        e = self._check_msg(m)
        m._state = state
        self._inflight.remove(m)
        e.msg = None
        self._pump.count_op()
        self._wake_getters(1)
        return e

    def _finish(self, m: Message) -> None:
        e = self._release(m, DeliveryState.FINISHED)
        self._journal.done(e)
        self._finished += 1
        self._pump.kick()

    def _requeue(self, m: Message, delay: float) -> None:
        d = self._check_delay(delay)
        e = self._release(m, DeliveryState.REQUEUED)
        self._requeued += 1
        if self._max_attempts and e.attempts >= self._max_attempts:
            self._make_due(e)  # out of attempts: dead-lettered now, waiting is pointless
        elif d == 0.0 and self._sync_every == 1:
            e.after = self._fetch_seq + self._data.qsize()  # its place is taken now
            self._pump.hold(e)  # released by the next log sync or commit
        elif d == 0.0:
            self._make_due(e)
        else:
            e.due_ns = self._clock.time_ns() + int(d * 1e9)
            self._journal.update(e)
            self._defer(e, self._clock.monotonic() + d)
            self._inflight.arm()
        self._pump.kick()

    def _touch(self, m: Message) -> None:
        self._check_msg(m)
        self._inflight.touch(m, self._clock.monotonic(), self._max_msg_timeout)

    def _on_timeout(self, m: Message) -> None:
        e = m._entry
        e.msg = None
        self._timed_out += 1
        self._make_due(e)
        self._wake_getters(1)

    def backoff(self, attempts: int) -> float:
        """The requeue delay of ``async with msg`` after a failure.

        1 s after the first attempt, doubling with each attempt, capped at ``max_delay``.
        """
        return min(self._max_delay, 2.0 ** min(max(attempts - 1, 0), 40))

    # ------------------------------------------------------------------ due times

    def _defer(self, e: Entry, when: float) -> None:
        self._inflight.defer(e, when)
        if e.log_state is LogState.WRITTEN:
            e.body = None  # on disk: read back when due

    def _make_due(self, e: Entry, after: int | None = None) -> None:
        """Make ``e`` deliverable again, behind what is queued now (or behind ``after``)."""
        e.ver += 1
        e.after = self._fetch_seq + self._data.qsize() if after is None else after
        if e.body is not None:
            self._make_ready(e)
        else:
            e.state = EntryState.LOADING
            self._need_load.append(e)
            self._pump.kick()

    def _make_ready(self, e: Entry) -> None:
        """A due entry with its body in memory: ready, or dead if out of attempts."""
        if self._max_attempts and e.attempts >= self._max_attempts:
            self._to_dead_letters(e)
            return
        e.state = EntryState.READY
        if e.after:
            self._behind.append(e)
        else:
            self._ready.append(e)
        self._wake_getters(1)

    def _to_dead_letters(self, e: Entry) -> None:
        e.state = EntryState.DEAD
        self._pump.dead.append(e)
        self._pump.kick()

    def _drop_waiting(self) -> None:
        """Forget every ready, loading and deferred entry (a purge)."""
        for e in list(self._journal.entries.values()):
            if e.state in (EntryState.READY, EntryState.LOADING, EntryState.DEFERRED):
                self._journal.done(e)
        self._ready.clear()
        self._behind.clear()
        self._need_load.clear()
        self._inflight.clear_deferred()

    def _wake_getters(self, n: int) -> None:
        g = self._getters
        while n > 0 and g:
            w = g.popleft()
            if not w.done():
                w.set_result(None)
                n -= 1

    # ------------------------------------------------------------------ sync and purge

    async def sync(self) -> None:
        """Commit now: write and fsync the log, then sync the data queue.

        Raises QueueClosed if the queue is not open, DiskQueueError if it fails.
        """
        await self._pump.wait_commit()

    async def purge(self) -> None:
        """Drop every message that is ready or deferred (nsqd's channel empty).

        Messages in flight stay in flight and can still be finished or
        requeued; messages on their way to the dead-letter queue go there.
        Puts that returned before the call are dropped, later ones are kept.
        The data queue's files are deleted (its ``purge()``).

        Raises QueueClosed if the queue is not open, DiskQueueError if a write fails.
        """
        self._check_open()
        await self._pump.wait_purge()

    # ------------------------------------------------------------------ state and figures

    def _is_open(self) -> bool:
        return self._state is QueueState.OPEN

    def _set_closing(self) -> None:
        self._state = QueueState.CLOSING

    def _set_closed(self) -> None:
        self._state = QueueState.CLOSED

    def _check_open(self) -> None:
        if self._state is not QueueState.OPEN:
            raise self._closed_error()

    def _closed_error(self) -> DiskQueueError:
        if self._pump.error is not None:
            return DiskQueueError(f"ack queue {self._name!r} is broken: {self._pump.error!r}")
        if self._state is QueueState.NEW:
            return QueueClosed(f"ack queue {self._name!r} is not open yet")
        return QueueClosed(f"ack queue {self._name!r} is closed")

    def qsize(self) -> int:
        """Messages ready to deliver: not in flight, not deferred (``len(q)`` too)."""
        # Entries in _ready are READY until taken (purge clears the deque).
        return self._data.qsize() + len(self._ready) + len(self._behind) + len(self._need_load)

    def __len__(self) -> int:
        return self.qsize()

    def empty(self) -> bool:
        """True if no message is ready to deliver (``qsize() == 0``), as asyncio.Queue.

        Messages in flight or deferred are not counted: see :meth:`statistics`.
        """
        return self.qsize() == 0

    @property
    def dead_letters(self) -> DiskQueue:
        """The dead-letter queue (``NAME`` in ``NAME.dead-letters/``), open while this queue is open.

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
        inflight = getattr(self, "_inflight", None)
        return AckStatistics(
            depth=self.qsize(),
            in_flight=len(inflight) if inflight is not None else 0,
            deferred=inflight.n_deferred if inflight is not None else 0,
            finished=self._finished,
            requeued=self._requeued,
            timed_out=self._timed_out,
            dead_lettered=self._dead_lettered,
            delivered=self._delivered,
            commits=self._pump.commits,
            log_syncs=self._pump.log_syncs,
            log_bytes=j.bytes_on_disk() if j is not None else 0,
            log_segments=len(j.segs) if j is not None else 0,
            queue=self._data.statistics(),
        )
