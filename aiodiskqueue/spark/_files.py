"""Queue files as the Spark source sees them: pure Python, no Spark, read-only.

Positions are ``(file_num, pos)`` pairs, always on record boundaries. They stay
valid while a queue is consumed and appended to, which is what makes them
usable as streaming offsets.

Reading never changes a file. Only :func:`~._consume.release` (consume mode)
and :func:`~._staging.link` (the sink's driver-side commit) change a queue, and
both do it under the queue's lock, the same lock a
:class:`~aiodiskqueue.DiskQueue` holds while it is open (a release beside a live
producer: under the consumer role's lock and the meta writers' lock instead).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .._format.layout import Layout
from .._format.lock import lock_holder
from .._format.meta import Meta, load_meta
from .._format.roles import published_record
from .._format.scan import BAD_LENGTH, ZEROS, Record, iter_spans, scan_segment, tail_summary
from ..errors import DiskQueueError
from ._errors import corrupt_length, repair_advice, report_torn
from ._listing import QueueFiles

log = logging.getLogger("aiodiskqueue.spark")

Pos = tuple[int, int]

READ_CHUNK = 4 << 20  # bytes per pread when reading records on an executor



@dataclass(frozen=True, slots=True)
class FileSpan:
    """Whole records of segment ``num`` from byte ``start`` to byte ``stop``."""

    num: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Bytes in the span."""
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a reader may read of one queue right now, without changing anything.

    ``spans`` run from the read position to ``end``. When a live process holds
    the queue's lock, ``end`` is the write position of the meta file, which the
    holder stores only after an fsync, so everything below it is whole and
    stable. When nobody holds the lock, ``end`` also covers the tail that the
    core's recovery would find on open: whole records past the meta's write
    position in the write segment and in later segments. ``missing`` lists the
    segments between the read and the write position that are not there: their
    records are lost.
    """

    layout: Layout
    meta: Meta | None
    read: Pos
    end: Pos
    spans: list[FileSpan]
    holder: int | None
    tail_records: int = 0
    torn: tuple[int, int, int] | None = None  # (num, whole-record end, size) of a torn last file
    sizes: dict[int, int] = field(default_factory=dict)
    missing: tuple[int, ...] = ()
    published: Pos | None = None  # a live producer's published position, if one is live

    @property
    def drained(self) -> bool:
        """Whether nothing is left to read from the read position."""
        return self.read >= self.end


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def view_queue(layout: Layout, min_size: int, max_size: int, *, owned: bool = False,
               files: QueueFiles | None = None) -> QueueView:
    """Describe the unread records of one queue.

    ``owned`` says the caller holds the queue's lock itself (so nobody else
    writes). ``files`` is what a directory listing found for this queue (the
    directory is listed here when it is None). Raises DiskQueueError if the
    meta file cannot be parsed.
    """
    if files is None:
        segs = layout.segments()
        sizes = {n: _size(p) for n, p in segs.items()}
    else:
        segs, sizes = files.segments, dict(files.sizes)
    try:
        meta = load_meta(layout.meta_path)
    except ValueError as exc:
        raise DiskQueueError(
            f"{layout.meta_path}: unreadable meta file ({exc}); repair it with "
            f"'{repair_advice(layout.directory, layout.name)}'"
        ) from None
    holder = None if owned else lock_holder(layout.lock_path)
    producer = None if owned else published_record(layout.role_path("producer"))
    if meta is not None:
        read = meta.read
        wf, wp = meta.write
    else:
        read = (min(segs), 0) if segs else (0, 0)
        wf, wp = read
    spans: list[FileSpan] = []
    rf, rp = read
    missing = tuple(n for n in range(rf, wf + 1)
                    if n not in segs and (n < wf or wp > (rp if n == rf else 0)))
    for num in sorted(n for n in segs if rf <= n < wf):
        start = rp if num == rf else 0
        if sizes[num] > start:
            spans.append(FileSpan(num, start, sizes[num]))
    end: Pos = (wf, wp)
    if producer is not None and producer.at >= end:
        # A live producer: everything before its published position is whole, whatever
        # the meta says (it stores its meta only now and then); nothing past it is read.
        pf, pp = producer.at
        for num in range(wf, pf + 1):
            size = _size(layout.segment_path(num))
            start = rp if num == rf else 0
            stop = pp if num == pf else size
            if size < 0:
                if (pp if num == pf else 1) > start and num not in missing:
                    missing += (num,)
                continue
            sizes[num] = size
            if stop > start:
                spans.append(FileSpan(num, start, stop))
        return QueueView(layout, meta, read, producer.at, spans, producer.pid or holder,
                         sizes=sizes, missing=missing, published=producer.at)
    if holder is not None:
        start = rp if wf == rf else 0
        if wf in segs and wp > start:
            spans.append(FileSpan(wf, start, wp))
        return QueueView(layout, meta, read, end, spans, holder, sizes=sizes, missing=missing)
    tail = 0
    torn = None
    later = sorted(n for n in segs if n >= wf)
    marked = os.path.exists(layout.empty_marker_path)
    for num in later:
        scan_from = wp if num == wf else 0
        try:
            if num == later[-1]:
                # Without the empty-message marker, zero-length records that end the last
                # segment are a zero-filled tail, as the core sees them: cut like a torn one.
                s = tail_summary(segs[num], num, scan_from, marked, min_size, max_size)
            else:
                s = scan_segment(segs[num], num, scan_from, None, min_size, max_size)
        except FileNotFoundError:
            continue  # consumed since the listing
        tail += s.records
        start = rp if num == rf else 0
        # A file a later one follows is read to its end, like the files before the write
        # position: damage in it is reported by the task that reads it. In the last file,
        # bytes after the last whole record are what a crash leaves (the core cuts them on
        # open), unless they start with a length no record may have.
        stop = s.end if num == later[-1] else s.size
        if stop > start:
            spans.append(FileSpan(num, start, stop))
        sizes[num] = s.size
        if s.end < s.size:
            torn = (num, s.end, s.size)
            if s.problem in (BAD_LENGTH, ZEROS) and num == later[-1]:
                log.warning("%s: %s at byte %d; reading stops there", segs[num], s.problem, s.end)
        end = (num, s.end)
    if torn is not None and torn[0] != end[0]:
        torn = None  # the core quarantines a damaged file that is not the last one
    return QueueView(layout, meta, read, end, spans, None, tail, torn, sizes, missing)


Lost = tuple[Pos, Pos]


def spans_between(view: QueueView, start: Pos, end: Pos) -> tuple[list[FileSpan], list[Lost]]:
    """The file spans holding the records between positions ``start`` and ``end``,
    and the ranges among them whose segment file is gone (consumed, removed or
    missing), as ``(from, to)`` position pairs."""
    out: list[FileSpan] = []
    lost: list[Lost] = []
    if start >= end:
        return out, lost
    (sf, sp), (ef, ep) = start, end
    stops = {s.num: s.stop for s in view.spans}
    for num in range(sf, ef + 1):
        lo = sp if num == sf else 0
        hi = ep if num == ef else stops.get(num, view.sizes.get(num, -1))
        if view.sizes.get(num, -1) < 0:
            if num == ef and hi <= lo:
                continue
            gone_to = (num, hi) if num == ef else (num + 1, 0)
            if lost and lost[-1][1] == (num, 0):
                lost[-1] = (lost[-1][0], gone_to)
            else:
                lost.append(((num, lo), gone_to))
            continue
        if hi > lo:
            out.append(FileSpan(num, lo, hi))
    return out, lost


def iter_records(
    layout: Layout, spans: list[FileSpan], min_size: int, max_size: int, *,
    fail_on_data_loss: bool = True,
) -> Iterator[list[Record]]:
    """Yield the records of ``spans`` in order, one list per read chunk.

    Raises CorruptionError at a length outside ``[min_size, max_size]``,
    DiskQueueError if a segment is gone, DataLoss if a span ends in bytes that
    are no whole record (see :func:`~._errors.report_torn`; with
    ``fail_on_data_loss`` false they are logged and skipped).
    """
    for span in spans:
        path = layout.segment_path(span.num)
        try:
            end = span.start
            chunks = iter_spans(path, span.num, span.start, span.stop, min_size, max_size,
                                READ_CHUNK)
            for chunk in chunks:
                if chunk.records:
                    yield chunk.records
                end = chunk.end
                if chunk.problem == BAD_LENGTH:
                    # Most often a queue written with a larger max_msg_size: failing says
                    # so, where skipping the rest of the file would lose it quietly.
                    raise corrupt_length(layout, path, chunk.end, chunk.bad_length,
                                         min_size, max_size)
            if end < span.stop:
                have = min(os.stat(path).st_size, span.stop)
                report_torn(layout, path, end, span.stop, have, fail_on_data_loss)
        except FileNotFoundError:
            raise DiskQueueError(
                f"{path} is gone before its records were read: another process consumed or "
                f"removed queue {layout.name!r} under this job"
            ) from None
