"""The write lane: appends framed batches on a native thread that never takes the GIL.

A hop to the Python I/O thread costs two cross-CPU wake-ups on a machine whose
idle vCPUs halt: one to start the thread, one for the GIL it needs to run. The
native writer (``aiodiskqueue._core._writer``, built from ``_writer.c`` when a C
compiler is present) only writes a batch of payloads as records at an offset
(``pwritev``, then ``fdatasync`` if asked), polls briefly for the next batch
before it sleeps, and reports completions through an eventfd the event loop
watches. The engine sends
it appends that stay inside the current segment and keeps everything else on the
I/O thread; the two never run at the same time. A small batch sent while nothing is in
flight is polled for (:meth:`WriteLane.write_polled`: the loop waits a few microseconds
for the writer instead of being woken by its eventfd), or with ``inline_writes=True``
written by the loop's own thread (``write_now``); see ``inline.py``.

The same thread reads ahead for the consumer (:func:`read_plan`, :func:`read_result`):
a pread into a buffer, split into payloads on the loop in C when it is done (the
read-ahead keeps where they lie as one stretch, see ``position.py``). A
Python I/O thread would need the GIL to start each read and again to finish it,
and a consumer taking ready messages holds the GIL without a break: measured here,
such a thread waited 5 ms (the interpreter's switch interval) or more for it each
time, longer than the consumer takes to empty half of the read-ahead. The native
thread needs no GIL, so the next read is done before the consumer gets to it.
Only plain reads go there (a segment already open for reading, up to its known
end); anything unusual (a bad length, a torn record, a short read, a record
larger than the read) sends the next read to the I/O thread, which handles it
exactly as before.

Set ``AIODISKQUEUE_PURE_PYTHON=1`` to write and read through the I/O thread only.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
from collections import deque
from typing import TYPE_CHECKING

from .._format.codec import HEADER_SIZE, parse_payloads
from .._format.meta import Meta
from . import pure_python
from .buffers import Lifecycle, wake
from .flight import Flight, LaneRead, LaneResult, LaneWrite
from .iothread import Hop
from .position import Stretch
from .store import Job, JobResult

if TYPE_CHECKING:
    from .engine import Engine

try:
    from . import _writer
    Writer: type[_writer.Writer] | None = _writer.Writer
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    Writer = None

log = logging.getLogger("aiodiskqueue")

#: A small batch (records, headers included): the loop writes one of at most this many
#: bytes itself or polls for it (see inline), and the writer thread spins for the next
#: job only after one; after a larger one (put_many's) its producer is busy far longer.
SMALL_MAX = 128 * 1024

#: The longest the loop waits for a job of the writer thread (ns, see WriteLane.poll):
#: a batch of 16 KiB takes it 7-20 us on the reference VM, 128 KiB 40-80 us.
POLL_WAIT_NS = 50_000
#: After this many polls in a row that missed, the next POLL_REST jobs are not polled for.
POLL_MISSES = 4
POLL_REST = 256

#: The most a read on the I/O thread takes ahead while this thread will read what follows
#: (a segment's first read, or the meta's read position, checked there): the consumer gets
#: its first messages after parsing this much, not the whole read-ahead (4 MiB by
#: default: 12-16 ms on the reference VM, the GIL held while the records are made).
OPENING_READ_BYTES = 256 * 1024


def available() -> bool:
    """True if the native writer is built and not switched off by the environment."""
    return Writer is not None and not pure_python()


class WriteLane:
    """One native writer thread per queue, its results delivered as futures on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, spin_us: int) -> None:
        assert Writer is not None
        self._loop = loop
        self._w = Writer(spin_us, SMALL_MAX)
        self._futs: deque[Hop[LaneResult]] = deque()
        self._fd = self._w.fileno()
        # write_polled's window (ns): none if the writer never spins (it sleeps at once,
        # and its wake-up alone takes longer than a poll should).
        self._poll_ns = POLL_WAIT_NS if spin_us > 0 else 0
        self._poll_misses = 0
        self._poll_rest = 0
        self._spare: Hop[LaneResult] | None = None  # see write_polled
        loop.add_reader(self._fd, self._on_ready)

    def submit(self, fd: int, payloads: list[bytes], offset: int, sync: bool) -> Hop[LaneResult]:
        """Write ``payloads`` as records at ``offset`` of ``fd`` (then fdatasync if
        ``sync``), after the batches submitted before; the future cannot be cancelled.

        The records are framed in C and written with ``pwritev`` straight from the
        payload objects: no copy on the loop.
        """
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        self._w.submit_records(fd, payloads, offset, sync)
        self._futs.append(fut)
        return fut

    def write_polled(self, fd: int, payloads: list[bytes], offset: int
                     ) -> LaneResult | Hop[LaneResult]:
        """Write ``payloads`` as records at ``offset`` of ``fd`` on the writer thread and
        wait for it as :meth:`poll` does: its result if the writer finished it meanwhile,
        else the future of the job in flight.

        With nothing else queued (a batch written from the loop), the submit, the wait and
        the reap are one C call, and a job done in time needs no future: the one made
        beforehand (so that a job never lacks one) is kept for the next miss.
        """
        fut = self._spare
        if fut is None:
            fut = self._spare = Hop(loop=self._loop)
        if self._futs:  # queued behind other jobs: not polled for
            self._w.submit_records(fd, payloads, offset, False)
        else:
            wait = self._poll_ns
            if self._poll_rest:
                self._poll_rest -= 1
                wait = 0
            done = self._w.write_polled(fd, payloads, offset, wait)
            if done is not None:
                self._poll_misses = 0
                return done
            if wait:
                self._missed()
        self._spare = None
        self._futs.append(fut)
        return fut

    def poll(self) -> None:
        """Wait briefly on the calling thread (the loop) for the oldest job in flight, and
        resolve its future, and those of the jobs done with it, if it is done.

        Why: a small write takes the writer thread a few microseconds, but on a VM whose
        idle vCPUs halt, waking the loop through the eventfd costs tens, and a writer
        that then finds no next batch within its spin window sleeps and costs another
        wake-up for the next put. The wait is bounded (:data:`POLL_WAIT_NS`, the GIL
        released): the loop never waits for the disk longer than that, and a job that
        takes longer completes through the eventfd.
        After :data:`POLL_MISSES` misses in a row (a slow disk, large batches), the next
        :data:`POLL_REST` jobs are not polled for.
        """
        if not self._poll_ns:
            return
        if self._poll_rest:
            self._poll_rest -= 1
            return
        hit = self._w.poll(self._poll_ns)
        if hit > 0:
            self._poll_misses = 0
            self._on_ready()
        elif hit == 0:
            self._missed()

    def _missed(self) -> None:
        """Count a poll that gave up; see :meth:`poll`."""
        self._poll_misses += 1
        if self._poll_misses >= POLL_MISSES:
            self._poll_misses, self._poll_rest = 0, POLL_REST

    def submit_read(self, fd: int, buf: mmap.mmap, offset: int, nbytes: int
                    ) -> Hop[LaneResult]:
        """Read ``nbytes`` at ``offset`` of ``fd`` into ``buf`` after the jobs submitted
        before; the future gives (bytes read, errno, 0). Do not look at ``buf`` before
        the future is done."""
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        self._w.submit_read(fd, buf, offset, nbytes)
        self._futs.append(fut)
        return fut

    def submit_swap(self, args: tuple[bytes, bytes, bytes, bytes]) -> Hop[LaneResult]:
        """Store a meta file (``swap_file``'s steps, ``args`` as it takes them) after the
        jobs submitted before; the future gives (0, 0, errno or 0)."""
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        self._w.submit_swap(*args)
        self._futs.append(fut)
        return fut

    def write_now(self, fd: int, payloads: list[bytes], offset: int) -> LaneResult:
        """Write ``payloads`` as records at ``offset`` of ``fd`` now, on the calling
        thread (the GIL is released during ``pwritev``); only while no batch is queued.

        For a small batch whose producers wait for it anyway, this costs less than a
        hand-off to the writer thread and back: no thread wake-up, no eventfd.
        """
        return self._w.write_records(fd, payloads, offset)

    def _on_ready(self) -> None:
        futs = self._futs
        for res in self._w.reap():
            fut = futs.popleft()
            if not fut.done():
                fut.set_result(res)

    def close(self) -> None:
        """Stop the thread once the submitted batches are done.

        The engine awaits every submitted batch first, so this does not wait on disk.
        """
        try:
            self._loop.remove_reader(self._fd)
        except (RuntimeError, ValueError):  # loop already closed
            pass
        self._on_ready()
        self._w.close()


