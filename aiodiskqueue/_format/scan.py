"""Reading records out of segment files: one primitive shared by the engine,
recovery on open, the command line tools and the Spark reader.

All functions here are synchronous and read-only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace

from .access import read_fd
from .codec import HEADER, HEADER_SIZE, parse
from .meta import Meta, read_is_trusted

Record = tuple[bytes, int, int]
"""``(payload, file_num, end_offset)``: a message and the position just past it."""

TORN = "torn"
BAD_LENGTH = "bad_length"
ZEROS = "zero-filled tail"  # see zero_filled_tail


@dataclass(frozen=True, slots=True)
class Span:
    """Records read from one file between ``start`` and ``end``.

    ``problem`` is None, :data:`TORN` (bytes before ``stop`` that do not make a
    whole record) or :data:`BAD_LENGTH` (a length field outside the allowed
    range at ``end``; the value is in ``bad_length``).
    """

    records: list[Record]
    start: int
    end: int
    problem: str | None = None
    bad_length: int | None = None


def read_span(
    fd: int,
    file_num: int,
    pos: int,
    stop: int,
    budget: int,
    min_size: int,
    max_size: int,
) -> Span:
    """Read whole records from ``fd`` starting at ``pos``, never past ``stop``.

    Reads about ``budget`` bytes, but always at least one whole record when one
    starts at ``pos`` (records may be larger than the budget). A problem is
    reported only where it is certain: an incomplete record is :data:`TORN`
    only if the bytes up to ``stop`` were all read.
    """
    want = min(stop - pos, max(budget, HEADER_SIZE))
    if want <= 0:
        return Span([], pos, pos)
    buf = os.pread(fd, want, pos)
    if len(buf) < want:  # the file is shorter than the caller believed
        stop = pos + len(buf)
    res = parse(buf, pos, file_num, min_size, max_size)
    if res.bad_length is not None:
        return Span(res.records, pos, res.stop, BAD_LENGTH, res.bad_length)
    end = res.stop
    if res.records or end == stop:
        if end < stop and pos + len(buf) == stop:
            return Span(res.records, pos, end, TORN)
        return Span(res.records, pos, end)
    # Not even one record fits in the budget: read exactly the first record.
    if stop - end < HEADER_SIZE:
        return Span([], pos, end, TORN)
    (n,) = HEADER.unpack_from(buf, 0)
    if n < min_size or n > max_size:
        return Span([], pos, pos, BAD_LENGTH, n)
    if pos + HEADER_SIZE + n > stop:
        return Span([], pos, pos, TORN)
    buf = os.pread(fd, HEADER_SIZE + n, pos)
    res = parse(buf, pos, file_num, min_size, max_size, 1)
    if not res.records:  # shorter than fstat said: truncated under us
        return Span([], pos, pos, TORN)
    return Span(res.records, pos, res.stop)


def iter_spans(
    path: str,
    file_num: int,
    pos: int,
    stop: int | None,
    min_size: int,
    max_size: int,
    chunk: int = 1 << 20,
) -> Iterator[Span]:
    """Yield the spans of one segment from ``pos`` to ``stop`` (None: end of file).

    The last span yielded carries the problem, if any; iteration ends there.
    Raises OSError if the file cannot be opened.
    """
    fd = read_fd(path)
    try:
        yield from _spans(fd, file_num, pos, stop, min_size, max_size, chunk)
    finally:
        os.close(fd)


def _spans(fd: int, file_num: int, pos: int, stop: int | None, min_size: int,
           max_size: int, chunk: int = 1 << 20) -> Iterator[Span]:
    """:func:`iter_spans` on an open file."""
    if stop is None:
        stop = os.fstat(fd).st_size
    while pos < stop:
        span = read_span(fd, file_num, pos, stop, chunk, min_size, max_size)
        yield span
        if span.problem is not None or span.end == pos:
            return
        pos = span.end


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """Result of :func:`scan_segment`: how many whole records, and where they end.

    ``empty`` and ``empty_tail`` count the zero-length records, all of them and those
    in the run that ends at ``end`` (4 zero bytes each); both are 0 unless asked for.
    """

    file_num: int
    path: str
    size: int
    start: int
    end: int
    records: int
    problem: str | None
    bad_length: int | None
    empty: int = 0
    empty_tail: int = 0


def scan_segment(
    path: str,
    file_num: int,
    pos: int,
    stop: int | None,
    min_size: int,
    max_size: int,
    empties: bool = False,
) -> SegmentSummary:
    """Count the whole records of a segment from ``pos`` and report the first problem;
    with ``empties``, count the zero-length records too.

    Raises OSError if the file cannot be opened.
    """
    count = empty = tail = 0
    end = pos
    problem: str | None = None
    bad: int | None = None
    for span in iter_spans(path, file_num, pos, stop, min_size, max_size):
        recs = span.records
        count += len(recs)
        end = span.end
        problem, bad = span.problem, span.bad_length
        if empties and recs:
            run = 0
            for r in reversed(recs):
                if r[0]:
                    break
                run += 1
            tail = tail + run if run == len(recs) else run
            empty += run + sum(1 for r in recs[:len(recs) - run] if not r[0])
    size = os.stat(path).st_size
    return SegmentSummary(file_num, path, size, pos, end, count, problem, bad, empty, tail)


def zero_filled_tail(s: SegmentSummary, marked: bool, min_size: int) -> SegmentSummary:
    """``s`` without its zero-filled tail: the rule every reader of a queue's files follows.

    ``s`` is the summary of the queue's last segment from the meta's write position
    (from the read position when there is no meta), scanned with ``empties``.
    ``marked`` says the queue's empty-message marker exists
    (:attr:`~aiodiskqueue._format.layout.Layout.empty_marker_path`).

    A filesystem may persist a file's new size before its data (XFS, ext4
    ``data=writeback``): after a power cut the bytes past the last fsync read as
    zeros, every 4 of them an empty record. Only the last segment can end so (a
    segment is fsynced before the next one is written), and only past the meta's
    write position (a meta is stored after the fsync of what it covers). The
    format has no checksum, so the marker decides: a queue makes it durable
    before it accepts its first empty message. With the marker (and
    ``min_size == 0``) every zero-length record is a message. Without it, the
    run of zero-length records that ends the records of ``s`` is a zero-filled
    tail; so are zeros where ``min_size >= 1`` makes a zero length invalid, when
    only zeros follow to the end of the file. The result then ends where the tail
    starts, with ``problem`` :data:`ZEROS` (cut it, with a warning), or
    :data:`BAD_LENGTH` when bytes that are no record follow the zeros (damage).
    """
    if marked and min_size == 0:
        return s
    if s.empty_tail:
        start = s.end - HEADER_SIZE * s.empty_tail
        problem = s.problem if s.problem == BAD_LENGTH else ZEROS
        return replace(s, end=start, records=s.records - s.empty_tail, problem=problem,
                       empty=s.empty - s.empty_tail, empty_tail=0)
    if s.problem == BAD_LENGTH and s.bad_length == 0 and _zeros_to_end(s.path, s.end):
        return replace(s, problem=ZEROS, bad_length=None)
    return s


def _zeros_to_end(path: str, pos: int) -> bool:
    """Whether every byte of ``path`` from ``pos`` to its end is zero."""
    with open(path, "rb") as f:
        f.seek(pos)
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    return True


def tail_summary(path: str, file_num: int, pos: int, marked: bool, min_size: int,
                 max_size: int) -> SegmentSummary:
    """The last segment's records from ``pos`` (the meta's write position in it, else 0)
    without a zero-filled tail (see :func:`zero_filled_tail`).

    Raises OSError if the file cannot be opened.
    """
    s = scan_segment(path, file_num, pos, None, min_size, max_size, empties=True)
    return zero_filled_tail(s, marked, min_size)


def realign(path: str, file_num: int, pos: int, min_size: int, max_size: int) -> int | None:
    """None if ``pos`` is a record boundary of the segment (or damage lies before it);
    else the start of the whole record holding ``pos``, or the end of the segment's
    records if ``pos`` is past the end of the file.

    The records from the segment's start must reach ``pos`` in a chain of whole records
    for ``pos`` to be inside one. Where the chain breaks before ``pos`` (a length out of
    range, or a record that the file's end cuts off), the bytes before ``pos`` are
    damaged, and ``pos`` is trusted: the records after it are intact. This is the rule
    of every reader: the queue, recovery on open, the Spark source, ``follow``, and
    ``verify`` and ``repair`` (``tools/inspect.py``).

    Reads the segment from its start: call it only after a problem was found.
    """
    fd = read_fd(path)
    try:
        end, problem = 0, None
        for span in _spans(fd, file_num, 0, pos, min_size, max_size):
            end, problem = span.end, span.problem
        size = os.fstat(fd).st_size
        if pos > size:
            return end
        if end == pos or problem == BAD_LENGTH:
            return None
        head = os.pread(fd, HEADER_SIZE, end)
    finally:
        os.close(fd)
    if len(head) < HEADER_SIZE:
        return None  # not even a length field before the file's end
    (n,) = HEADER.unpack(head)
    if n < min_size or n > max_size or end + HEADER_SIZE + n > size:
        return None  # the record at ``end`` is not whole: damage before pos
    return end


def unread_start(meta: Meta | None, segs: dict[int, str], min_size: int,
                 max_size: int) -> tuple[int, int]:
    """Where the oldest unread record starts: the rule every reader of a queue follows.

    The meta's read position when it can be trusted (see
    :func:`~aiodiskqueue._format.meta.read_is_trusted`), moved back to the start
    of the record holding it if it lies inside one; else the first segment.
    Reads only the segment holding the read position, and only when that
    position is not at its start.
    """
    first = (min(segs), 0) if segs else (0, 0)
    if meta is None:
        return first
    sizes = {n: os.stat(p).st_size for n, p in segs.items()}
    if not read_is_trusted(meta, sizes):
        return first
    rf, rp = meta.read
    if rf in segs and rp > 0:
        back = realign(segs[rf], rf, rp, min_size, max_size)
        if back is not None:
            return (rf, back)
    return (rf, rp)
