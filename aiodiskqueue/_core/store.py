"""Synchronous segment I/O for one open queue: batched writes, read-ahead, sync,
deletion and purge (recovery on open is :mod:`.recovery`).

Everything here runs on the queue's I/O thread; nothing else touches these file
descriptors. The event loop side (``engine``) sends one :class:`Job` per hop
and applies the :class:`JobResult`.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from .._format.access import open_file, read_fd
from .._format.codec import HEADER, HEADER_SIZE, frame
from .._format.layout import Layout, file_size, fsync_dir
from .._format.meta import Meta, Swap, store_meta, swap_names
from .._format.scan import Record, read_span, realign, scan_segment
from .._format.space import CANNOT_SWAP
from ..errors import CorruptionError
from . import pure_python
from .position import Stretch
from .recovery import OpenState, Recovery
from .remover import SegmentRemover

_swap_file: Swap | None
try:
    from ._writer import swap_file as _swap_file
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    _swap_file = None

log = logging.getLogger(__name__)

_pack = HEADER.pack
_FLUSH_BYTES = 1 << 20  # frame at most this much before each write syscall


@dataclass(slots=True)
class Job:
    """One hop's worth of work, built on the event loop.

    Order of execution: write, then sync, then read.
    """

    payloads: list[bytes] | None = None
    handoff: bool = False
    sync: bool = False
    meta_read: tuple[int, int] | None = None  # consumer position for the meta, when storing it
    meta_depth: int = 0  # depth before this job's write
    read_from: tuple[int, int] | None = None
    read_budget: int = 0
    reset_writer: bool = False  # first reopen the write segment, cut back to write_pos
    wait_removed: bool = False  # after the sync, wait until the consumed segments are removed
    recount_from: tuple[int, int] | None = None  # count the records on disk from here


@dataclass(slots=True)
class JobResult:
    """What a :class:`Job` did."""

    written: int = 0
    write_error: OSError | None = None
    handoff: list[Record] | Stretch | None = None
    handoff_bytes: int = 0  # payload bytes in handoff
    synced: bool = False
    sync_error: OSError | None = None
    meta: Meta | None = None
    records: list[Record] | Stretch = field(default_factory=list)
    records_bytes: int = 0  # payload bytes in records
    read_to: tuple[int, int] | None = None
    read_error: OSError | None = None
    quarantined: list[str] = field(default_factory=list)
    corruption: CorruptionError | None = None  # strict mode: what stopped the read
    remaining: int | None = None  # records on disk past read_to, recounted after a quarantine
    write_at: tuple[int, int] = (0, 0)
    bytes_on_disk: int = 0


class SegmentStore:
    """Owns a queue's segment files while it is open."""

    def __init__(self, layout: Layout, max_bytes_per_file: int, min_size: int, max_size: int,
                 strict: bool = False) -> None:
        self.layout = layout
        self.strict = strict
        self.max_bytes = max_bytes_per_file
        self.min_size = min_size
        self.max_size = max_size
        self.write_file = 0
        self.write_pos = 0
        self._wfd: int | None = None
        self._rfd: int | None = None
        self._rnum = -1
        self._data_dirty = False
        self._dir_dirty = False
        self._oldest = 0  # lowest segment number that may still exist
        self._remover = SegmentRemover(layout.name)
        # The size of each finished segment written to its end here or opened for
        # reading: where a lane read stops (lane_read_from), and what a removal queued
        # from the event loop (meta_swapped) takes off bytes_on_disk without a stat.
        self._sizes: dict[int, int] = {}
        self._swap: Swap | None = None  # the meta store's native common case (see open)
        # The last meta store took that native path: the spare exists and names can be
        # swapped here, so the native meta thread may store a consumer's (Scheduler.meta_job).
        self.swap_ok = False
        self.bytes_on_disk = 0
        self.meta_on_disk: Meta | None = None
        # The read position taken from a meta file, not yet known to be a record boundary.
        self._unverified: tuple[int, int] | None = None

    # ------------------------------------------------------------------ open

    def open(self) -> OpenState:
        """Recover the queue's state from its files (see :mod:`.recovery`) and take
        over its write position."""
        st = Recovery(self.layout, self.strict, self.min_size, self.max_size).run()
        meta = st.meta
        self._swap = None if pure_python() or _swap_file is None else self._swap_noted
        self.swap_ok = False
        self._unverified = meta.read if meta.read_pos > 0 else None
        self.write_file, self.write_pos = meta.write
        self._oldest = min(self.layout.segments(), default=meta.write_file_num)
        self.bytes_on_disk = st.bytes_on_disk
        self.meta_on_disk = None
        return st

    def quarantine(self, num: int, offset: int, reason: str) -> str:
        """Rename a damaged segment to ``.bad``; in strict mode raise CorruptionError instead."""
        path = self.layout.segment_path(num)
        if self.strict:
            raise CorruptionError(path, offset, reason)
        size = file_size(path)
        if num == self._rnum and self._rfd is not None:
            os.close(self._rfd)
            self._rfd, self._rnum = None, -1
        dst = self.layout.quarantine(num)
        self._sizes.pop(num, None)
        self.bytes_on_disk -= size
        log.warning("%s: %s at offset %d; quarantined as %s", path, reason, offset, dst)
        return dst

    def _writer(self) -> int:
        """The write segment's descriptor, opened (and created) on first use."""
        if self._wfd is None:
            path = self.layout.segment_path(self.write_file)
            existed = os.path.exists(path)
            fd = open_file(path, os.O_WRONLY | os.O_CREAT, self.layout.file_mode)
            if os.fstat(fd).st_size != self.write_pos:
                # Only bytes past our own write position: a torn tail already reported.
                os.ftruncate(fd, self.write_pos)
            self._wfd = fd
            if not existed:
                self._dir_dirty = True
        return self._wfd

    # ------------------------------------------------------------------ jobs

    def run(self, job: Job) -> JobResult:
        """Do one hop's work: write, sync (and meta), read ahead."""
        res = JobResult()
        if job.reset_writer:
            try:
                self.reopen_writer()
            except OSError as exc:
                # Not writable now (e.g. a read-only filesystem): this job's writes fail,
                # the next write opens the segment again.
                res.write_error = exc
        if job.payloads and res.write_error is None:
            try:
                before = self.bytes_on_disk
                res.handoff = self.write(job.payloads, job.handoff)
                res.written = len(job.payloads)
                if res.handoff is not None:
                    res.handoff_bytes = (self.bytes_on_disk - before
                                          - HEADER_SIZE * res.written)
            except OSError as exc:
                res.write_error = exc
        if job.sync:
            meta = None
            if job.meta_read is not None:
                meta = Meta(job.meta_depth + res.written, *job.meta_read,
                            self.write_file, self.write_pos)
            try:
                self.sync(meta)
                res.synced = True
                res.meta = meta
            except OSError as exc:
                res.sync_error = exc
            if job.wait_removed:
                self._remover.wait_idle()
        if job.read_from is not None:
            try:
                self.read(job.read_from, job.read_budget, res)
            except OSError as exc:
                res.read_error = exc
        if job.recount_from is not None and res.remaining is None and res.read_error is None:
            try:
                res.remaining = self.count_from(*(res.read_to or job.recount_from))
            except OSError as exc:
                log.warning("%s: recount failed: %s", self.layout.meta_path, exc)
        res.write_at = (self.write_file, self.write_pos)
        res.bytes_on_disk = self.bytes_on_disk
        return res

    def write(self, payloads: list[bytes], handoff: bool) -> list[Record] | Stretch | None:
        """Append records, rolling files by go-diskqueue's rule; all or nothing.

        With ``handoff``, returns where the records now lie, for the read-ahead.

        Raises OSError after undoing the partial batch (truncating back and
        removing files this batch created).
        """
        start = (self.write_file, self.write_pos)
        lens = list(map(len, payloads))
        total = sum(lens) + HEADER_SIZE * len(lens)
        if start[1] + total <= self.max_bytes:
            # No record can roll the file: one buffer, one write, one stretch.
            fnum, pos = start
            data = frame(payloads, lens)
            try:
                self._pwrite(data, pos)
            except OSError:
                self._rollback(start)
                raise
            self.write_pos = pos + total
            self.bytes_on_disk += total
            self._data_dirty = True
            if not handoff:
                return None
            return Stretch(payloads, fnum, pos, pos + total)
        out: list[Record] | None = [] if handoff else None
        maxb = self.max_bytes
        fnum, pos = start
        parts: list[bytes] = []
        pending = 0
        total = 0
        flushed_at = pos
        hs = HEADER_SIZE
        try:
            for p in payloads:
                n = len(p)
                if pos > 0 and pos + hs + n > maxb:
                    if parts:
                        self._pwrite(b"".join(parts), flushed_at)
                        parts, pending = [], 0
                    self._roll(pos)
                    fnum, pos = self.write_file, 0
                    flushed_at = 0
                parts.append(_pack(n))
                parts.append(p)
                pos += hs + n
                pending += hs + n
                total += hs + n
                if out is not None:
                    out.append((p, fnum, pos))
                if pending >= _FLUSH_BYTES:
                    self._pwrite(b"".join(parts), flushed_at)
                    parts, pending, flushed_at = [], 0, pos
            if parts:
                self._pwrite(b"".join(parts), flushed_at)
        except OSError:
            self._rollback(start)
            raise
        self.bytes_on_disk += total
        self.write_pos = pos
        self._data_dirty = True
        return out

    # ------------------------------------------------------------------ the write lane

    @property
    def writer_fd(self) -> int | None:
        """The open write segment's descriptor, or None until the next write opens it."""
        return self._wfd

    @property
    def dir_dirty(self) -> bool:
        """True while a segment created since the last sync may not be in the directory."""
        return self._dir_dirty

    def appended(self, total: int, synced: bool) -> None:
        """Account for ``total`` bytes the write lane appended at ``write_pos``.

        Called on the event loop while no hop runs on the I/O thread.
        """
        self.write_pos += total
        self.bytes_on_disk += total
        self._data_dirty = not synced

    def reopen_writer(self) -> None:
        """Close and reopen the write segment, cutting off any bytes past write_pos
        (a failed lane write, or one queued behind it)."""
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
        self._writer()

    def _pwrite(self, data: bytes, offset: int) -> None:
        fd = self._writer()
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            if n == 0:  # pragma: no cover - regular files never do this
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            offset += n

    def _roll(self, size: int) -> None:
        # Sync policy: a completed file is always fsynced before moving on.
        fd = self._writer()
        os.fsync(fd)
        os.close(fd)
        self._wfd = None
        self._sizes[self.write_file] = size
        self.write_file += 1
        self.write_pos = 0

    def _rollback(self, start: tuple[int, int]) -> None:
        fnum, pos = start
        try:
            if self._wfd is not None:
                os.close(self._wfd)
                self._wfd = None
            for num in range(fnum + 1, self.write_file + 1):
                try:
                    os.remove(self.layout.segment_path(num))
                except FileNotFoundError:
                    pass
            for num in range(fnum, self.write_file + 1):
                self._sizes.pop(num, None)
            self.write_file, self.write_pos = fnum, pos
            self._writer()
        except OSError:
            log.exception("%s: could not undo a failed write", self.layout.segment_path(fnum))
            raise

    def _recount_bytes(self) -> int:
        return sum(file_size(p) for p in self.layout.segments().values())

    def sync(self, meta: Meta | None) -> None:
        """fsync the write segment and, if given, store ``meta``; then delete
        segments the stored meta has moved past."""
        if self._data_dirty and self._wfd is not None:
            os.fdatasync(self._wfd)
            self._data_dirty = False
        if self._dir_dirty:
            fsync_dir(self.layout.directory)
            self._dir_dirty = False
        if meta is not None and meta != self.meta_on_disk:
            store_meta(self.layout.meta_path, meta, self._swap, mode=self.layout.file_mode)
            self.meta_on_disk = meta
            # Deleting a consumed segment only after the meta that moved past it is
            # durable means a crash can never leave the meta pointing at a deleted file.
            self._delete_below(meta.read_file_num)

    def _swap_noted(self, directory: bytes, spare: bytes, name: bytes, data: bytes) -> int:
        assert _swap_file is not None
        err = _swap_file(directory, spare, name, data)
        self.swap_ok = not err
        if err in CANNOT_SWAP:
            self._swap = None  # not here (a filesystem or sandbox without the exchange)
        return err

    def meta_swap(self, meta: Meta) -> tuple[bytes, bytes, bytes, bytes] | None:
        """The arguments of a native store of ``meta`` (``swap_file``'s) if that is all
        :meth:`sync` would do now: nothing to fsync, no directory entry to make durable,
        a meta that differs from the stored one, and the last store took the native path.
        None otherwise. Called on the event loop while no hop runs."""
        if (not self.swap_ok or self._data_dirty or self._dir_dirty
                or meta == self.meta_on_disk):
            return None
        return (*swap_names(self.layout.meta_path), meta.encode())

    def meta_swapped(self, meta: Meta, err: int) -> None:
        """The native meta thread stored ``meta`` (``err`` 0), or failed to with ``err``: what
        :meth:`sync` does after :func:`store_meta`. Called on the event loop while no hop
        runs; the removals it queues run on the remover's thread."""
        self.swap_ok = not err
        if not err:
            self.meta_on_disk = meta
            self._delete_below(meta.read_file_num, on_loop=True)

    def _delete_below(self, num: int, on_loop: bool = False) -> None:
        # The removals run on the remover's thread (see .remover): the sync round and
        # the consumer behind it do not wait while the kernel frees the files. A
        # segment's bytes leave the count when its removal is queued.
        for n in range(self._oldest, num):
            if n == self._rnum and self._rfd is not None:
                os.close(self._rfd)
                self._rfd, self._rnum = None, -1
            path = self.layout.segment_path(n)
            size = self._sizes.pop(n, None)
            if size is None and not on_loop:  # not seen here: the event loop does no stat
                try:
                    size = file_size(path)
                except FileNotFoundError:
                    continue
            self._remover.remove(path)
            self.bytes_on_disk -= size or 0
        self._oldest = max(self._oldest, num)

    def read(self, at: tuple[int, int], budget: int, res: JobResult) -> None:
        """Read ahead about ``budget`` bytes of records from ``at`` into ``res``."""
        fnum, pos = at
        recount = False
        out: list[Record] = []
        res.records = out
        while budget > 0 and (fnum, pos) < (self.write_file, self.write_pos):
            if fnum < self.write_file:
                fd = self._reader(fnum)
                if fd is None:
                    if self.strict:
                        res.corruption = CorruptionError(self.layout.segment_path(fnum), 0,
                                                         "segment missing")
                        break
                    log.warning("%s: segment missing; skipping to the next one",
                                self.layout.segment_path(fnum))
                    fnum, pos, recount = fnum + 1, 0, True
                    continue
                stop = os.fstat(fd).st_size
                self._sizes[fnum] = stop
                if pos >= stop:
                    fnum, pos = fnum + 1, 0
                    continue
            else:
                fd = self._reader(fnum)
                if fd is None:  # pragma: no cover - the writer holds it open
                    break
                stop = self.write_pos
            span = read_span(fd, fnum, pos, stop, budget, self.min_size, self.max_size)
            out.extend(span.records)
            res.records_bytes += span.end - span.start - HEADER_SIZE * len(span.records)
            budget -= span.end - pos
            pos = span.end
            # The first read from the meta's read position checks it (a record boundary?)
            # whether or not it met a problem: records that parse cleanly from inside a
            # record are possible (a length-like field in the payloads). Once checked,
            # the segment's next reads may go to the native thread (lane_read_from).
            if ((span.problem is not None or span.records) and self._unverified is not None
                    and self._unverified[0] == fnum and not self.strict):
                up = self._unverified[1]
                self._unverified = None
                back = realign(self.layout.segment_path(fnum), fnum, up, self.min_size,
                               self.max_size)
                if back is not None:
                    # The meta's read position is inside a record: what was parsed from it
                    # is garbage. Read again from the record holding that position.
                    log.warning("%s: read position %d from the meta file is not a record "
                                "boundary; reading from %d", self.layout.segment_path(fnum),
                                up, back)
                    dropped = [r for r in out if r[1] == fnum]
                    out[:] = [r for r in out if r[1] != fnum]
                    res.records_bytes -= sum(len(r[0]) for r in dropped)
                    pos, recount = back, True
                    continue
            if span.problem is not None:
                what = (f"length {span.bad_length} outside [{self.min_size}, {self.max_size}]"
                        if span.bad_length is not None else "truncated record")
                try:
                    res.quarantined.append(self.quarantine(fnum, pos, what))
                except CorruptionError as exc:
                    res.corruption = exc  # strict: stop here, touch nothing
                    break
                if fnum == self.write_file:
                    # The damaged file is the one being written: move the writer on.
                    if self._wfd is not None:
                        os.close(self._wfd)
                        self._wfd = None
                    self.write_file, self.write_pos = fnum + 1, 0
                fnum, pos, recount = fnum + 1, 0, True
        res.read_to = (fnum, pos)
        if recount:
            res.remaining = self.count_from(fnum, pos)

    def lane_read_from(self, fnum: int, pos: int) -> tuple[int, int] | None:
        """``(fd, stop)`` for reading records from ``(fnum, pos)`` up to ``stop`` on the
        native thread, when that needs none of :meth:`read`'s logic: the segment is open
        for reading (a read on this thread opened it), it is the write segment or its
        size is known, and its read position from the meta file is not in doubt. None
        otherwise. Called on the event loop while no hop runs.
        """
        if self._rnum != fnum or self._rfd is None:
            return None
        if self._unverified is not None and self._unverified[0] == fnum:
            return None
        if fnum == self.write_file:
            stop = self.write_pos
        elif fnum in self._sizes:
            stop = self._sizes[fnum]
        else:
            return None
        return (self._rfd, stop) if pos < stop else None

    def _reader(self, num: int) -> int | None:
        if self._rnum != num:
            if self._rfd is not None:
                os.close(self._rfd)
                self._rfd, self._rnum = None, -1
            try:
                self._rfd = read_fd(self.layout.segment_path(num))
            except FileNotFoundError:
                return None
            self._rnum = num
        return self._rfd

    def count_from(self, fnum: int, pos: int) -> int:
        """Whole records from ``(fnum, pos)`` to the write position (problems stop a
        file's count)."""
        total = 0
        for num in range(fnum, self.write_file + 1):
            path = self.layout.segment_path(num)
            if not os.path.exists(path):
                continue
            stop = self.write_pos if num == self.write_file else None
            total += scan_segment(path, num, pos if num == fnum else 0, stop,
                                  self.min_size, self.max_size).records
        return total

    # ------------------------------------------------------------------ purge / close

    def purge(self) -> Meta:
        """Drop every unread record: go-diskqueue's ``Empty()``.

        The new meta (all positions at the start of the next file) is stored
        before any file is deleted, so a crash in between leaves only consumed
        leftovers, which the next open removes.
        """
        nxt = self.write_file + 1
        meta = Meta(0, nxt, 0, nxt, 0)
        self._unverified = None
        self._remover.wait_idle()  # so that the listing below is the final one
        self._sizes.clear()
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd, self._rnum = None, -1
        store_meta(self.layout.meta_path, meta, mode=self.layout.file_mode)
        self.meta_on_disk = meta
        for num in sorted(self.layout.segments()):
            if num < nxt:
                os.remove(self.layout.segment_path(num))
        self._oldest = nxt
        self.write_file, self.write_pos = nxt, 0
        self._data_dirty = False
        self.bytes_on_disk = self._recount_bytes()
        return meta

    def close(self) -> None:
        """Close every descriptor (the caller syncs first) and wait for the removals."""
        self._remover.close()
        for fd in (self._wfd, self._rfd):
            if fd is not None:
                os.close(fd)
        self._wfd = self._rfd = None
        self._rnum = -1