def lane_result(e: Engine, flight: Flight, outcome: LaneResult | None = None) -> JobResult:
    """Turn ``e``'s lane flight's (written, write errno, sync errno), its future's result
    unless ``outcome`` is given (an inline write), into a JobResult.

    A failed write fails every lane batch queued behind it too: their offsets
    assumed it succeeded. The next hop on the I/O thread cuts the segment back.
    """
    lw, job = flight.lane, flight.job
    assert lw is not None and job.payloads is not None
    _written, werr, serr = outcome if outcome is not None else flight.fut.result()
    st = e.store
    res = JobResult()
    if werr or e._lane_error is not None:
        if werr:
            e._lane_error = OSError(werr, os.strerror(werr))
        res.write_error = e._lane_error
    else:
        synced = job.sync and not serr
        st.appended(lw.total, synced)
        res.written = len(job.payloads)
        if job.sync:
            res.synced = synced
            if serr:
                res.sync_error = OSError(serr, os.strerror(serr))
        res.handoff = e.handoff(job.payloads, lw.file_num, lw.pos, lw.total)
        if res.handoff is not None:
            res.handoff_bytes = lw.total - HEADER_SIZE * len(job.payloads)
    res.write_at = (st.write_file, st.write_pos)
    res.bytes_on_disk = st.bytes_on_disk
    return res


