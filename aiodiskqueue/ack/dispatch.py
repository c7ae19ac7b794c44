"""Which message goes out next, and what becomes of it: the delivery rules of an
:class:`~aiodiskqueue.AckQueue`.

:class:`Dispatch` is the base class of ``AckQueue`` holding the rules that work
only on its in-memory state: the order of delivery (ready entries, entries due
again behind what was queued then, the data queue), handing out a
:class:`~.message.Message`, finishing, requeueing, touching and timing out, due
times and dead letters. Nothing here waits or does I/O: the facade
(:mod:`.queue`) waits, the pump (:mod:`.pump`) writes.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque

from .._format import nsq
from ..errors import DiskQueueError, MessageNotInFlight, QueueClosed, QueueEmpty
from ..queue import DiskQueue
from .clock import Clock
from .codec import IdGenerator
from .inflight import InFlight
from .journal import ENTRY_IN_FLIGHT, ENTRY_READY, Entry, EntryState, Journal, LogState
from .message import DELIVERY_FINISHED, DELIVERY_IN_FLIGHT, DeliveryState, Message
from .options import number
from .pump import Pump


class QueueState(enum.Enum):
    """The life cycle of an :class:`~aiodiskqueue.AckQueue`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = QueueState.OPEN  # as the constants of .journal and .message


class Dispatch:
    """The delivery rules of an AckQueue; its state is set up by the AckQueue."""

    _name: str
    _state: QueueState
    _data: DiskQueue
    _pump: Pump
    _journal: Journal
    _inflight: InFlight
    _clock: Clock
    _ids: IdGenerator
    _nsq: bool
    _max_in_flight: int
    _max_attempts: int
    _max_delay: float
    _max_msg_timeout: float
    _sync_every: int
    _ready: deque[Entry]
    _behind: deque[Entry]
    _need_load: deque[Entry]
    _getters: deque[asyncio.Future[None]]
    _fetch_seq: int
    _finished: int
    _requeued: int
    _timed_out: int
    _delivered: int

    # ------------------------------------------------------------------ taking

    def _try_take(self, timeout: float) -> Message | None:
        self._check_open()
        in_flight = self._inflight.messages
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

    def _take_ready(self, limit: int, timeout: float) -> list[Message]:
        """Up to ``limit`` messages delivered from memory, as that many :meth:`_try_take`
        calls would deliver them, in the same order.

        While nothing was made due again (``_behind`` and ``_ready`` empty) and no
        commit holds the data queue, the messages come from the data queue's
        read-ahead in one step: no exception and no search per message.
        """
        self._check_open()
        out: list[Message] = []
        in_flight = self._inflight.messages
        data = self._data
        while len(out) < limit:
            if self._behind or self._ready or self._pump.paused:
                m = self._try_take(timeout)
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
                    m = self._try_take(timeout)
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
        journal = self._journal
        decode = nsq.decode if self._nsq else None
        max_attempts = self._max_attempts
        now = self._clock.monotonic()
        first = len(out)
        seq = start = self._fetch_seq
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
            self._fetch_seq = seq
            self._delivered += len(out) - first
            self._inflight.add_batch(out[first:], now + timeout)
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
        return after <= self._fetch_seq

    def _take(self, payload: bytes) -> Entry:
        """A message just taken out of the data queue becomes a log entry.

        :meth:`_deliver_taken` does this and :meth:`_deliver` inline for a batch (a
        call per message there cost a third of the gain): a change here goes there too;
        ``test_get_many_nowait_delivers_as_get_nowait_calls`` compares the two.
        """
        self._fetch_seq += 1
        if self._nsq:
            ts, attempts, msg_id, body = nsq.decode(payload)
        else:
            ts, attempts, msg_id, body = self._clock.time_ns(), 0, self._ids.next(), payload
        e = self._journal.add(self._fetch_seq, 0, attempts, msg_id, ts, body)
        self._pump.count_op()
        return e

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
        self._journal.update(e)
        m = Message(self, e, self._clock.monotonic(), timeout)
        e.msg = m
        self._inflight.add(m)
        self._delivered += 1
        self._pump.records_added()
        return m

    # ------------------------------------------------------------------ finish / requeue / touch

    def _check_msg(self, m: Message) -> Entry:
        if m._state is not DELIVERY_IN_FLIGHT:
            raise MessageNotInFlight(m.id, m._state.value)
        if self._state is not _OPEN:
            raise self._closed_error()
        return m._entry

    def _release(self, m: Message, state: DeliveryState) -> Entry:
        """End ``m``'s delivery (the caller counts the operation towards ``sync_every``)."""
        e = self._check_msg(m)
        m._state = state
        self._inflight.remove(m)
        e.msg = None
        if self._getters:
            self._wake_getters(1)
        return e

    def _finish(self, m: Message) -> None:
        e = self._release(m, DELIVERY_FINISHED)
        self._journal.done(e)
        self._finished += 1
        self._pump.records_added(1)

    def _requeue(self, m: Message, delay: float) -> None:
        d = self._check_delay(delay)
        e = self._release(m, DeliveryState.REQUEUED)
        self._pump.count_op()
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

    # ------------------------------------------------------------------ checks and state

    def _check_delay(self, delay: object) -> float:
        d = number("delay", delay, positive=False)
        if d > self._max_delay:
            raise ValueError(f"delay must be <= max_delay={self._max_delay}, got {delay}")
        return d

    def _is_open(self) -> bool:
        return self._state is _OPEN

    def _set_closing(self) -> None:
        self._state = QueueState.CLOSING

    def _set_closed(self) -> None:
        self._state = QueueState.CLOSED

    def _check_open(self) -> None:
        if self._state is not _OPEN:
            raise self._closed_error()

    def _closed_error(self) -> DiskQueueError:
        if self._pump.error is not None:
            return DiskQueueError(f"ack queue {self._name!r} is broken: {self._pump.error!r}")
        if self._state is QueueState.NEW:
            return QueueClosed(f"ack queue {self._name!r} is not open yet")
        return QueueClosed(f"ack queue {self._name!r} is closed")
