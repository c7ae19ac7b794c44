"""A producer role's appends through the native write lane, each batch published.

The consumer in another process reads only up to the write position in the producer's
role record (:mod:`.roles`), so a batch counts as written once that record names its
end. The native writer thread (:mod:`.lane`) appends the batch's records and then
rewrites the role record, in one job, before ``put()`` returns; the loop polls for the
job as a whole queue's engine does (:mod:`.inline`) and never writes itself.

On this path: a batch that stays inside the write segment and needs no fsync, from the
ioLoop or, while it is parked, from a callback at the end of the loop iteration in
which the batch's first put came (:meth:`PublishedWrites.kick`), or from a lone
producer's ``put()`` itself (:meth:`PublishedWrites.write_one`). Everything else (the
segment's first write, rolling, fsyncs, meta stores, a purge) goes to the I/O thread,
never beside a lane job. A lane batch that fails is not published, and the next
I/O-thread job cuts the segment back to the write position before anything else.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import TYPE_CHECKING

from ..errors import DiskQueueError
from . import lane as _lane
from .buffers import Lifecycle, fail, wake
from .flight import LaneResult
from .inline import DIRECT_RUN
from .iothread import Hop

if TYPE_CHECKING:
    from .producer import ProducerEngine

_NO_BATCH: tuple[list[bytes], list[asyncio.Future[None]], int, int] = ([], [], 0, 0)


class PublishedWrites:
    """A producer engine's lane writes: the job in flight, whether one failed, a flush
    scheduled. The engine asks :meth:`fits` and sends with :meth:`send`; puts come in
    through :meth:`kick` and :meth:`write_one`."""

    def __init__(self, e: ProducerEngine, lane: _lane.WriteLane) -> None:
        self._e = e
        self._lane = lane
        self._fut: Hop[LaneResult] | None = None  # the job in flight, if any
        self._batch = _NO_BATCH  # its payloads, waiters, bytes and the number after it
        self._failed = False
        self._flush_soon = False

    @property
    def busy(self) -> bool:
        """A lane job is in flight: :meth:`settled` applies it."""
        return self._fut is not None

    def take_failed(self) -> bool:
        """Did a lane batch fail since the last call? Then the caller (the I/O thread)
        cuts the segment back to the write position before its own job."""
        failed, self._failed = self._failed, False
        return failed

    def fits(self, total: int) -> bool:
        """May a batch of ``total`` bytes (as records) go to the lane: it is idle, no
        failure is pending, the segment is open and the batch stays inside it."""
        st = self._e.store
        return (self._fut is None and not self._failed and st.writer_fd is not None
                and st.write_pos + total <= st.max_bytes)

    def send(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
             total: int) -> bool:
        """Append ``payloads`` (``total`` bytes as records, :meth:`fits` said yes) and
        publish the role record after them, polled for: applied now if the writer is done
        within the poll (False), else the job is in flight (True: :meth:`settled`)."""
        e = self._e
        st = e.store
        fd = st.writer_fd
        assert fd is not None
        pos = st.write_pos
        seq = e.seq_w + len(payloads)
        pub = e.role_record((st.write_file, pos + total), seq)
        try:
            res = self._lane.write_polled(fd, payloads, pos, e.record_fd, pub)
        except (RuntimeError, ValueError, TypeError, MemoryError) as exc:
            cause = OSError(errno.EIO, f"the write lane refused a batch: {exc}")
            self._applied(payloads, waiters, total, seq, (0, 0, 0), cause)
            return False
        if isinstance(res, Hop):
            self._fut = res
            self._batch = (payloads, waiters, total, seq)
            return True
        self._applied(payloads, waiters, total, seq, res)
        return False

    async def settled(self) -> None:
        """Wait for the job in flight, if any, and apply it. A Hop is not cancelled with
        its waiter: a cancelled ioLoop leaves it to the engine's close."""
        fut = self._fut
        if fut is None:
            return
        if not fut.done():
            await asyncio.wait([fut])
        if self._fut is not fut:
            return  # applied meanwhile
        self._fut = None
        payloads, waiters, total, seq = self._batch
        self._batch = _NO_BATCH
        self._applied(payloads, waiters, total, seq, fut.result())

    def _applied(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
                 total: int, seq: int, res: LaneResult,
                 refused: OSError | None = None) -> None:
        """A batch is done with ``res`` (written, errno, 0): count it and resolve its
        waiters, or fail them and leave the cut to the next I/O-thread job."""
        e = self._e
        written, werr, _ = res
        n = len(payloads)
        if refused is not None or werr or written != total:
            self._failed = True
            e.unwritten -= n
            cause = refused or OSError(werr or errno.EIO, os.strerror(werr or errno.EIO))
            err = DiskQueueError(f"write to queue {e.layout.name!r} failed: {cause}")
            err.__cause__ = cause
            e.write_error = err
            fail(waiters, err)
            return
        st = e.store
        st.appended(total, False)
        e.seq_w = seq
        e.write_at = (st.write_file, st.write_pos)
        e.bytes_on_disk = st.bytes_on_disk
        e.landed(n, waiters, e.write_at, None, 0, False)  # the depth grows by n

    # ------------------------------------------------------------------ without the ioLoop

    def _may_flush(self, total: int, puts: int) -> bool:
        """May a batch go to the lane from a put or a callback, without the ioLoop: it is
        parked (no job of its own in flight) and nothing is due before the batch (an
        fsync by count or time, a sync(), a purge, closing)."""
        e = self._e
        loop = e.loop
        assert loop is not None
        return (e.parked and e.state is Lifecycle.OPEN and self.fits(total)
                and total <= _lane.SMALL_MAX and e.sync_every > 1
                and e.since_sync + puts < e.sync_every and not e.sync_waiters
                and not e.purge_waiters and loop.time() < e.sync_due_at)

    def kick(self) -> bool:
        """A put landed in the engine's empty pending batch: write it from a callback at
        the end of this loop iteration (the producers ready in it add theirs first) if
        the lane may take it; True if so, False if the ioLoop is to be woken."""
        if self._flush_soon:
            return True
        e = self._e
        if not self._may_flush(e.pending_bytes, len(e.pending)):
            return False
        self._flush_soon = True
        loop = e.loop
        assert loop is not None
        loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        """Send the pending batch to the lane (see :meth:`kick`), or wake the ioLoop."""
        self._flush_soon = False
        e = self._e
        payloads, waiters, total = e.pending, e.put_waiters, e.pending_bytes
        if not payloads:
            return
        if not self._may_flush(total, len(payloads)):
            e._direct_left = 0
            wake(e.put_req)
            return
        e.pending, e.put_waiters, e.pending_bytes = [], [], 0
        # One producer alone (one put, awaited): its next puts may be written at once.
        e._direct_left = DIRECT_RUN if len(payloads) == 1 and len(waiters) == 1 else 0
        self._send_from_loop(payloads, waiters, total)

    def write_one(self, data: bytes, size: int, waiter: asyncio.Future[None]) -> bool:
        """Write one awaited put (``size`` bytes as a record) from ``put()`` itself if a
        producer is alone (the last batch :meth:`_flush` sent was one awaited put) and the
        lane may take it now; False if not (the put takes the usual way). After
        ``DIRECT_RUN`` such puts in a row one takes the usual way: other tasks run."""
        e = self._e
        if e._direct_left <= 0 or e.pending or not self._may_flush(size, 1):
            return False
        e._direct_left -= 1
        e.unwritten += 1
        e.puts += 1
        self._send_from_loop([data], [waiter], size)
        return True

    def _send_from_loop(self, payloads: list[bytes], waiters: list[asyncio.Future[None]],
                        total: int) -> None:
        e = self._e
        e.since_sync += len(payloads)
        if self.send(payloads, waiters, total) or not e.timer_armed:
            # The ioLoop applies the job in flight, or arms the periodic sync timer.
            wake(e.put_req)

    def close(self) -> None:
        """Stop the writer thread (the engine has settled the job in flight)."""
        self._e._direct_left = 0
        self._lane.close()