def read_plan(e: Engine, job: Job) -> tuple[int, int, int] | None:
    """``(fd, offset, nbytes)`` if ``job`` is a plain read the lane may do instead of
    the I/O thread; else None. Called while no hop but a sync round is in flight."""
    if (job.read_from is None or job.payloads is not None or job.sync or job.reset_writer
            or job.recount_from is not None or e.lane is None or e._lane_error is not None
            or e._read_on_thread):
        return None
    span = e.store.lane_read_from(*job.read_from)
    if span is None:
        return None
    fd, stop = span
    pos = job.read_from[1]
    return fd, pos, min(stop - pos, job.read_budget)


def io_read_budget(e: Engine, budget: int) -> int:
    """The budget of a read sent to the I/O thread: :data:`OPENING_READ_BYTES` at most
    while this thread takes the reads after it (read_plan), else ``budget``."""
    if e.lane is None or e._lane_error is not None or e._read_on_thread:
        return budget
    return min(budget, OPENING_READ_BYTES)


def read_result(e: Engine, flight: Flight) -> JobResult:
    """Split the finished lane read of ``flight`` into records: the JobResult the I/O
    thread's read would give for them. Anything unusual is left to the I/O thread: the
    next read goes there and meets it as before."""
    lr = flight.read
    assert lr is not None
    nread, err, _ = flight.fut.result()
    st = e.store
    res = JobResult(write_at=(st.write_file, st.write_pos), bytes_on_disk=st.bytes_on_disk)
    if e.inline.beside is not None:
        # Beside the sync round that the loop's writes run beside, the store does not know
        # those writes yet (inline.settle tells it): the engine's own position stands.
        res.write_at, res.bytes_on_disk = e.write_at, e.bytes_on_disk
    if err:
        e._read_on_thread = True
        res.read_error = OSError(err, os.strerror(err))
        return res
    # Split straight out of the reused buffer: the records are new bytes objects.
    payloads, stop, bad = parse_payloads(memoryview(lr.buf)[:nread], lr.pos, e.min_size,
                                         e.max_size)
    if bad is not None or not payloads or nread < lr.nbytes:
        e._read_on_thread = True
    res.records = Stretch(payloads, lr.file_num, lr.pos, stop)
    res.records_bytes = stop - lr.pos - HEADER_SIZE * len(payloads)
    res.read_to = (lr.file_num, stop)
    return res


def sync_only(flight: Flight) -> bool:
    """Is ``flight`` a sync round on the I/O thread that writes and reads nothing?"""
    job = flight.job
    return (not flight.on_lane and job.payloads is None and job.read_from is None
            and job.recount_from is None and not job.reset_writer)


def round_only(flight: Flight) -> bool:
    """Is ``flight`` a sync round alone, on the I/O thread or a meta store on its native
    thread (a read may go beside either)?"""
    return flight.meta is not None or sync_only(flight)


