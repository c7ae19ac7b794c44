"""Which message goes out next, and what becomes of it: the delivery state of an
:class:`~aiodiskqueue.AckQueue`.

:class:`Dispatcher` owns the in-memory delivery state of one queue: the entries ready
to deliver, those due again behind what was queued then, the getters waiting, the
count of takes from the data queue (``fetch_seq``) and the counters. It holds the
rules on that state: the order of delivery (ready entries, entries due again, the
data queue), handing out a :class:`~.message.Message`, finishing, requeueing,
touching and timing out, due times and dead letters. Nothing here does I/O: the
facade (:mod:`.queue`) waits for puts, the pump (:mod:`.pump`) writes and reads the
log. A message ends its delivery through :class:`~.message.DeliveryOwner`; the pump
calls back through :class:`~.pump.PumpHost`; this class is both.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import final

from .._format import nsq
from ..errors import DiskQueueError, QueueClosed, QueueEmpty
from ..queue import DiskQueue
from .clock import Clock
from .codec import IdGenerator
from .inflight import InFlight
from .journal import ENTRY_IN_FLIGHT, ENTRY_READY, Entry, EntryState, Journal, LogState
from .message import Message
from .options import number
from .pump import Pump


class QueueState(enum.Enum):
    """The life cycle of an :class:`~aiodiskqueue.AckQueue`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = QueueState.OPEN  # as the constants of .journal and .message


