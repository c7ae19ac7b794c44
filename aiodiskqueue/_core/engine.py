"""The ioLoop: one background task per queue that owns its files.

It sleeps in ``asyncio.wait(..., return_when=FIRST_COMPLETED)`` on the put,
purge, sync and exit requests, a read slot that is armed only while unread data
waits on disk, and a periodic fsync timer. Each time it wakes it builds one
:class:`~aiodiskqueue._core.store.Job` (write every pending put, sync, read ahead),
runs it in a single hop on the queue's I/O thread, and applies the result. While
a hop runs, producers keep appending to the next batch: the batch size adapts to
the load, and many producers never mean many thread hops.

Its helpers, each owning its state: :class:`~.schedule.Scheduler` (which native thread
a job may go to, and what its result means), :class:`~.inline.InlineWrites` (small
batches written from the loop) and, below them, :class:`~.lane.WriteLane` and
:class:`~.iothread.IOThread`. Every finished write goes through
:meth:`~.buffers.QueueBuffers.landed`, every waiter woken for room or a message through
:meth:`~.buffers.QueueBuffers.wake_waiters`.

The hot paths (``put``/``get``) live in :mod:`aiodiskqueue.queue` and touch
only in-memory state held here; every file operation goes through the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from .._format.access import as_queue_error, check_dir, make_dirs
from .._format.layout import Layout
from .._format.lock import QueueLock
from .._format.meta import Meta
from ..errors import DiskQueueError
from . import lane as _lane
from .buffers import Lifecycle, fail, succeed, wake
from .errorpaths import ErrorPaths
from .flight import MAX_FLIGHTS, Flight, next_done
from .inline import InlineWrites, write_one
from .iothread import IOThread
from .options import Options
from .recovery import OpenState
from .schedule import Scheduler
from .store import Job, JobResult, SegmentStore

log = logging.getLogger(__name__)

class Engine(ErrorPaths):
    """The task that moves one open queue's buffers to and from disk."""

    # DiskQueue.put's direct write: the function itself, so a put calls no extra frame.
    write_one = write_one

    def __init__(self, layout: Layout, opts: Options) -> None:
        super().__init__(layout, opts)
        self.timer: asyncio.Future[None] | None = None
        self._timer_handle: asyncio.TimerHandle | None = None
        self._sync_due_at = 0.0
        self.meta_due = False  # the next sync round stores the meta: the first after open
        self._last_meta: Meta | None = None
        self._batch_waiters: list[asyncio.Future[None]] = []
        self._sync_batch: list[asyncio.Future[None]] = []
        self.flights: deque[Flight] = deque()  # hops in flight, oldest first

        self.store = SegmentStore(layout, opts.max_bytes_per_file, opts.min_msg_size,
                                  opts.max_msg_size, opts.strict)
        self.lock = QueueLock(layout.lock_path, layout.file_mode)
        self.io: IOThread | None = None
        self.lane: _lane.WriteLane | None = None
        self.parked = False  # the ioLoop waits between hops: a put may send a hop itself
        self.kick_error: BaseException | None = None  # what kick() hit, for the ioLoop
        # Puts a lone producer may still write itself: read by DiskQueue.put on every put,
        # so it lives here, not in self.inline, which sets it (InlineWrites.write_one).
        self._direct_left = 0
        self.inline = InlineWrites(self)
        self.sched = Scheduler(self)
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ start / stop

    async def start(self) -> None:
        """Lock the queue, recover its state and start the ioLoop.

        Raises QueueLocked if it is open elsewhere, DiskQueueError on I/O errors.
        """
        self.loop = asyncio.get_running_loop()
        self.io = IOThread(f"aiodiskqueue-io-{self.layout.name}")
        try:
            st: OpenState = await self.io.run(self._open_blocking)
        except BaseException as exc:
            self.io.stop()
            self.io = None
            self.settle()
            self.state = Lifecycle.CLOSED
            if isinstance(exc, PermissionError):
                raise as_queue_error(exc, self.layout.directory) from exc
            if isinstance(exc, OSError) and not isinstance(exc, DiskQueueError):
                raise DiskQueueError(f"cannot open queue {self.layout.name!r} in "
                                     f"{self.layout.directory!r}: {exc}") from exc
            raise
        m = st.meta
        self.depth = m.depth
        self.runs.reset(m.read)
        self.read_at = m.read
        self.write_at = m.write
        self.bad_files = st.bad_files
        self.bytes_on_disk = st.bytes_on_disk
        self.recovered = st.recovered
        self._check_depth_floor()
        self._last_meta = None  # the first sync always stores a meta of ours
        self.meta_due = True
        loop = self.loop
        self.put_req = loop.create_future()
        self.sync_req = loop.create_future()
        self.purge_req = loop.create_future()
        self.exit_req = loop.create_future()
        self._sync_due_at = loop.time() + self.opts.sync_interval
        if _lane.available():
            try:
                self.lane = _lane.WriteLane(loop, self.opts.spin_us)
                self.native_lane = True
            except OSError as exc:  # e.g. out of eventfds: the I/O thread writes instead
                log.warning("%s: native write lane unavailable: %s", self.layout.meta_path, exc)
        self.state = Lifecycle.OPEN
        log.debug("%s: opened, depth %d, write path %s", self.layout.meta_path, self.depth,
                  "native write lane" if self.native_lane else "Python I/O thread")
        self.task = loop.create_task(self._run(), name=f"aiodiskqueue-{self.layout.name}")

    def _open_blocking(self) -> OpenState:
        check_dir(self.layout.directory)
        make_dirs(self.layout.directory, self.layout.dir_mode)
        self.lock.acquire()
        try:
            return self.store.open()
        except BaseException:
            self.store.close()
            self.lock.release()
            raise

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        io = self.io
        assert io is not None
        busy = False
        flights = self.flights
        try:
            while True:
                if self.kick_error is not None:
                    raise self.kick_error
                if self.purge_waiters and not flights:
                    await self._purge()
                    continue
                if self.state is Lifecycle.CLOSING and not flights:
                    break  # _finish() writes what is pending and syncs, a bounded number of times
                if (len(flights) < MAX_FLIGHTS and not self.purge_waiters
                        and self.state is not Lifecycle.CLOSING):
                    flight = self.next_flight()
                    if flight is not None:
                        flights.append(flight)
                        continue
                if flights:
                    if not await self.inline.before_next_done():
                        continue  # a write from the loop joined the sync round in flight
                    # A Hop cannot be cancelled: if this task is, the hop still finishes
                    # and _finish() applies its result, so no put waiter is left hanging.
                    self._complete(await next_done(flights))
                    busy = True
                    continue
                if self.state is Lifecycle.CLOSING:
                    break
                self.parked = True
                try:
                    if busy:
                        # The producers the last hop woke have not run yet: let them
                        # append their next puts, which is far cheaper than going idle.
                        busy = False
                        await asyncio.sleep(0)
                        continue
                    await self._idle()
                finally:
                    self.parked = False
        except asyncio.CancelledError:
            pass  # treated as a close: _finish() flushes and syncs
        except BaseException as exc:
            log.exception("%s: ioLoop failed", self.layout.meta_path)
            self._break(exc)
        finally:
            await self._finish()

    def next_flight(self, sync_at: int | None = None) -> Flight | None:
        """Build and send the next hop, if there is work and it may go now.

        Hops on the write lane and on the I/O thread never overlap: the lane only
        appends inside the current segment, everything else (rolling files, meta,
        reads) runs on the I/O thread once the lane is idle. Nothing is sent while an
        inline write is scheduled: it decides whether a hop is needed. ``sync_at``: the
        ``since_sync`` that makes the job a sync round (``sync_every`` if None).
        """
        inline = self.inline
        if inline.flush_soon:
            return None
        if inline.beside is not None:
            return inline.beside_next()
        flights, sched = self.flights, self.sched
        size = self.pending_bytes  # the records' bytes, headers included; a job takes them all
        flight, hold, sync_first = sched.read_first()
        if flight is not None or hold:
            return flight
        if flights and flights[-1].meta is not None:
            return None  # only a read goes behind a meta store on the lane (read_first)
        if flights and flights[-1].on_lane:
            if (sched.full_hop_due()
                    or not sched.lane_fits(sched.lane_end, size, self.sync_every == 1)):
                return None
            job = self._build_job(pipelined=True)
            return None if job is None else sched.dispatch_write(job, sched.lane_end, size)
        job = self._build_job(pipelined=bool(flights), read=not sync_first, sync_at=sync_at)
        if job is None:
            return sched.lane_read() if sync_first else None
        meta_flight = sched.meta_job(job)
        if meta_flight is not None:
            return meta_flight
        if (not flights and job.payloads and job.read_from is None and job.meta_read is None
                and not job.reset_writer
                and sched.lane_fits(self.write_at[1], size, job.sync)):
            return sched.dispatch_write(job, self.write_at[1], size)
        return self._dispatch(job)

    def kick(self) -> bool:
        """Called when a put lands in an empty pending batch: see :meth:`.InlineWrites.kick`."""
        return self.inline.kick()

    def kick_failed(self, exc: BaseException,
                    waiters: list[asyncio.Future[None]] | None = None) -> None:
        """Sending work from a put or a take failed: the ioLoop raises ``exc`` (not the
        caller) and its close fails ``waiters``."""
        if waiters is not None:
            self._batch_waiters = waiters
        self.kick_error = exc
        wake(self.put_req)

    def sync_round_due(self) -> bool:
        """Is the periodic sync round due: by count (the pending puts included) or time?"""
        if self.since_sync + len(self.pending) >= self.sync_every:
            return True
        loop = self.loop
        assert loop is not None
        return loop.time() >= self._sync_due_at and (self.since_sync > 0 or self._meta_changed())

    def read_due(self) -> bool:
        """Does a consumer that fell behind the writer need a read ahead?"""
        return (self.read_at < self.write_at and self.ready_bytes <= self.low_water
                and self.corruption is None)

    def _dispatch(self, job: Job) -> Flight:
        assert self.io is not None
        if job.read_from is not None:
            job.read_budget = self.sched.io_read_budget(job.read_budget)
        waiters, syncs = self.take_batch()
        return Flight(job, self.io.run(self.store.run, job), self.epoch, waiters, syncs)

    def take_batch(self) -> tuple[list[asyncio.Future[None]], list[asyncio.Future[None]]]:
        """The put and sync waiters of the job just built, for the flight that sends it."""
        taken = self._batch_waiters, self._sync_batch
        self._batch_waiters, self._sync_batch = [], []
        return taken

    def redo_on_thread(self, flight: Flight) -> None:
        """Send a failed native meta store's job to the I/O thread, first, with its waiters:
        its portable steps redo the store or raise what is wrong."""
        assert self.io is not None
        self.flights.appendleft(Flight(flight.job, self.io.run(self.store.run, flight.job),
                                        self.epoch, flight.waiters, flight.sync_waiters))

    @property
    def meta_lane(self) -> _lane.WriteLane | None:
        """The native thread for meta stores, once one was made."""
        return self.sched.meta_lane

    def refill(self) -> None:
        """The read-ahead is at its low-water mark: see :meth:`.Scheduler.refill`."""
        self.sched.refill()

    def _complete(self, flight: Flight) -> None:
        """Apply a finished flight's result (raises what the I/O thread raised, after
        failing the flight's waiters with a DiskQueueError)."""
        try:
            if flight is self.inline.beside:
                res = self.inline.round_done(flight)
            elif flight.read is not None:
                res = self.sched.read_result(flight)
            elif flight.meta is not None:
                found = self.sched.meta_result(flight)
                if found is None:
                    return  # redone on the I/O thread
                res = found
            elif flight.lane is None:
                res = flight.fut.result()
            elif flight.lane.from_loop:
                # A write from the loop that outlasted its poll (perhaps done while the sync
                # round beside which it was sent still runs): applied as a caught one is.
                self.inline.finished(flight)
                return
            else:
                res = self.sched.lane_result(flight)
        except BaseException as exc:
            if flight.job.payloads is not None:
                self.unwritten = max(0, self.unwritten - len(flight.job.payloads))
            self._fail_flight(flight, exc)
            raise
        try:
            self.apply(flight, res)
        except BaseException as exc:
            self._fail_flight(flight, exc)
            raise

    async def _finish(self) -> None:
        """Apply the hops in flight, write what is pending, sync, close. Never raises."""
        io = self.io
        assert io is not None
        while self.flights:
            flight = self.flights[0]
            if not flight.fut.done():
                await asyncio.wait([flight.fut])
            try:
                self._complete(self.flights.popleft())
            except BaseException as exc:  # noqa: BLE001 - its waiters are failed; go on
                log.error("%s: a write in flight at close failed: %r", self.layout.meta_path, exc)
                if self.state is not Lifecycle.BROKEN:
                    self._break(exc)
        if self.state is not Lifecycle.BROKEN:
            try:
                await self._final_flush()
            except BaseException:
                log.exception("%s: final flush failed", self.layout.meta_path)
        if self.lane is not None:
            self.lane.close()
            self.lane = None
            self.native_lane = False
        self.sched.close()
        try:
            await io.run(self.store.close)
        except BaseException:
            log.exception("%s: error while closing", self.layout.meta_path)
        io.stop()
        self.lock.release()
        if self._timer_handle is not None:
            self._timer_handle.cancel()
        self.io = None
        if self.state is not Lifecycle.BROKEN:
            self.settle()
            self.state = Lifecycle.CLOSED
        err = self.closed_error()
        for group in (self.put_waiters, self._batch_waiters, self.sync_waiters,
                      self._sync_batch, self.purge_waiters):
            fail(group, err)
        self.wake_all_getters()
        self.wake_all_putters()

    def _build_job(self, pipelined: bool, read: bool = True, sync_at: int | None = None
                   ) -> Job | None:
        """The next hop's work; None if there is nothing to do.

        A pipelined job is sent while another hop is in flight: it only writes
        (and, with ``sync_every=1``, fsyncs the data), because reading ahead,
        handing over and storing the meta depend on the result of the hop before.
        """
        loop = self.loop
        assert loop is not None
        job = Job()
        if not pipelined and self.sched.take_lane_error():
            job.reset_writer = True
        if pipelined:
            if not self.pending:
                return None
            job.payloads = self._take_pending()
            self.since_sync += len(job.payloads)
            self.sync_counted()
            job.sync = self.sync_every == 1
            self._sync_batch = []
            return job
        if self.pending:
            moved = self.pending_bytes
            job.payloads = self._take_pending()
            job.handoff = (self.read_at == self.write_at
                           and self.ready_bytes + moved <= self.opts.read_buffer_bytes)
            self.since_sync += len(job.payloads)
            self.sync_counted()
        else:
            self._batch_waiters = []
        closing = self.state is Lifecycle.CLOSING
        dirty = self.since_sync > 0 or self._meta_changed()
        # The meta stored once after open comes after the first read ahead, not in its hop:
        # a reopened backlog's first messages do not wait for two fsyncs, and the meta
        # then goes to the native meta thread beside the next read (Scheduler.meta_job).
        first_read = (self.meta_due and read and not closing and not job.payloads
                      and not self.sync_waiters and not self.ready and not self.gets
                      and self.read_due())
        force = ((self.meta_due and not first_read) or bool(self.sync_waiters) or closing
                 or (dirty and loop.time() >= self._sync_due_at))
        if sync_at is None:
            sync_at = self.sync_every
        if ((force or (self.since_sync >= sync_at
                       and (self.sync_may_retry() or (job.payloads and self.sync_every == 1))))
                and (dirty or self.sync_waiters)):
            job.sync = True
            job.wait_removed = bool(self.sync_waiters)  # sync() returns with consumed files gone
            self._sync_batch = self.sync_waiters
            self.sync_waiters = []
            consumer_at = self.stored_at()  # a take's messages in hand stay unconsumed
            last = self._last_meta
            store_meta = (force or last is None or consumer_at != last.read
                          or self.write_at[0] != last.write_file_num)
            if store_meta:
                job.meta_read = consumer_at
                job.meta_depth = self.depth + self.handing
            self.since_sync = self.handing
            self.sync_counted()
            self.meta_due = False
            self._sync_due_at = loop.time() + self.opts.sync_interval
        else:
            self._sync_batch = []
        if (read and self.read_at < self.write_at and self.ready_bytes <= self.low_water
                and not closing and self.corruption is None):
            job.read_from = self.read_at
            job.read_budget = self.opts.read_buffer_bytes - self.ready_bytes
        if self._recount_wanted and not closing:
            self._recount_wanted = False
            job.recount_from = self.read_at
        if (job.payloads is None and not job.sync and job.read_from is None
                and not job.reset_writer and job.recount_from is None):
            return None
        return job

    def _take_pending(self) -> list[bytes]:
        """Move every pending message, and the put waiters, into the next hop."""
        taken = self.pending
        self._batch_waiters = self.put_waiters
        self._direct_left = 0  # a batch not written by InlineWrites.flush: see write_one
        self.pending, self.put_waiters = [], []
        self.pending_bytes = 0
        return taken

    def _meta_changed(self) -> bool:
        m = self._last_meta
        return m is None or m.read != self.consumer_at() or m.write != self.write_at

    def apply(self, flight: Flight, res: JobResult) -> None:
        """Apply the result of a finished flight: its write through :meth:`landed`, its
        sync round, its read ahead, recount and quarantined files; wake whoever waits."""
        job, batch, syncs = flight.job, flight.waiters, flight.sync_waiters
        stale = flight.epoch != self.epoch
        self.write_at = res.write_at
        self.bytes_on_disk = res.bytes_on_disk
        if job.payloads is not None:
            n = len(job.payloads)
            if res.write_error is not None:
                self.unwritten -= n
                self._write_failed(n, batch, res.write_error)
            else:
                unsynced = None
                if self.sync_every == 1 and not res.synced:
                    unsynced = DiskQueueError(f"fsync failed; {n} message(s) written but not "
                                              f"known to be durable: {res.sync_error}")
                    unsynced.__cause__ = res.sync_error
                self.landed(n, batch, res.write_at, res.handoff, res.handoff_bytes, stale,
                            unsynced)
        # A lane write that failed never reached its fdatasync (and carries no sync waiters).
        if job.sync and (flight.lane is None or res.write_error is None):
            if res.synced:
                self.syncs += 1
                if res.meta is not None:
                    self._last_meta = res.meta
                self._sync_succeeded()
                succeed(syncs)
            else:
                fail(syncs, self._sync_failed(res.sync_error, bool(syncs)))
        if res.read_error is not None:
            log.error("%s: read ahead failed at %s: %s", self.layout.meta_path, job.read_from,
                      res.read_error)
        elif job.read_from is not None and not stale and res.read_to is not None:
            if flight.read is None:
                self.sched.thread_read()
            self.add_ready(res.records, res.records_bytes)
            self.read_at = res.read_to
            if res.corruption is not None:
                log.error("%s", res.corruption)
                self.corruption = res.corruption
                self.wake_all_getters()
        if job.recount_from is not None and not stale:
            if res.remaining is not None and not res.quarantined and res.handoff is None:
                self.depth = len(self.ready) + res.remaining
                self._recounted_at = self.read_at
            elif res.remaining is None:
                self._recount_wanted = True  # went to the write lane: ask again
        if res.quarantined and not stale:
            self.bad_files += len(res.quarantined)
            if res.remaining is not None:
                self.depth = len(self.ready) + res.remaining
            if not self.ready:
                # Nothing unread lies before the cursor: move the consumer position past
                # the quarantined files, so the next meta does not point into one.
                self.runs.reset(self.read_at)
        if self.read_at == self.write_at and self.depth != len(self.ready) and not stale:
            # Every written record is now either ready or taken, so the depth is known
            # exactly: a wrong depth from a meta file stops here instead of drifting.
            log.info("%s: depth corrected from %d to %d", self.layout.meta_path, self.depth,
                     len(self.ready))
            self.depth = len(self.ready)
        if not stale:
            self._check_depth_floor()
        self.wake_waiters()
        # The consumer sends the next read itself at the low-water mark (see refill).
        self.refill_at = (self.low_water if self.read_at < self.write_at
                          and self.corruption is None else -1)

    async def _idle(self) -> None:
        loop = self.loop
        assert loop is not None
        waits: list[asyncio.Future[None]] = []
        for name in ("put_req", "sync_req", "purge_req", "exit_req"):
            fut = getattr(self, name)
            if fut.done():  # consumed: re-arm
                fut = loop.create_future()
                setattr(self, name, fut)
            waits.append(fut)
        if self.state is Lifecycle.CLOSING:
            return
        # The read slot is armed only while unread data waits on disk.
        if self.read_at < self.write_at and self.corruption is None:
            if self.read_slot is None or self.read_slot.done():
                self.read_slot = loop.create_future()
            self.refill_at = self.low_water
            waits.append(self.read_slot)
        else:
            self.read_slot = None
        if self.since_sync > 0 or self._meta_changed():
            if self.timer is None or self.timer.done():
                self.timer = loop.create_future()
                delay = max(0.0, self._sync_due_at - loop.time())
                self._timer_handle = loop.call_later(delay, wake, self.timer)
            waits.append(self.timer)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)

    async def _purge(self) -> None:
        assert self.io is not None
        waiters, self.purge_waiters = self.purge_waiters, []
        try:
            meta: Meta = await self.io.run(self.store.purge)
        except OSError as exc:
            err = DiskQueueError(f"purge of {self.layout.meta_path} failed: {exc}")
            err.__cause__ = exc
            fail(waiters, err)
            return
        self.purged(meta)
        self._last_meta = meta
        self.bytes_on_disk = self.store.bytes_on_disk
        succeed(waiters)

    def _break(self, exc: BaseException) -> None:
        self.settle()
        self.state = Lifecycle.BROKEN
        self.error = exc