def meta_job(e: Engine, job: Job) -> Flight | None:
    """Send ``job`` to the native meta thread if it is a sync round that only stores the
    meta (a consumer's, typically) and nothing else is in flight; else None.

    A Python thread takes the GIL back after each system call, and a consumer taking
    ready messages holds it for up to the interpreter's switch interval each time: such
    a round took 8-9 ms on the I/O thread against about 1 ms of system calls, and the
    consumer, which may take only ``sync_every`` messages plus the read-ahead past a
    stored meta, waited for it. A native thread needs no GIL.
    """
    if (e.lane is None or e._flights or not job.sync or job.meta_read is None or job.settle
            or job.payloads is not None or job.read_from is not None
            or job.recount_from is not None or job.reset_writer or e.inline.beside is not None
            or e.inline.deferred or e.state is not Lifecycle.OPEN):
        return None
    st = e.store
    meta = Meta(job.meta_depth, *job.meta_read, st.write_file, st.write_pos)
    args = st.meta_swap(meta)
    if args is None or not _meta_lane(e):
        return None
    assert e.meta_lane is not None
    fut = e.meta_lane.submit_swap(args)
    flight = Flight(job, fut, e.epoch, e._batch_waiters, e._sync_batch, meta=meta)
    e._batch_waiters = []
    e._sync_batch = []
    return flight


def _meta_lane(e: Engine) -> bool:
    """Is there a native thread for meta stores (made on the first one)? Not the write
    lane's: a read queued behind a meta store's fsyncs would keep the consumer waiting.
    It sleeps between stores (no spin)."""
    if e.meta_lane is None and not e._meta_lane_failed:
        loop = e.loop
        assert loop is not None
        try:
            e.meta_lane = WriteLane(loop, 0)
        except OSError as exc:  # e.g. out of eventfds: the I/O thread stores the meta
            e._meta_lane_failed = True
            log.warning("%s: no native thread for meta stores: %s", e.layout.meta_path, exc)
    return e.meta_lane is not None


def meta_result(e: Engine, flight: Flight) -> JobResult | None:
    """The JobResult of a finished native meta store, as the I/O thread's round would give
    it. None if it failed: the job then goes to the I/O thread, first in line and with
    its waiters, whose portable steps redo the store or raise what is wrong."""
    meta = flight.meta
    assert meta is not None
    _, _, err = flight.fut.result()
    st = e.store
    st.meta_swapped(meta, err)
    if err:
        batch, e._batch_waiters = e._batch_waiters, flight.waiters
        e._sync_batch = flight.sync_waiters
        e._flights.appendleft(e._dispatch(flight.job))
        e._batch_waiters = batch
        return None
    return JobResult(synced=True, meta=meta, write_at=(st.write_file, st.write_pos),
                     bytes_on_disk=st.bytes_on_disk)


def sync_wanted(e: Engine) -> bool:
    """Is a sync round (or the meta) due now?"""
    return bool(e.sync_waiters) or e._force_meta or e._sync_round_due()


def lane_read_job(e: Engine) -> tuple[Job, tuple[int, int, int]] | None:
    """The due read ahead and its plan, if it is a plain one the lane may do."""
    if (not e._read_due() or e._recount_wanted or e.purge_waiters
            or e.state is Lifecycle.CLOSING):
        return None
    if e._flights and e.since_sync >= e.sync_every:
        # Beside a sync round only until the next one is due: the consumer takes no
        # more than sync_every messages plus the read-ahead between two stored metas,
        # as when the read waited for the round.
        return None
    job = Job(read_from=e.read_at, read_budget=e.opts.read_buffer_bytes - e.ready_bytes)
    plan = read_plan(e, job)
    return None if plan is None else (job, plan)


def lane_read(e: Engine) -> Flight | None:
    """Send the due read ahead to the lane if it is a plain one, as the first flight or
    beside a sync round on the I/O thread (which never touches the segment being read)."""
    found = lane_read_job(e)
    return None if found is None else dispatch_read(e, found[0], *found[1])


def lane_fits(e: Engine, pos: int, size: int, sync: bool) -> bool:
    """Can a batch of ``size`` bytes go to the write lane as an append at ``pos``
    (followed by an fdatasync if ``sync``)?"""
    if e.lane is None or e._lane_error is not None or e.state is Lifecycle.CLOSING:
        return False
    st = e.store
    if st.writer_fd is None or (sync and st.dir_dirty):
        return False
    return size > 0 and pos + size <= e.opts.max_bytes_per_file


def dispatch_write(e: Engine, job: Job, pos: int, total: int) -> Flight:
    """Send ``job``'s batch (``total`` bytes as records) to the lane as an append at
    ``pos`` of the write segment."""
    assert e.lane is not None and job.payloads is not None
    fd = e.store.writer_fd
    assert fd is not None
    fut = e.lane.submit(fd, job.payloads, pos, job.sync)
    e._lane_end = pos + total
    flight = Flight(job, fut, e.epoch, e._batch_waiters, e._sync_batch,
                     LaneWrite(e.write_at[0], pos, total))
    e._batch_waiters = []
    e._sync_batch = []
    return flight


