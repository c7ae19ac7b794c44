"""Record boundaries inside a segment: splitting a span into byte ranges for
parallel tasks, and reading a range as blocks of record offsets.

A segment has no sync markers: a record boundary can only be found by walking
the length fields from a known boundary. The driver walks each span it splits
once (4-byte length fields only, no payload copies) and hands every task the
exact first boundary of its range, so a task never reads from the start of a
segment, and the ranges of one span cover it with no gap and no overlap. The
cuts of a span are cached in the driver process, keyed by the file (inode and
modification time) and by everything that decides them (the span, the target
size, the allowed record sizes), so a second read of the same sealed segments
with the same options costs nothing, and one with other options cuts anew.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from .._format.access import read_fd
from .._format.codec import HEADER_SIZE
from .._format.layout import Layout
from ..errors import DiskQueueError
from ._errors import corrupt_length, report_torn
from ._files import FileSpan, Pos, QueueView

log = logging.getLogger(__name__)

WALK_CHUNK = 4 << 20
ADVANCE_CHUNK = 256 << 10  # a trigger's limit is often far less than a segment
_unpack = struct.Struct(">i").unpack_from

# (path, inode, mtime_ns, start, stop, target, min_size, max_size) -> cuts
_walks: dict[tuple[str, int, int, int, int, int, int, int], list[int]] = {}


def walk_boundaries(path: str, start: int, stop: int, every: int,
                    min_size: int, max_size: int, limit: int = -1) -> list[int]:
    """Record boundaries in ``(start, stop)`` of a segment: the first at or past each
    multiple of ``every`` bytes from ``start``, at most ``limit`` of them (no limit if
    negative).

    ``start`` must be a record boundary. The walk ends early (returning what
    it found) at a length outside ``[min_size, max_size]`` or a record that
    runs past ``stop``: the task reading that range reports the problem.
    """
    cuts: list[int] = []
    fd = read_fd(path)
    try:
        pos = start
        cut_at = start + every
        while pos < stop:
            buf = os.pread(fd, min(WALK_CHUNK, stop - pos), pos)
            size = len(buf)
            if size < HEADER_SIZE:
                break
            count, stride = equal_run(buf, min_size, max_size)
            while count and cut_at <= pos + count * stride:
                cut = pos + max(1, -(-(cut_at - pos) // stride)) * stride
                cuts.append(cut)
                if len(cuts) == limit:
                    return [c for c in cuts if c < stop]
                while cut_at <= cut:
                    cut_at += every
            off = count * stride
            last = size - HEADER_SIZE
            while off <= last:
                (n,) = _unpack(buf, off)
                if n < min_size or n > max_size:
                    return cuts
                nxt = off + HEADER_SIZE + n
                if nxt > size:
                    break
                off = nxt
                if pos + off >= cut_at:
                    cuts.append(pos + off)
                    if len(cuts) == limit:
                        return [c for c in cuts if c < stop]
                    while cut_at <= pos + off:
                        cut_at += every
            if off == 0:
                # A record longer than the chunk: its length field says where it ends.
                (n,) = _unpack(buf, 0)
                nxt = pos + HEADER_SIZE + n
                if nxt > stop:
                    return cuts
                pos = nxt
                if cut_at <= pos < stop:
                    cuts.append(pos)
                    if len(cuts) == limit:
                        break
                    while cut_at <= pos:
                        cut_at += every
                continue
            pos += off
    finally:
        os.close(fd)
    return [c for c in cuts if c < stop]


def split_span(layout: Layout, span: FileSpan, target: int,
               min_size: int, max_size: int) -> list[FileSpan]:
    """``span`` cut at record boundaries into pieces of about ``target`` bytes."""
    if span.size <= target:
        return [span]
    path = layout.segment_path(span.num)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [span]  # the task reports the missing file
    # The modification time tells a segment from a later one that reuses its name and inode.
    key = (path, st.st_ino, st.st_mtime_ns, span.start, span.stop, target, min_size, max_size)
    cuts = _walks.get(key)
    if cuts is None:
        # A cut at the first boundary past each multiple of ``step``: as many pieces as
        # a perfect split whenever each step holds a record boundary.
        pieces = -(-span.size // target)
        step = max(1, span.size // pieces)
        cuts = walk_boundaries(path, span.start, span.stop, step, min_size, max_size,
                               pieces - 1)
        if len(_walks) > 4096:
            _walks.clear()
        _walks[key] = cuts
    bounds = [span.start, *cuts, span.stop]
    return [FileSpan(span.num, a, b) for a, b in itertools.pairwise(bounds) if b > a]


@dataclass(frozen=True, slots=True)
class Block:
    """Whole records in ``buf``: record ``i`` starts at ``starts[i]`` (header included)
    and ends at ``starts[i + 1]``; ``base`` is the file offset of ``buf[0]``."""

    buf: bytes
    base: int
    starts: list[int]


def equal_run(buf: bytes, min_size: int, max_size: int) -> tuple[int, int]:
    """``(count, stride)``: how many whole records of one size open ``buf``, each
    ``stride`` bytes with its header; ``(0, 0)`` if fewer than 2.

    Queues often hold records of one size. Their length fields then repeat every
    ``stride`` bytes, which a few strided slices (C loops, not one Python step per
    record) check at once; a block of mixed sizes costs one failed comparison.
    """
    if len(buf) < HEADER_SIZE:
        return 0, 0
    (n,) = _unpack(buf, 0)
    stride = HEADER_SIZE + n
    if n < min_size or n > max_size or stride <= HEADER_SIZE:
        return 0, 0
    count = len(buf) // stride
    if count < 2:
        return 0, 0
    head = buf[:HEADER_SIZE]
    lanes = [buf[i:count * stride:stride] for i in range(HEADER_SIZE)]
    if all(lane == head[i:i + 1] * count for i, lane in enumerate(lanes)):
        return count, stride
    lo, hi = 1, count  # lanes agree on the first ``lo`` records, not on all ``hi``
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if all(lane[:mid] == head[i:i + 1] * mid for i, lane in enumerate(lanes)):
            lo = mid
        else:
            hi = mid
    return (lo, stride) if lo > 1 else (0, 0)


def iter_blocks(layout: Layout, span: FileSpan, min_size: int, max_size: int,
                chunk: int = WALK_CHUNK, *, fail_on_data_loss: bool = True) -> Iterator[Block]:
    """The records of ``span`` as blocks of about ``chunk`` bytes.

    Raises CorruptionError at a length outside ``[min_size, max_size]``,
    DiskQueueError if the segment is gone, DataLoss if the span ends in bytes
    that are no whole record (see :func:`~._errors.report_torn`; with
    ``fail_on_data_loss`` false they are logged and skipped).
    """
    path = layout.segment_path(span.num)
    try:
        fd = read_fd(path)
    except FileNotFoundError:
        raise DiskQueueError(
            f"{path} is gone before its records were read: another process consumed or "
            f"removed queue {layout.name!r} under this job"
        ) from None
    try:
        pos, stop = span.start, span.stop
        while pos < stop:
            want = min(chunk, stop - pos)
            buf = os.pread(fd, want, pos)
            size = len(buf)
            run = equal_run(buf, min_size, max_size)
            starts: list[int] = list(range(0, run[0] * run[1], run[1])) if run[0] else []
            append = starts.append
            off = run[0] * run[1]
            limit = size - HEADER_SIZE
            while off <= limit:
                (n,) = _unpack(buf, off)
                if n < min_size or n > max_size:
                    if starts:
                        append(off)
                        yield Block(buf, pos, starts)
                    raise corrupt_length(layout, path, pos + off, n, min_size, max_size)
                nxt = off + HEADER_SIZE + n
                if nxt > size:
                    break
                append(off)
                off = nxt
            if starts:
                append(off)
                yield Block(buf, pos, starts)
                pos += off
                continue
            # Not one whole record in the chunk: a large record, or the end of the data.
            if size >= HEADER_SIZE:
                (n,) = _unpack(buf, 0)
                if pos + HEADER_SIZE + n <= stop and want < HEADER_SIZE + n:
                    chunk = HEADER_SIZE + n
                    continue
            report_torn(layout, path, pos, stop, pos + size, fail_on_data_loss)
            return
    finally:
        os.close(fd)


def walk_records(path: str, start: int, stop: int, max_rows: int | None,
                 max_bytes: int | None, min_size: int, max_size: int,
                 rows: int = 0, nbytes: int = 0) -> tuple[int, int, int, bool, bool]:
    """Walk the length fields of a segment from record boundary ``start`` towards ``stop``
    (no payload is copied), admitting records until ``max_rows`` or ``max_bytes``.

    ``rows`` and ``nbytes`` were admitted before (by earlier spans); a record
    is always admitted when none was. Returns ``(end, rows, nbytes, full,
    problem)``: the offset just past the last record admitted, the totals,
    whether a limit stopped the walk, and whether a length outside
    ``[min_size, max_size]`` or a record cut short did.
    """
    fd = read_fd(path)
    try:
        pos = start
        while pos < stop:
            buf = os.pread(fd, min(ADVANCE_CHUNK, stop - pos), pos)
            size = len(buf)
            count, stride = equal_run(buf, min_size, max_size)
            if count:
                take = count
                if max_rows is not None:
                    take = min(take, max(max_rows - rows, 0 if rows else 1))
                if max_bytes is not None:
                    take = min(take, max((max_bytes - nbytes) // stride, 0 if rows else 1))
                rows += take
                nbytes += take * stride
                if take < count:
                    return pos + take * stride, rows, nbytes, True, False
            off = count * stride
            last = size - HEADER_SIZE
            while off <= last:
                (n,) = _unpack(buf, off)
                if n < min_size or n > max_size:
                    return pos + off, rows, nbytes, False, True
                nxt = off + HEADER_SIZE + n
                if nxt > size:
                    break
                if rows and ((max_rows is not None and rows >= max_rows) or
                             (max_bytes is not None and nbytes + nxt - off > max_bytes)):
                    return pos + off, rows, nbytes, True, False
                rows += 1
                nbytes += nxt - off
                off = nxt
            if off:
                pos += off
                continue
            # Not one whole record in the chunk: a record longer than it, or one cut short.
            if size < HEADER_SIZE:
                return pos, rows, nbytes, False, True
            (n,) = _unpack(buf, 0)
            if n < min_size or n > max_size or pos + HEADER_SIZE + n > stop:
                return pos, rows, nbytes, False, True
            if rows and ((max_rows is not None and rows >= max_rows) or
                         (max_bytes is not None and nbytes + HEADER_SIZE + n > max_bytes)):
                return pos, rows, nbytes, True, False
            rows += 1
            nbytes += HEADER_SIZE + n
            pos += HEADER_SIZE + n
        return pos, rows, nbytes, False, False
    finally:
        os.close(fd)


def count_records(path: str, start: int, stop: int | None, min_size: int,
                  max_size: int) -> int:
    """Whole records of a segment from record boundary ``start`` to ``stop`` (None: the
    end of the file), up to the first problem. Raises OSError if it cannot be opened."""
    if stop is None:
        stop = os.stat(path).st_size
    return walk_records(path, start, stop, None, None, min_size, max_size)[1]


def advance(
    view: QueueView,
    spans: list[FileSpan],
    max_rows: int | None,
    max_bytes: int | None,
    min_size: int,
    max_size: int,
) -> tuple[Pos | None, int, int]:
    """Walk records through ``spans`` until a limit is reached.

    Returns ``(position, rows, bytes)``: the position just past the last
    record admitted (``None`` if ``spans`` is empty), and what was admitted.
    At least one record is admitted when there is one, so a stream always
    makes progress. A position at the end of a span that has a successor is
    moved to the successor's start, so the finished file can be released.
    """
    rows = 0
    nbytes = 0
    pos: Pos | None = None
    for i, span in enumerate(spans):
        path = view.layout.segment_path(span.num)
        end, rows, nbytes, full, problem = walk_records(
            path, span.start, span.stop, max_rows, max_bytes, min_size, max_size, rows, nbytes)
        if end > span.start:
            pos = (span.num, end)
        if problem:
            pos = (span.num, span.stop)  # the rest of a damaged file is never delivered
        if pos is None and not full:
            pos = (span.num, span.stop)
        if pos == (span.num, span.stop) and i + 1 < len(spans):
            pos = (spans[i + 1].num, spans[i + 1].start)
        if full:
            break
    return pos, rows, nbytes