@final
class Dispatcher:
    """The delivery state and rules of one AckQueue (see the module doc).

    Created with the queue; :meth:`start` gives it the clock and the journal once the
    pump has recovered the log.
    """

    def __init__(self, name: str, data: DiskQueue, pump: Pump, ids: IdGenerator, *,
                 nsq: bool, max_in_flight: int, max_attempts: int, max_delay: float,
                 max_msg_timeout: float, sync_every: int) -> None:
        self.name = name
        self.state = QueueState.NEW
        self._data = data
        self._pump = pump
        self._ids = ids
        self._nsq = nsq
        self._max_in_flight = max_in_flight
        self._max_attempts = max_attempts
        self._max_delay = max_delay
        self._max_msg_timeout = max_msg_timeout
        self.waits_for_log_sync = sync_every == 1
        """A finish or requeue returns once the log is fsynced (``sync_every=1``)."""
        self._ready: deque[Entry] = deque()
        self._behind: deque[Entry] = deque()
        """Due again (requeued, timed out, deferred): each behind what was queued then."""
        self._getters: deque[asyncio.Future[None]] = deque()
        self.fetch_seq = 0
        """Messages taken out of the data queue, ever (the log's count)."""
        self.finished = 0
        self.requeued = 0
        self.timed_out = 0
        self.delivered = 0
        self.journal: Journal
        self.inflight: InFlight
        self._clock: Clock
        self._loop: asyncio.AbstractEventLoop

    def start(self, loop: asyncio.AbstractEventLoop, clock: Clock, journal: Journal,
              fetch_seq: int) -> None:
        """Take over the recovered log: entries due now are read back, deferred ones wait
        for their time (the timer is armed by :meth:`open`)."""
        self._loop = loop
        self._clock = clock
        self.journal = journal
        self.fetch_seq = fetch_seq
        self.inflight = InFlight(clock, on_timeout=self._on_timeout, on_due=self.make_due,
                                 is_open=self.is_open)
        now, wall = clock.monotonic(), clock.time_ns()
        for e in sorted(journal.entries.values(), key=lambda e: e.key):
            if e.due_ns <= wall:  # in flight at the crash, or came due while closed
                e.state = EntryState.LOADING
                self._pump.load(e)
            else:
                self.defer(e, now + (e.due_ns - wall) / 1e9)

    def open(self) -> None:
        """The queue is open: deliveries may start, the timer runs."""
        self.state = _OPEN

    # ------------------------------------------------------------------ taking

    def try_take(self, timeout: float) -> Message | None:
        """The next message, delivered with ``timeout``, or None if none is ready (or
        ``max_in_flight`` are out).

        Raises QueueClosed if the queue is not open, what the data queue's
        ``get_nowait()`` raises but QueueEmpty (CorruptionError where strict reading
        stopped).
        """
        self.check_open()
        in_flight = self.inflight.messages
        while len(in_flight) < self._max_in_flight:
            behind = self._behind
            if behind and self._behind_first():
                e = behind.popleft()
                if e.state is not ENTRY_READY:
                    continue
            elif self._ready:
                e = self._ready.popleft()
                if e.state is not ENTRY_READY:
                    continue
            elif not self._pump.paused:
                try:
                    payload = self._data.get_nowait()
                except QueueEmpty:  # nothing read ahead yet (damage or a close raises)
                    if behind and not self._data.qsize():
                        e = behind.popleft()
                        if e.state is not ENTRY_READY:
                            continue
                    else:
                        return None
                else:
                    e = self._take(payload)
            elif behind and not self._data.qsize():
                # Taking from the data queue is paused for a commit: what was
                # queued ahead of the head of _behind waits, so it waits too.
                e = behind.popleft()
                if e.state is not ENTRY_READY:
                    continue
            else:
                return None
            m = self._deliver(e, timeout)
            if m is not None:
                return m
        return None

    def take_ready(self, limit: int, timeout: float) -> list[Message]:
        """Up to ``limit`` messages delivered from memory, as that many :meth:`try_take`
        calls would deliver them, in the same order.

        While nothing was made due again (``_behind`` and ``_ready`` empty) and no
        commit holds the data queue, the messages come from the data queue's
        read-ahead in one step: no exception and no search per message.

        Raises as :meth:`try_take` does when it would deliver nothing.
        """
        self.check_open()
        out: list[Message] = []
        in_flight = self.inflight.messages
        data = self._data
        while len(out) < limit:
            if self._behind or self._ready or self._pump.paused:
                m = self.try_take(timeout)
                if m is None:
                    break
                out.append(m)
                continue
            room = min(limit - len(out), self._max_in_flight - len(in_flight))
            if room <= 0:
                break
            if not data._n_ready():
                if not out:
                    # Nothing read ahead: what get_nowait() would raise is raised (strict
                    # reading stopped at damage, a closed data queue), else nothing comes.
                    m = self.try_take(timeout)
                    if m is not None:
                        out.append(m)
                        continue
                break
            payloads = [data.get_nowait()]  # a message is ready: raises nothing
            if room > 1:
                data._take_more(payloads, room - 1)
            self._deliver_taken(payloads, timeout, out)
        return out

    def _deliver_taken(self, payloads: list[bytes], timeout: float, out: list[Message]) -> None:
        """:meth:`_take` then :meth:`_deliver` for each payload just taken out of the data
        queue, in one loop: the batch shares its delivery time, one wake-up of the pump
        and one check of the in-flight timer. Appends the messages delivered to ``out``."""
        journal = self.journal
        decode = nsq.decode if self._nsq else None
        max_attempts = self._max_attempts
        now = self._clock.monotonic()
        first = len(out)
        seq = start = self.fetch_seq
        try:
            for payload in payloads:
                seq += 1
                if decode is not None:
                    ts, attempts, msg_id, body = decode(payload)
                else:
                    ts, attempts, msg_id, body = (self._clock.time_ns(), 0, self._ids.next(),
                                                  payload)
                e = journal.add(seq, 0, attempts, msg_id, ts, body)
                attempts += 1
                if max_attempts and attempts > max_attempts:
                    self._to_dead_letters(e)
                    continue
                # As _deliver. The entry's E record is still pending: it is encoded with
                # this state, so no U record.
                e.attempts = attempts
                e.state = ENTRY_IN_FLIGHT
                e.ver += 1
                e.msg = m = Message(self, e, now, timeout)
                out.append(m)
        except BaseException:
            # A payload the codec refuses (the data queue's reads refuse one too short for
            # the nsq layout first, so this guards the rest): lost, as with get_nowait(),
            # while those after it go back to the read-ahead.
            self._data._untake(payloads[seq - start:])
            raise
        finally:  # what was delivered is in flight whatever happened after it
            self.fetch_seq = seq
            self.delivered += len(out) - first
            self.inflight.add_batch(out[first:], now + timeout)
            self._pump.records_added(seq - start)  # a take each, and their records

    def _behind_first(self) -> bool:
        """Whether the head of ``_behind`` is due before the next message of the data queue.

        As nsqd's ``REQ 0`` and timeouts: a message made due again goes behind
        every message that was queued at that moment (read ahead into
        ``_ready`` or still in the data queue), ahead of later ones.
        """
        after = self._behind[0].after
        if self._ready:
            return after < self._ready[0].fetch_seq
        return after <= self.fetch_seq

    def _take(self, payload: bytes) -> Entry:
        """A message just taken out of the data queue becomes a log entry.

        :meth:`_deliver_taken` does this and :meth:`_deliver` inline for a batch (a
        call per message there cost a third of the gain): a change here goes there too;
        ``test_get_many_nowait_delivers_as_get_nowait_calls`` compares the two.
        """
        self.fetch_seq += 1
        if self._nsq:
            ts, attempts, msg_id, body = nsq.decode(payload)
        else:
            ts, attempts, msg_id, body = self._clock.time_ns(), 0, self._ids.next(), payload
        e = self.journal.add(self.fetch_seq, 0, attempts, msg_id, ts, body)
        self._pump.count_op()
        return e

    def take_fetched(self, payload: bytes) -> None:
        """A message the pump waited for in the data queue: taken, ready to deliver."""
        # Same step as a take: the fetch_seq order is the data queue's order.
        self.make_ready(self._take(payload))

    def _deliver(self, e: Entry, timeout: float) -> Message | None:
        # Inlined for fresh entries by _deliver_taken: a change here goes there too.
        n = e.attempts + 1
        if self._max_attempts and n > self._max_attempts:
            self._to_dead_letters(e)
            return None
        e.attempts = n
        e.due_ns = 0
        e.state = ENTRY_IN_FLIGHT
        e.ver += 1
        self.journal.update(e)
        m = Message(self, e, self._clock.monotonic(), timeout)
        e.msg = m
        self.inflight.add(m)
        self.delivered += 1
        self._pump.records_added()
        return m

    async def wait_for_message(self) -> None:
        """Wait until a take may succeed (a message became ready, room in flight, the
        queue closing). Cancelling it leaves the queue unchanged."""
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
                self.wake_getters(1)
            raise

    # ------------------------------------------------------------------ ending a delivery

    def _end_delivery(self, m: Message, e: Entry) -> None:
        """``m`` (already marked ended by itself) leaves the in-flight set."""
        if self.state is not _OPEN:
            raise self.closed_error()
        self.inflight.remove(m)
        e.msg = None
        if self._getters:
            self.wake_getters(1)

    def finish(self, m: Message, e: Entry) -> None:
        """The delivery of ``m`` ended with a finish: ``e`` is done.

        Raises QueueClosed if the queue is not open (nothing changed).
        """
        self._end_delivery(m, e)
        self.journal.done(e)
        self.finished += 1
        self._pump.records_added(1)

    def requeue(self, m: Message, e: Entry, delay: float) -> None:
        """The delivery of ``m`` ended with a requeue: ``e`` is due again after ``delay``.

        Raises ValueError for a delay outside ``[0, max_delay]``, QueueClosed if the
        queue is not open (nothing changed either way).
        """
        d = self.check_delay(delay)
        self._end_delivery(m, e)
        self._pump.count_op()
        self.requeued += 1
        if self._max_attempts and e.attempts >= self._max_attempts:
            self.make_due(e)  # out of attempts: dead-lettered now, waiting is pointless
        elif d == 0.0 and self.waits_for_log_sync:
            e.after = self.fetch_seq + self._data.qsize()  # its place is taken now
            self._pump.hold(e)  # released by the next log sync or commit
        elif d == 0.0:
            self.make_due(e)
        else:
            e.due_ns = self._clock.time_ns() + int(d * 1e9)
            self.journal.update(e)
            self.defer(e, self._clock.monotonic() + d)
            self.inflight.arm()
        self._pump.kick()

    def touch(self, m: Message) -> None:
        """Push the deadline of ``m`` out by its timeout, capped by ``max_msg_timeout``.

        Raises QueueClosed if the queue is not open.
        """
        self.check_open()
        self.inflight.touch(m, self._clock.monotonic(), self._max_msg_timeout)

    async def wait_log_sync(self) -> None:
        """Wait until the log is fsynced with everything appended so far."""
        await self._pump.wait_log_sync()

    def _on_timeout(self, e: Entry) -> None:
        e.msg = None
        self.timed_out += 1
        self.make_due(e)
        self.wake_getters(1)

    def backoff(self, attempts: int) -> float:
        """The requeue delay of ``async with msg`` after a failure.

        1 s after the first attempt, doubling with each attempt, capped at ``max_delay``.
        """
        return min(self._max_delay, 2.0 ** min(max(attempts - 1, 0), 40))

    # ------------------------------------------------------------------ due times

    def put_deferred(self, datas: list[bytes], d: float) -> asyncio.Future[None]:
        """Log entries due in ``d`` seconds; the future is done once they are written to
        the OS."""
        wall = self._clock.time_ns()
        due = wall + int(d * 1e9)
        when = self._clock.monotonic() + d
        for data in datas:
            e = self.journal.add(0, due, 0, self._ids.next(), wall, data)
            self.defer(e, when)
        self.inflight.arm()
        fut = self.journal.wait_written()
        self._pump.kick()
        return fut

    def defer(self, e: Entry, when: float) -> None:
        """``e`` waits until ``when`` on the clock's monotonic time (then :meth:`make_due`)."""
        self.inflight.defer(e, when)
        if e.log_state is LogState.WRITTEN:
            e.body = None  # on disk: read back when due

    def make_due(self, e: Entry, after: int | None = None) -> None:
        """Make ``e`` deliverable again, behind what is queued now (or behind ``after``)."""
        e.ver += 1
        e.after = self.fetch_seq + self._data.qsize() if after is None else after
        if e.body is not None:
            self.make_ready(e)
        else:
            e.state = EntryState.LOADING
            self._pump.load(e)

    def make_ready(self, e: Entry) -> None:
        """A due entry with its body in memory: ready, or dead if out of attempts."""
        if self._max_attempts and e.attempts >= self._max_attempts:
            self._to_dead_letters(e)
            return
        e.state = EntryState.READY
        if e.after:
            self._behind.append(e)
        else:
            self._ready.append(e)
        self.wake_getters(1)

    def lost(self, e: Entry) -> None:
        """``e``'s log record is damaged: it is forgotten."""
        if e.state is EntryState.DEFERRED:
            self.inflight.undefer(e)
        self.journal.done(e)

    def _to_dead_letters(self, e: Entry) -> None:
        e.state = EntryState.DEAD
        self._pump.dead_letter(e)

    def drop_waiting(self) -> None:
        """Forget every ready, loading and deferred entry (a purge), logged as done."""
        for e in list(self.journal.entries.values()):
            if e.state in (EntryState.READY, EntryState.LOADING, EntryState.DEFERRED):
                self.journal.done(e)
        self.forget_waiting()

    def forget_waiting(self) -> None:
        """Empty the ready and due-again queues and the deferred heap; the entries stay in
        the journal as they are."""
        self._ready.clear()
        self._behind.clear()
        self.inflight.clear_deferred()

    # ------------------------------------------------------------------ getters

    def wake_getters(self, n: int) -> None:
        """Wake up to ``n`` waiting getters."""
        g = self._getters
        while n > 0 and g:
            w = g.popleft()
            if not w.done():
                w.set_result(None)
                n -= 1

    def wake_all(self) -> None:
        """Wake every waiting getter (taking resumed, or the queue closing)."""
        self.wake_getters(len(self._getters))

    def wake_for_ready(self) -> None:
        """Wake as many getters as entries are ready."""
        if self._ready:
            self.wake_getters(len(self._ready))

    def n_ready(self) -> int:
        """Entries ready in memory (not counting those due again behind the data queue)."""
        return len(self._ready)

    def n_getters(self) -> int:
        """Getters waiting."""
        return len(self._getters)

    def wants_fetch(self) -> bool:
        """Getters wait, nothing is ready in memory and there is room in flight: the pump
        should wait for the data queue's next message on their behalf."""
        return (bool(self._getters) and not self._ready
                and len(self.inflight.messages) < self._max_in_flight)

    # ------------------------------------------------------------------ checks and state

    def qsize(self) -> int:
        """Messages ready to deliver: the data queue's, ready entries, entries loading."""
        # Entries in _ready are READY until taken (purge clears the deque).
        return (self._data.qsize() + len(self._ready) + len(self._behind)
                + self._pump.n_loading())

    def check_delay(self, delay: object) -> float:
        """``delay`` as a float.

        Raises TypeError or ValueError unless it is a number in ``[0, max_delay]``.
        """
        d = number("delay", delay, positive=False)
        if d > self._max_delay:
            raise ValueError(f"delay must be <= max_delay={self._max_delay}, got {delay}")
        return d

    def is_open(self) -> bool:
        """True while the queue is open."""
        return self.state is _OPEN

    def closing(self) -> None:
        """The queue is closing: no more deliveries, finishes or requeues."""
        if self.state is _OPEN:
            self.state = QueueState.CLOSING

    def closed(self) -> None:
        """The queue is closed: the timer stops, every getter wakes (and raises)."""
        if hasattr(self, "inflight"):
            self.inflight.stop()
        self.state = QueueState.CLOSED
        self.wake_all()

    def check_open(self) -> None:
        """Raises QueueClosed (or DiskQueueError if the pump failed) unless open."""
        if self.state is not _OPEN:
            raise self.closed_error()

    def closed_error(self) -> DiskQueueError:
        """The error for an operation on a queue that is not open."""
        if self._pump.error is not None:
            return DiskQueueError(f"ack queue {self.name!r} is broken: {self._pump.error!r}")
        if self.state is QueueState.NEW:
            return QueueClosed(f"ack queue {self.name!r} is not open yet")
        return QueueClosed(f"ack queue {self.name!r} is closed")
