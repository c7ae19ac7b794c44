"""Which native thread a job of the engine goes to, and what its result means.

The engine builds each hop's :class:`~aiodiskqueue._core.store.Job`; :class:`Scheduler`
says whether it may go to the native write lane (appends inside the current segment),
as a plain read to the same lane, or as a meta store to the native meta thread, sends
it there, and turns the native thread's outcome into the
:class:`~aiodiskqueue._core.store.JobResult` the I/O thread would have given. Lane and
I/O thread never write at the same time; a read goes beside a sync round.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import TYPE_CHECKING

from .._format.codec import HEADER_SIZE, parse_payloads
from .._format.meta import Meta
from .buffers import Lifecycle, wake
from .flight import Flight, LaneRead, LaneResult, LaneWrite, round_only
from .lane import OPENING_READ_BYTES, WriteLane
from .position import Stretch
from .store import Job, JobResult

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)


class Scheduler:
    """What an engine sends to its native threads (lane writes, lane reads, meta stores)
    and when, and what their results mean: the state of those jobs is its own. The engine
    builds the jobs and applies the results; it asks this class where a job may go."""

    def __init__(self, e: Engine) -> None:
        self._e = e
        self._lane_end = 0  # write offset after the last batch sent to the lane
        # A lane write failed: the next hop on the I/O thread resets the writer. Set only here.
        self.lane_error: OSError | None = None
        self._read_on_thread = False  # a lane read met something unusual: the I/O thread reads
        self._read_buf: mmap.mmap | None = None  # what lane reads read into
        self.meta_lane: WriteLane | None = None  # a consumer's meta stores (meta_job)
        self._meta_lane_failed = False

    @property
    def lane_end(self) -> int:
        """The write offset after the last batch sent to the write lane."""
        return self._lane_end

    def lane_sent(self, end: int) -> None:
        """A batch written from the loop ends at offset ``end`` of the write segment."""
        self._lane_end = end

    def take_lane_error(self) -> bool:
        """Did a lane write fail since the last call? Then the next hop on the I/O thread
        cuts the segment back (resets the writer)."""
        failed = self.lane_error is not None
        self.lane_error = None
        return failed

    def thread_read(self) -> None:
        """The I/O thread has read ahead: the next plain read may go to the lane again."""
        self._read_on_thread = False

    def close(self) -> None:
        """Stop the native meta thread, if one was made."""
        if self.meta_lane is not None:
            self.meta_lane.close()
            self.meta_lane = None

    def handoff(self, payloads: list[bytes], file_num: int, pos: int, size: int
                ) -> Stretch | None:
        """Where a batch appended at ``pos`` of segment ``file_num`` (``size`` bytes as
        records) lies, if the reader has caught up to it and it fits the read-ahead: it
        is handed over, no read needed. Else None."""
        e = self._e
        if (e.read_at == (file_num, pos) and e.corruption is None
                and e.ready_bytes + size <= e.opts.read_buffer_bytes):
            return Stretch(payloads, file_num, pos, pos + size)
        return None

    def lane_result(self, flight: Flight, outcome: LaneResult | None = None) -> JobResult:
        """Turn ``e``'s lane flight's (written, write errno, sync errno), its future's result
        unless ``outcome`` is given (an inline write), into a JobResult.

        A failed write fails every lane batch queued behind it too: their offsets
        assumed it succeeded. The next hop on the I/O thread cuts the segment back.
        """
        e = self._e
        lw, job = flight.lane, flight.job
        assert lw is not None and job.payloads is not None
        _written, werr, serr = outcome if outcome is not None else flight.fut.result()
        st = e.store
        res = JobResult()
        if werr or self.lane_error is not None:
            if werr:
                self.lane_error = OSError(werr, os.strerror(werr))
            res.write_error = self.lane_error
        else:
            synced = job.sync and not serr
            st.appended(lw.total, synced)
            res.written = len(job.payloads)
            if job.sync:
                res.synced = synced
                if serr:
                    res.sync_error = OSError(serr, os.strerror(serr))
            res.handoff = self.handoff(job.payloads, lw.file_num, lw.pos, lw.total)
            if res.handoff is not None:
                res.handoff_bytes = lw.total - HEADER_SIZE * len(job.payloads)
        res.write_at = (st.write_file, st.write_pos)
        res.bytes_on_disk = st.bytes_on_disk
        return res

    def read_plan(self, job: Job) -> tuple[int, int, int] | None:
        """``(fd, offset, nbytes)`` if ``job`` is a plain read the lane may do instead of
        the I/O thread; else None. Called while no hop but a sync round is in flight."""
        e = self._e
        if (job.read_from is None or job.payloads is not None or job.sync or job.reset_writer
                or job.recount_from is not None or e.lane is None or self.lane_error is not None
                or self._read_on_thread):
            return None
        span = e.store.lane_read_from(*job.read_from)
        if span is None:
            return None
        fd, stop = span
        pos = job.read_from[1]
        return fd, pos, min(stop - pos, job.read_budget)

    def io_read_budget(self, budget: int) -> int:
        """The budget of a read sent to the I/O thread: :data:`OPENING_READ_BYTES` at most
        while this thread takes the reads after it (read_plan), else ``budget``."""
        e = self._e
        if e.lane is None or self.lane_error is not None or self._read_on_thread:
            return budget
        return min(budget, OPENING_READ_BYTES)

    def read_result(self, flight: Flight) -> JobResult:
        """Split the finished lane read of ``flight`` into records: the JobResult the I/O
        thread's read would give for them. Anything unusual is left to the I/O thread: the
        next read goes there and meets it as before."""
        e = self._e
        lr = flight.read
        assert lr is not None
        nread, err, _ = flight.fut.result()
        st = e.store
        res = JobResult(write_at=(st.write_file, st.write_pos), bytes_on_disk=st.bytes_on_disk)
        if e.inline.beside is not None:
            # Beside the sync round that the loop's writes run beside, the store does not know
            # those writes yet (InlineWrites.round_done tells it): the engine's own position stands.
            res.write_at, res.bytes_on_disk = e.write_at, e.bytes_on_disk
        if err:
            self._read_on_thread = True
            res.read_error = OSError(err, os.strerror(err))
            return res
        # Split straight out of the reused buffer: the records are new bytes objects.
        payloads, stop, bad = parse_payloads(memoryview(lr.buf)[:nread], lr.pos, e.min_size,
                                             e.max_size)
        if bad is not None or not payloads or nread < lr.nbytes:
            self._read_on_thread = True
        res.records = Stretch(payloads, lr.file_num, lr.pos, stop)
        res.records_bytes = stop - lr.pos - HEADER_SIZE * len(payloads)
        res.read_to = (lr.file_num, stop)
        return res

    def meta_job(self, job: Job) -> Flight | None:
        """Send ``job`` to the native meta thread if it is a sync round that only stores the
        meta (a consumer's, typically) and nothing else is in flight; else None.

        A Python thread takes the GIL back after each system call, and a consumer taking
        ready messages holds it for up to the interpreter's switch interval each time: such
        a round took 8-9 ms on the I/O thread against about 1 ms of system calls, and the
        consumer, which may take only ``sync_every`` messages plus the read-ahead past a
        stored meta, waited for it. A native thread needs no GIL.
        """
        e = self._e
        if (e.lane is None or e.flights or not job.sync or job.meta_read is None or job.wait_removed
                or job.payloads is not None or job.read_from is not None
                or job.recount_from is not None or job.reset_writer or e.inline.beside is not None
                or e.inline.deferred or e.state is not Lifecycle.OPEN):
            return None
        st = e.store
        meta = Meta(job.meta_depth, *job.meta_read, st.write_file, st.write_pos)
        args = st.meta_swap(meta)
        if args is None or not self._meta_lane():
            return None
        assert self.meta_lane is not None
        fut = self.meta_lane.submit_swap(args)
        waiters, syncs = e.take_batch()
        return Flight(job, fut, e.epoch, waiters, syncs, meta=meta)

    def _meta_lane(self) -> bool:
        """Is there a native thread for meta stores (made on the first one)? Not the write
        lane's: a read queued behind a meta store's fsyncs would keep the consumer waiting.
        It sleeps between stores (no spin)."""
        e = self._e
        if self.meta_lane is None and not self._meta_lane_failed:
            loop = e.loop
            assert loop is not None
            try:
                self.meta_lane = WriteLane(loop, 0)
            except OSError as exc:  # e.g. out of eventfds: the I/O thread stores the meta
                self._meta_lane_failed = True
                log.warning("%s: no native thread for meta stores: %s", e.layout.meta_path, exc)
        return self.meta_lane is not None

    def meta_result(self, flight: Flight) -> JobResult | None:
        """The JobResult of a finished native meta store, as the I/O thread's round would give
        it. None if it failed: the job then goes to the I/O thread, first in line and with
        its waiters, whose portable steps redo the store or raise what is wrong."""
        e = self._e
        meta = flight.meta
        assert meta is not None
        _, _, err = flight.fut.result()
        st = e.store
        st.meta_swapped(meta, err)
        if err:
            e.redo_on_thread(flight)
            return None
        return JobResult(synced=True, meta=meta, write_at=(st.write_file, st.write_pos),
                         bytes_on_disk=st.bytes_on_disk)

    def full_hop_due(self) -> bool:
        """Is something due that only a hop built with no flight out can do (a sync
        round, the meta, a read for a consumer that fell behind)? Then no more lane
        writes are chained: busy producers would otherwise keep the lane in flight
        forever and starve syncs and reads."""
        e = self._e
        if e.sync_waiters or e.meta_due or e.purge_waiters:
            return True
        return e.sync_round_due() or e.read_due()

    def sync_wanted(self) -> bool:
        """Is a sync round (or the meta) due now?"""
        e = self._e
        return bool(e.sync_waiters) or e.meta_due or e.sync_round_due()

    def lane_read_job(self) -> tuple[Job, tuple[int, int, int]] | None:
        """The due read ahead and its plan, if it is a plain one the lane may do."""
        e = self._e
        if (not e.read_due() or e.recount_wanted or e.purge_waiters
                or e.state is Lifecycle.CLOSING):
            return None
        if e.flights and e.since_sync >= e.sync_every:
            # Beside a sync round only until the next one is due: the consumer takes no
            # more than sync_every messages plus the read-ahead between two stored metas,
            # as when the read waited for the round.
            return None
        job = Job(read_from=e.read_at, read_budget=e.opts.read_buffer_bytes - e.ready_bytes)
        plan = self.read_plan(job)
        return None if plan is None else (job, plan)

    def lane_read(self) -> Flight | None:
        """Send the due read ahead to the lane if it is a plain one, as the first flight or
        beside a sync round on the I/O thread (which never touches the segment being read)."""
        found = self.lane_read_job()
        return None if found is None else self.dispatch_read(found[0], *found[1])

    def lane_fits(self, pos: int, size: int, sync: bool) -> bool:
        """Can a batch of ``size`` bytes go to the write lane as an append at ``pos``
        (followed by an fdatasync if ``sync``)?"""
        e = self._e
        if e.lane is None or self.lane_error is not None or e.state is Lifecycle.CLOSING:
            return False
        st = e.store
        if st.writer_fd is None or (sync and st.dir_dirty):
            return False
        return size > 0 and pos + size <= e.opts.max_bytes_per_file

    def dispatch_write(self, job: Job, pos: int, total: int) -> Flight:
        """Send ``job``'s batch (``total`` bytes as records) to the lane as an append at
        ``pos`` of the write segment."""
        e = self._e
        assert e.lane is not None and job.payloads is not None
        fd = e.store.writer_fd
        assert fd is not None
        fut = e.lane.submit(fd, job.payloads, pos, job.sync)
        self._lane_end = pos + total
        waiters, syncs = e.take_batch()
        return Flight(job, fut, e.epoch, waiters, syncs, LaneWrite(e.write_at[0], pos, total))

    def dispatch_read(self, job: Job, fd: int, pos: int, nbytes: int) -> Flight:
        """Send ``job``'s read of ``nbytes`` at ``pos`` of ``fd`` to the lane."""
        e = self._e
        assert e.lane is not None and job.read_from is not None
        buf = self._read_buf
        if buf is None:
            # One buffer for every lane read: one read is in flight at a time, and its
            # records are split out of it before the next is sent. Anonymous memory, not a
            # bytearray: the loop would zero the whole read-ahead first (4 MiB: 3-4 ms on
            # the reference VM), where the native thread's pread faults the pages in itself.
            buf = self._read_buf = mmap.mmap(-1, e.opts.read_buffer_bytes)
        fut = e.lane.submit_read(fd, buf, pos, nbytes)
        # Lane writes chained behind this read append where the store stands now.
        self._lane_end = e.write_at[1]
        e.refill_at = -1
        return Flight(job, fut, e.epoch, [], [], read=LaneRead(job.read_from[0], pos, nbytes, buf))

    def refill(self) -> None:
        """The consumer took the read-ahead down to its low-water mark while unread data
        waits on disk: send the next read now if nothing but a sync round is in flight (the
        consumer goes on taking what is ready meanwhile), else wake the ioLoop for it.

        A sync round that is due goes first (read_first), and the read beside it at once: a
        consumer that takes ready messages without a break does not let the ioLoop run, so
        the read would otherwise wait until the read-ahead ran dry.
        """
        e = self._e
        e.refill_at = -1
        flights = e.flights
        sent = False
        while (((e.parked and not flights) or (len(flights) == 1 and round_only(flights[0])))
               and not e.purge_waiters and e.kick_error is None
               and e.state is Lifecycle.OPEN):
            now = self.send_next_flight()
            if now is None:
                return  # the ioLoop was woken for the error
            if not now:
                break
            sent = True
            if flights[-1].read is not None:
                break
        if sent:
            wake(e.put_req)
        else:
            wake(e.read_slot)

    def send_next_flight(self) -> bool | None:
        """Build and send the engine's next hop from outside the ioLoop (a put or a take that
        found the ioLoop idle). True if one was sent, False if there was nothing to send; None
        if building it failed: the error is kept for the ioLoop to raise (not the caller's
        put or get), and the ioLoop is woken for it."""
        e = self._e
        try:
            flight = e.next_flight()
        except BaseException as exc:  # noqa: BLE001 - the ioLoop raises it
            e.kick_failed(exc)
            return None
        if flight is None:
            return False
        e.flights.append(flight)
        wake(e.inline.beside_wake)  # the ioLoop may wait for a sync round alone: it has company now
        return True

    def read_first(self) -> tuple[Flight | None, bool, bool]:
        """Before the next job is built: ``(a lane read sent now or None, hold, sync_first)``.

        ``hold``: send nothing now (a read runs beside a sync round: writes still never run
        on the lane and the I/O thread at once). ``sync_first``: a due sync round goes first
        and the read beside it (the next call), so build the job without the read; a read
        sent first would leave the round waiting as long as reads are due.
        """
        e = self._e
        flights = e.flights
        # Only a round that will run now goes first: while a failed one waits for its retry
        # time, the job is a plain write, and holding the read back for it would starve the
        # consumer for as long as producers keep the pending batch full.
        sync_first = (not flights and self.sync_wanted() and e.sync_may_retry()
                      and self.lane_read_job() is not None)
        if not sync_first and (not flights or (len(flights) == 1 and round_only(flights[0]))):
            return self.lane_read(), False, False
        if flights and not flights[0].on_lane and flights[-1].read is not None:
            return None, True, False
        return None, False, sync_first
