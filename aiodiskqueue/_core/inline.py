"""Writes from the loop: a small batch written and applied by one callback, no ioLoop step.

When a put lands in an empty batch while nothing but a sync round is in flight, the
engine schedules :meth:`InlineWrites.flush` at the end of the loop iteration
(``call_soon``): the producers ready in the same iteration append their puts first;
then the batch is written in one go, polled for on the write lane
(:meth:`.WriteLane.write_polled`) or, with ``inline_writes=True``, by the loop itself,
and applied, its producers woken, by the same callback: no ioLoop step, no eventfd
wake-up (why those are dear: :mod:`.lane`). ``await put()`` still returns only after its
record is written to the OS. A polled write that outlasts the poll becomes a lane flight
the ioLoop applies.

Not on this path: batches over :data:`INLINE_MAX`, every ``fdatasync``, the meta file,
rolling to a new segment, reads, the first write after a failed one; nor any batch for
:data:`INLINE_BACKOFF` seconds after :data:`INLINE_SLOW` writes in a row slower than
:data:`INLINE_STALL`. The periodic sync round runs beside these writes on the I/O
thread, and at most ``sync_every`` messages written from the loop are ever not yet
fsynced (see :meth:`InlineWrites.start_sync_round`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from .._format.codec import HEADER_SIZE
from . import lane as _lane
from .buffers import Lifecycle, wake
from .flight import MAX_FLIGHTS, Flight, LaneResult, LaneWrite
from .iothread import Hop
from .store import Job, JobResult

if TYPE_CHECKING:
    from .engine import Engine

#: A batch of at most this many bytes (records, headers included) is written inline.
INLINE_MAX = _lane.SMALL_MAX
#: An inline write slower than this (seconds) counts as slow.
INLINE_STALL = 0.01
#: This many slow inline writes in a row (one may just be the thread losing its CPU on
#: a busy machine) send the next batches to the writer thread ...
INLINE_SLOW = 3
#: ... for this many seconds.
INLINE_BACKOFF = 1.0
#: A producer alone writes at most this many puts in a row from ``put()`` itself (see
#: :func:`write_one`) before one goes the usual way and lets the loop's
#: other tasks run.
DIRECT_RUN = 32

_LIVE = (Lifecycle.OPEN, Lifecycle.SHUTDOWN)


class InlineWrites:
    """An engine's writes from the loop, and the sync round they run beside: the state
    of both is its own; the engine asks it through :meth:`kick`, :meth:`beside_next`,
    :meth:`before_next_done`, :meth:`round_done` and :meth:`finished`."""

    def __init__(self, e: Engine) -> None:
        self._e = e
        self._flush_soon = False  # flush() is scheduled for this loop iteration
        self._off_until = 0.0  # perf_counter time: no inline writes before it
        self._slow = 0  # inline writes in a row slower than INLINE_STALL
        self._beside: Flight | None = None  # a sync round that inline writes run beside
        self._beside_room = 0  # since_sync that writes beside it may reach: see _room
        self._beside_wake: asyncio.Future[None] | None = None  # see before_next_done
        self._deferred = 0  # bytes written inline beside it, not yet told to the store

    @property
    def flush_soon(self) -> bool:
        """Is :meth:`flush` scheduled for this loop iteration? (It decides whether a hop
        is needed: nothing is sent meanwhile.)"""
        return self._flush_soon

    @property
    def beside(self) -> Flight | None:
        """The sync round in flight that writes from the loop run beside, if any."""
        return self._beside

    @property
    def beside_wake(self) -> asyncio.Future[None] | None:
        """What the ioLoop waits on beside that round, with its flight (see
        :meth:`before_next_done`); None while it does not."""
        return self._beside_wake

    @property
    def deferred(self) -> int:
        """Bytes written beside the sync round, not yet told to the store."""
        return self._deferred

    def can_schedule(self) -> bool:
        """May a put that landed in an empty batch be left to :meth:`flush`? Only while
        nothing is in flight but a sync round (the ioLoop parked otherwise), and never with
        ``sync_every=1`` (there the puts the ioLoop gathers share one fsync)."""
        e = self._e
        return self.enabled() and self._free() and e.kick_error is None

    def enabled(self) -> bool:
        """Does the engine write small batches from the loop (inline, or polled on the native
        writer) rather than through the ioLoop? Wherever the native writer is, except
        with ``sync_every=1``."""
        e = self._e
        return e.lane is not None and e.sync_every != 1

    def _free(self) -> bool:
        """Nothing but a sync round running beside inline writes is in flight."""
        e = self._e
        flights = e.flights
        if not flights:
            return e.parked
        return len(flights) == 1 and flights[0] is self._beside

    def flush(self) -> None:
        """Write the engine's pending batch now if it is small and nothing else is due; else send
        it to the write lane or wake the ioLoop, as a put did before inline writes."""
        e = self._e
        self._flush_soon = False
        size = e.pending_bytes
        if not size:
            return
        if not self._may_write(size, len(e.pending)):
            e._direct_left = 0  # only a batch written here says whether a producer is alone
            self.kick_lane()
            wake(e.put_req)
            wake(self._beside_wake)  # the ioLoop waits for the round beside: see beside_next
            return
        payloads, waiters = e.pending, e.put_waiters
        e.pending, e.put_waiters, e.pending_bytes = [], [], 0
        # One producer alone (one put, awaited): its next puts may be written at once.
        e._direct_left = DIRECT_RUN if len(payloads) == 1 and len(waiters) == 1 else 0
        self._write(payloads, waiters, size)

    def _may_write(self, size: int, puts: int) -> bool:
        """May a batch of ``puts`` messages (``size`` bytes as records) be written from the
        loop now? Not while anything but a sync round is in flight, nor when something else
        is due first (a sync, a meta, a purge, a read ahead), nor a batch over
        :data:`INLINE_MAX`, nor one that would cross into the next segment."""
        e = self._e
        fd = e.store.writer_fd
        return not (not self.can_schedule() or size > INLINE_MAX or fd is None
                    or e.sched.lane_error is not None or e.state not in _LIVE
                    or e.write_at[1] + size > e.store.max_bytes
                    or (self._off_until and time.perf_counter() < self._off_until)
                    or e.sync_waiters or e.meta_due or e.purge_waiters or e.read_due()
                    or e.since_sync + puts > self._room())

    def _room(self) -> int:
        """How far ``since_sync`` may go with writes from the loop: to ``sync_every``, or,
        beside a sync round, to what that round leaves of it (it covers what came before)."""
        e = self._e
        return e.sync_every if self._beside is None else self._beside_room

    def _write(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
               size: int) -> None:
        """Write a batch that :meth:`_may_write` allowed, and apply it, or leave it to the
        ioLoop if the writer is still at it when the poll gives up, or if it failed to start."""
        e = self._e
        lane, fd = e.lane, e.store.writer_fd
        assert lane is not None and fd is not None
        file_num, pos = e.write_at
        sync_due = self._beside is None and (e.since_sync + len(payloads) >= self.half()
                                          or e.sync_round_due())
        e.since_sync += len(payloads)
        e.sync_counted()
        try:
            if e.opts.inline_writes:
                t0 = time.perf_counter()
                outcome = lane.write_now(fd, payloads, pos)
                self._pace(time.perf_counter() - t0)
            else:
                polled = lane.write_polled(fd, payloads, pos)
        except BaseException as exc:  # noqa: BLE001 - the ioLoop raises it, not the put
            e.kick_failed(exc, waiters)  # the waiters are failed by the ioLoop's close
            return
        e.sched.lane_sent(pos + size)
        if not e.opts.inline_writes:
            if not isinstance(polled, tuple):
                # The writer is still at it: a lane write in flight, which the ioLoop hands to
                # finished() once the eventfd says it is done (even before a sync round
                # beside it: the producers never wait for that round).
                e.flights.append(self._lane_flight(payloads, waiters, polled, file_num, pos,
                                                    size, from_loop=True))
                wake(e.put_req if self._beside_wake is None else self._beside_wake)
                return
            outcome = polled
        self.applied(payloads, waiters, file_num, pos, size, outcome, sync_due)

    def applied(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
                file_num: int, pos: int, size: int, outcome: LaneResult, sync_due: bool,
                stale: bool = False) -> None:
        """Apply a batch that :meth:`flush` wrote (``outcome``: written, errno, 0) through
        :meth:`.Engine.landed`, without a hop's objects; a failure as a failed lane write.
        ``stale``: purged since it was sent (see :meth:`finished`)."""
        e = self._e
        n = len(payloads)
        if outcome[1]:
            self._failed(payloads, waiters, file_num, pos, size, outcome)
            return
        if self._beside is None:
            st = e.store
            st.appended(size, False)
            e.bytes_on_disk = st.bytes_on_disk
        else:  # the store takes it when the sync round beside which it ran is done
            self._deferred += size
            e.bytes_on_disk += size
        handoff = None if stale else e.sched.handoff(payloads, file_num, pos, size)
        e.landed(n, waiters, (file_num, pos + size), handoff, size - HEADER_SIZE * n, stale)
        if handoff is None and not stale and e.corruption is None:
            # Left on disk (the read-ahead is full, or the batch is larger than it): the
            # consumer asks for the read at its low-water mark (see Scheduler.refill), and one
            # that waits already gets it from the ioLoop now.
            e.refill_at = e.low_water
            if e.read_due():
                wake(e.put_req)
                wake(self._beside_wake)
        if e.putters or e.getters:
            e.wake_waiters()
        if sync_due:
            self.start_sync_round()
        elif e.timer is None or e.timer.done():
            wake(e.put_req)  # the ioLoop arms the periodic sync timer

    def kick(self) -> bool:
        """A put landed in the engine's empty pending batch. With nothing in flight, schedule
        :meth:`flush` at the end of this loop iteration and return True (the ioLoop need not
        wake); else send the batch as a second lane write while one runs, so the writer
        works while the loop runs the producers, and return False."""
        e = self._e
        if self.can_schedule():
            if not self._flush_soon:
                self._flush_soon = True
                loop = e.loop
                assert loop is not None
                loop.call_soon(self.flush)
            return True
        self.kick_lane()
        return False

    def kick_lane(self) -> None:
        """Send the pending batch to the write lane now if it may go: as the first hop while
        the ioLoop is parked, or chained behind a lane write in flight."""
        e = self._e
        flights = e.flights
        if len(flights) >= MAX_FLIGHTS or e.sync_every == 1:
            # With sync_every=1 a batch sent now would pay an fsync for this put alone:
            # the puts the ioLoop gathers first share one instead (group commit).
            return
        if flights:
            if not flights[-1].on_lane:
                return
        elif not e.parked:
            return
        if e.state not in _LIVE or e.purge_waiters or e.kick_error is not None:
            return
        e.sched.send_next_flight()

    def start_sync_round(self) -> None:
        """Send the due sync round (fdatasync, the meta) to the I/O thread as a hop of its
        own, once half of ``sync_every`` puts are written; while it runs, inline writes go
        on beside it, so producers never wait for its fdatasync.

        The round covers every message written before it (a batch may take it past half);
        those written beside it stay below ``sync_every`` together with them (a batch
        that would take the count past it goes to the ioLoop, which writes and fsyncs it
        in one hop): at most ``sync_every`` messages written from the loop are ever not
        yet fsynced. Its meta is the state before the writes beside it, which the store
        learns of when the round is done (see :meth:`round_done`)."""
        e = self._e
        covered = e.since_sync + len(e.pending)  # the round takes what is pending too
        flight = e.next_flight(sync_at=self.half())  # the round is due at half of sync_every
        if flight is not None:
            job = flight.job
            if (not flight.on_lane and job.payloads is None and job.read_from is None
                    and not job.reset_writer):
                # A sync round only: writes from the loop may run beside it. The ioLoop's own
                # rounds (by time, or for a consumer) are not: lane reads go beside those.
                self._beside = flight
                # Written beside it, and with it not yet fsynced: fewer than sync_every (the
                # put that reaches sync_every waits for the round, as before).
                self._beside_room = max(0, e.sync_every - covered - 1)
            e.flights.append(flight)
            wake(e.put_req)

    def round_done(self, flight: Flight) -> JobResult:
        """The sync round beside inline writes is done: the store takes those writes now;
        the round's result, with the write position they reached (raises what it raised)."""
        e = self._e
        self._beside = None
        st = e.store
        if self._deferred:
            st.appended(self._deferred, False)
            self._deferred = 0
        res: JobResult = flight.fut.result()
        res.write_at = (st.write_file, st.write_pos)
        res.bytes_on_disk = st.bytes_on_disk
        return res

    async def before_next_done(self) -> bool:
        """Before the ioLoop waits for its oldest flight: poll for it if it is a small lane
        write (see :meth:`.lane.WriteLane.poll`); if it is the sync round beside the loop's
        writes, alone, wait for it or until one of those writes outlasts its poll and joins
        the flights (:meth:`flush` wakes :attr:`beside_wake`), whose producers must not wait for
        the round. False if the flights changed meanwhile (look at them again)."""
        e = self._e
        first = e.flights[0]
        if first is self._beside and len(e.flights) == 1:
            loop = e.loop
            assert loop is not None
            self._beside_wake = loop.create_future()
            try:
                await asyncio.wait([first.fut, self._beside_wake],
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._beside_wake = None
            return first.fut.done()
        if (first.lane is not None and first.lane.total <= INLINE_MAX and not first.job.sync
                and not first.fut.done() and e.lane is not None):
            e.lane.poll()
        return True

    def beside_next(self) -> Flight | None:
        """What the ioLoop sends while the sync round beside the loop's writes runs: a read
        ahead the consumer is due, on the lane beside the round (nothing else in flight);
        pending puts go to :meth:`flush` once no read is due. Nothing else: the rest waits
        for the round."""
        e = self._e
        if len(e.flights) != 1:
            return None
        flight = e.sched.lane_read()
        if (flight is None and e.pending and not self._flush_soon
                and self._may_write(e.pending_bytes, len(e.pending))):
            self._flush_soon = True
            loop = e.loop
            assert loop is not None
            loop.call_soon(self.flush)
        return flight

    def finished(self, flight: Flight) -> None:
        """Apply a write of :meth:`flush` that outlasted its poll, once the writer is done with
        it (perhaps while the sync round beside which it was sent still runs): as
        :meth:`applied` does for one the poll caught, starting the sync round if it is due."""
        e = self._e
        lw, payloads = flight.lane, flight.job.payloads
        assert lw is not None and payloads is not None
        sync_due = (e.state in _LIVE and self._beside is None
                    and (e.since_sync + len(e.pending) >= self.half() or e.sync_round_due()))
        self.applied(payloads, flight.waiters, lw.file_num, lw.pos, lw.total,
                     flight.fut.result(), sync_due, stale=flight.epoch != e.epoch)

    def _lane_flight(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
                     fut: Hop[Any], file_num: int, pos: int, size: int,
                     from_loop: bool = False) -> Flight:
        """The lane flight that a batch written by :meth:`flush` stands for."""
        e = self._e
        return Flight(Job(payloads=payloads), fut, e.epoch, waiters, [],
                      LaneWrite(file_num, pos, size, from_loop))

    def _failed(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
                file_num: int, pos: int, size: int, outcome: LaneResult) -> None:
        """Apply a write of :meth:`flush` that failed as a failed lane write: its batch
        fails, and the ioLoop wakes to cut the segment back before anything else is written."""
        e = self._e
        done: Hop[None] = Hop(loop=e.loop)  # stands in for a hop that already ran
        done.set_result(None)
        flight = self._lane_flight(payloads, waiters, done, file_num, pos, size)
        res = e.sched.lane_result(flight, outcome)
        if self._beside is not None:  # the store does not know the writes beside it yet
            res.write_at, res.bytes_on_disk = e.write_at, e.bytes_on_disk
        e.apply(flight, res)
        wake(e.put_req)

    def half(self) -> int:
        """Puts after which a sync round starts beside inline writes: half of
        ``sync_every``, so that about as many may be written beside it (see :meth:`_room`)."""
        e = self._e
        return max(1, e.sync_every // 2)

    def _pace(self, took: float) -> None:
        """Count slow inline writes; after INLINE_SLOW in a row, back off to the writer thread."""
        if took > INLINE_STALL:
            self._slow += 1
            if self._slow >= INLINE_SLOW:
                self._slow = 0
                self._off_until = time.perf_counter() + INLINE_BACKOFF
        else:
            self._slow = 0


def write_one(e: Engine, data: bytes, size: int, waiter: asyncio.Future[None]) -> bool:
    """Write one awaited put (``size`` bytes as a record) from ``put()`` itself, before it
    returns, if a producer is alone (the last batch :meth:`InlineWrites.flush` wrote was
    one awaited put) and that flush could write it now; False if not (the put takes the
    usual way). A function, not a method: ``DiskQueue.put`` calls it on the engine.

    A lone producer gains a loop iteration and a task switch per put: it goes on without
    suspending, as with ``asyncio.Queue.put``. After :data:`DIRECT_RUN` such puts in a row,
    a put takes the usual way, so the producer yields to the other tasks of the loop.
    ``waiter`` is done when this returns, unless the write outlasted its poll or failed
    to start: then it is done when the ioLoop has applied or failed it.
    """
    w = e.inline
    if e._direct_left <= 0 or e.pending or not w._may_write(size, 1):
        return False
    e._direct_left -= 1
    e.unwritten += 1
    e.puts += 1
    w._write([data], [waiter], size)
    return True