def dispatch_read(e: Engine, job: Job, fd: int, pos: int, nbytes: int) -> Flight:
    """Send ``job``'s read of ``nbytes`` at ``pos`` of ``fd`` to the lane."""
    assert e.lane is not None and job.read_from is not None
    buf = e._read_buf
    if buf is None:
        # One buffer for every lane read: one read is in flight at a time, and its
        # records are split out of it before the next is sent. Anonymous memory, not a
        # bytearray: the loop would zero the whole read-ahead first (4 MiB: 3-4 ms on
        # the reference VM), where the native thread's pread faults the pages in itself.
        buf = e._read_buf = mmap.mmap(-1, e.opts.read_buffer_bytes)
    fut = e.lane.submit_read(fd, buf, pos, nbytes)
    # Lane writes chained behind this read append where the store stands now.
    e._lane_end = e.write_at[1]
    e.refill_at = -1
    return Flight(job, fut, e.epoch, [], [], read=LaneRead(job.read_from[0], pos, nbytes, buf))


def refill(e: Engine) -> None:
    """The consumer took the read-ahead down to its low-water mark while unread data
    waits on disk: send the next read now if nothing but a sync round is in flight (the
    consumer goes on taking what is ready meanwhile), else wake the ioLoop for it.

    A sync round that is due goes first (read_first), and the read beside it at once: a
    consumer that takes ready messages without a break does not let the ioLoop run, so
    the read would otherwise wait until the read-ahead ran dry.
    """
    e.refill_at = -1
    flights = e._flights
    sent = False
    while (((e._parked and not flights) or (len(flights) == 1 and round_only(flights[0])))
           and not e.purge_waiters and e._kick_error is None
           and e.state is Lifecycle.OPEN):
        now = send_next_flight(e)
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


def send_next_flight(e: Engine) -> bool | None:
    """Build and send the engine's next hop from outside the ioLoop (a put or a take that
    found the ioLoop idle). True if one was sent, False if there was nothing to send; None
    if building it failed: the error is kept for the ioLoop to raise (not the caller's
    put or get), and the ioLoop is woken for it."""
    try:
        flight = e._next_flight()
    except BaseException as exc:  # noqa: BLE001 - the ioLoop raises it
        e.kick_failed(exc)
        return None
    if flight is None:
        return False
    e._flights.append(flight)
    wake(e.inline.beside_wake)  # the ioLoop may wait for a sync round alone: it has company now
    return True


def read_first(e: Engine) -> tuple[Flight | None, bool, bool]:
    """Before the next job is built: ``(a lane read sent now or None, hold, sync_first)``.

    ``hold``: send nothing now (a read runs beside a sync round: writes still never run
    on the lane and the I/O thread at once). ``sync_first``: a due sync round goes first
    and the read beside it (the next call), so build the job without the read; a read
    sent first would leave the round waiting as long as reads are due.
    """
    flights = e._flights
    # Only a round that will run now goes first: while a failed one waits for its retry
    # time, the job is a plain write, and holding the read back for it would starve the
    # consumer for as long as producers keep the pending batch full.
    sync_first = (not flights and sync_wanted(e) and e._sync_may_retry()
                  and lane_read_job(e) is not None)
    if not sync_first and (not flights or (len(flights) == 1 and round_only(flights[0]))):
        return lane_read(e), False, False
    if flights and not flights[0].on_lane and flights[-1].read is not None:
        return None, True, False
    return None, False, sync_first


async def next_done(flights: deque[Flight]) -> Flight:
    """Wait for the next flight to apply and remove it from ``flights``: the oldest, or a
    lane job (a read, or a write from the loop whose poll gave up) that is done first
    beside a sync round on the I/O thread or a meta store on its own native thread (so
    neither the consumer nor the producers wait for the round). Cancelling the wait
    leaves ``flights`` unchanged (a Hop runs to its end; the engine's close applies it)."""
    if (len(flights) > 1 and (not flights[0].on_lane or flights[0].meta is not None)
            and flights[1].on_lane):
        await asyncio.wait([flights[0].fut, flights[1].fut],
                           return_when=asyncio.FIRST_COMPLETED)
        if not flights[0].fut.done():
            beside = flights[1]
            del flights[1]
            return beside
    await flights[0].fut
    return flights.popleft()
