"""Offline analysis of a queue's files (``inspect`` and ``verify``).

Everything here reads segments through :func:`aiodiskqueue._format.scan.iter_spans`
(the one record reader) and names files and positions through
:class:`aiodiskqueue._format.layout.Layout`. Nothing here writes a file; the repair
of what :func:`analyze` finds is :mod:`.repair`.

Problem kinds reported by :func:`analyze` (``severity`` in brackets):

- ``torn tail`` [error]: bytes after the last whole record of a segment.
- ``zero-filled tail`` [error]: zero-length records (or zeros) that end the last
  segment past the meta's write position in a queue without the empty-message
  marker: what a power cut leaves where a file's size reached the disk before its
  data (``zero_filled_tail`` in ``_format/scan.py``; the queue cuts them on open).
- ``bad length`` [error]: a length field outside ``[min_msg_size, max_msg_size]``.
- ``missing segment`` [error]: a segment between the read and write positions is gone.
- ``meta missing`` / ``meta unreadable`` [error]: segments but no usable meta file.
- ``meta ahead`` [error]: the meta's write position lies past the end of its segment.
- ``bad position`` [error]: a read or write position that is not at a record boundary.
- ``depth mismatch`` [error]: the meta's depth differs from the records between its
  read and write positions.
- ``stale meta`` [warning]: whole records past the meta's write position, written
  after the last meta sync (the queue recovers them on open; repair indexes them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._format.layout import Layout
from .._format.meta import Meta, load_meta, position_problems, read_is_trusted
from .._format.scan import (
    BAD_LENGTH,
    TORN,
    ZEROS,
    Span,
    iter_spans,
    realign,
    scan_segment,
    tail_summary,
)
from ..errors import QueueNotFound
from .holders import RolesState, holder, queue_exists, roles_state

ERROR = "error"
WARNING = "warning"

Progress = Callable[[int], None]
"""Called with the number of bytes just scanned."""


# ---------------------------------------------------------------------- walking one segment


@dataclass(slots=True)
class _Mark:
    before: int = 0  # whole records ending at or before the mark
    boundary: bool = False  # a record ends exactly at the mark (or the walk starts there)
    next_boundary: int | None = None  # the first record end at or after the mark
    prev_boundary: int = 0  # the last record end at or before the mark (or the start)


@dataclass(slots=True)
class Walk:
    """What one pass over a segment from ``start`` to its end found."""

    size: int
    start: int
    end: int
    records: int
    problem: str | None
    bad_length: int | None
    marks: dict[int, _Mark]

    def before(self, pos: int) -> int:
        """Whole records between ``start`` and ``pos`` (``pos`` must be a mark)."""
        return self.marks[pos].before


def walk_segment(
    path: str,
    num: int,
    start: int,
    min_size: int,
    max_size: int,
    marks: tuple[int, ...] = (),
    progress: Progress | None = None,
    stop: int | None = None,
) -> Walk:
    """Read segment ``num`` from ``start`` to its end (or to ``stop``), counting records
    around ``marks``.

    Raises OSError if the file cannot be opened.
    """
    ms = {m: _Mark(boundary=(m == start), next_boundary=(m if m == start else None),
                   prev_boundary=start)
          for m in marks if m >= start}
    records = 0
    end = start
    problem: str | None = None
    bad: int | None = None
    span: Span
    for span in iter_spans(path, num, start, stop, min_size, max_size):
        for m, mark in ms.items():
            if mark.next_boundary is not None:
                continue
            if span.end <= m:
                mark.before += len(span.records)
                if span.records:
                    mark.prev_boundary = span.end
                if span.end == m and span.records:
                    mark.boundary = True
                    mark.next_boundary = m
                continue
            for _, _, rec_end in span.records:
                if rec_end <= m:
                    mark.before += 1
                    mark.prev_boundary = rec_end
                    if rec_end == m:
                        mark.boundary = True
                        mark.next_boundary = m
                        break
                else:
                    mark.next_boundary = rec_end
                    break
        records += len(span.records)
        if progress is not None:
            progress(span.end - end)
        end = span.end
        problem, bad = span.problem, span.bad_length
    size = os.stat(path).st_size
    return Walk(size, start, end, records, problem, bad, ms)


def cut_zero_tail(w: Walk, path: str, num: int, pos: int, marked: bool, min_size: int,
                  max_size: int) -> None:
    """Take the zero-filled tail off walk ``w`` of the queue's last segment, scanned
    for it from ``pos`` (the meta's write position in it, else where reading starts):
    the queue's own rule (:func:`~aiodiskqueue._format.scan.zero_filled_tail`).

    Raises OSError if the file cannot be read.
    """
    if pos > w.end:
        return
    t = tail_summary(path, num, pos, marked, min_size, max_size)
    if t.end < w.end or t.problem == ZEROS:
        w.records -= (w.end - t.end) // 4  # zero-length records: 4 bytes each
        w.end, w.problem, w.bad_length = t.end, t.problem, t.bad_length


def write_rejected(path: str, num: int, wp: int, min_size: int, max_size: int) -> bool:
    """Whether recovery on open rejects the meta's write position ``wp`` in segment
    ``num`` as lying inside a record: reading from it finds a problem, and the records
    from the segment's start pass over it (``Recovery._recover_tail``). The queue then
    recounts from the read position, as without a meta.

    Raises OSError if the file cannot be read.
    """
    if wp == 0:
        return False
    s = scan_segment(path, num, wp, None, min_size, max_size)
    return s.problem is not None and realign(path, num, wp, min_size, max_size) is not None


# ---------------------------------------------------------------------- reports


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a queue, located by file name and byte offset."""

    kind: str
    severity: str
    file: str
    offset: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"kind": self.kind, "severity": self.severity, "file": self.file,
                "offset": self.offset, "detail": self.detail}

    def __str__(self) -> str:
        return (f"{self.severity.upper():7} {self.kind:15} {self.file} @ {self.offset}: "
                f"{self.detail}")


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One segment: its size, the byte range of whole records, and what is unread.

    ``role`` is ``consumed`` (wholly before the read position, left for deletion),
    ``read`` (holds the read position), ``unread``, ``write`` (holds the meta's
    write position), ``read+write``, or ``tail`` (past the meta's write segment:
    written after the last meta sync).
    """

    num: int
    file: str
    size: int
    start: int  # where unread data begins in this file (0 unless it holds the read position)
    end: int  # just past the last whole record
    consumed: int
    unread: int
    unindexed: int  # unread records past the meta's write position
    role: str
    problem: str | None
    problem_offset: int | None
    bad_length: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"num": self.num, "file": self.file, "size": self.size, "start": self.start,
                "end": self.end, "consumed": self.consumed, "unread": self.unread,
                "unindexed": self.unindexed, "role": self.role, "problem": self.problem,
                "problem_offset": self.problem_offset, "bad_length": self.bad_length}


@dataclass(frozen=True, slots=True)
class QueueReport:
    """Everything :func:`analyze` learned about one queue."""

    directory: str
    name: str
    meta: Meta | None
    meta_state: str  # "ok", "missing" or "unreadable"
    meta_error: str | None
    segments: tuple[SegmentReport, ...]
    bad_files: tuple[str, ...]
    locked_by_pid: int | None
    read: tuple[int, int]  # where a reader starts after repair (see plan_repair)
    write: tuple[int, int]  # the real end of the data
    depth: int  # unread whole records from ``read`` to ``write``
    indexed_depth: int | None  # unread records up to the meta's write position
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()
    missing: tuple[int, ...] = ()

    @property
    def sound(self) -> bool:
        """True when there is no problem at all."""
        return not self.problems

    @property
    def bytes_on_disk(self) -> int:
        """Total size of the live segments."""
        return sum(s.size for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        m = self.meta
        return {
            "name": self.name,
            "directory": self.directory,
            "meta": None if m is None else {
                "depth": m.depth, "read_file_num": m.read_file_num, "read_pos": m.read_pos,
                "write_file_num": m.write_file_num, "write_pos": m.write_pos},
            "meta_state": self.meta_state,
            "meta_error": self.meta_error,
            "depth": self.depth,
            "indexed_depth": self.indexed_depth,
            "read": list(self.read),
            "write": list(self.write),
            "bytes": self.bytes_on_disk,
            "segments": [s.to_dict() for s in self.segments],
            "bad_files": [os.path.basename(b) for b in self.bad_files],
            "locked_by_pid": self.locked_by_pid,
            "sound": self.sound,
            "problems": [p.to_dict() for p in self.problems],
            "notes": list(self.notes),
        }


def total_bytes(layout: Layout) -> int:
    """Bytes in the queue's live segments: the work a full scan has to do."""
    total = 0
    for path in layout.segments().values():
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            pass
    return total


def unindexed_tail(layout: Layout, meta: Meta, min_size: int = 0,
                   max_size: int = 1 << 20,
                   limit: tuple[int, int] | None = None) -> tuple[int, tuple[int, int]]:
    """Whole records past the meta's write position, and the real end of the data
    (with ``limit``, a live producer's published position: no further).

    Scans only what was written after the last meta sync, so it is cheap even
    for a large queue: this is what the queue itself recovers on open.
    """
    wf, wp = meta.write
    if limit is not None and limit < (wf, wp):
        limit = (wf, wp)
    count, end = 0, (wf, wp)
    segs = layout.segments()
    last = max(segs, default=-1)
    marked = os.path.exists(layout.empty_marker_path)
    for num, path in sorted(segs.items()):
        if num < wf or (limit is not None and num > limit[0]):
            continue
        start = wp if num == wf else 0
        stop = limit[1] if limit is not None and num == limit[0] else None
        try:
            w = walk_segment(path, num, start, min_size, max_size, stop=stop)
            if num == last and limit is None:
                cut_zero_tail(w, path, num, start, marked, min_size, max_size)
        except FileNotFoundError:
            continue
        if num == wf and w.size < wp:
            break  # the meta is ahead of the data: nothing past it
        count += w.records
        end = (num, w.end)
    return count, end


def analyze(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
            progress: Progress | None = None,
            limit: tuple[int, int] | None = None) -> QueueReport:
    """Scan every record of the queue and report its state and problems; read-only.

    ``limit``: a live producer's published position; nothing past it is read (a record
    being written there is not yet data, not damage), and records between the meta's
    write position and it are published, not a stale meta.

    Raises QueueNotFound if the queue has no files at all, OSError if a file
    cannot be read.
    """
    if not queue_exists(layout):
        raise QueueNotFound(layout.directory, layout.name)
    segs = layout.segments()
    name = os.path.basename
    problems: list[Problem] = []
    notes: list[str] = []
    meta_state, meta_error = "ok", None
    try:
        meta = load_meta(layout.meta_path)
        if meta is None:
            meta_state = "missing"
    except ValueError as exc:
        meta, meta_state, meta_error = None, "unreadable", str(exc)
    meta_file = name(layout.meta_path)
    stored = meta  # what the report shows; ``meta`` is what the analysis goes by
    # Whether the queue recounts from the read position on open (no usable meta, or one
    # its files contradict, with a negative depth or a write position inside a record):
    # it then looks for a zero-filled tail from where reading starts, not from the meta's
    # write position (``Recovery._from_meta``).
    recount = True

    if meta is None:
        if segs:
            detail = ("no meta file" if meta_state == "missing"
                      else f"cannot parse the meta file ({meta_error})")
            problems.append(Problem(f"meta {meta_state}", ERROR, meta_file, 0,
                                    detail + "; the state must be rebuilt from the segments"))
            rf, rp = min(segs), 0
        else:
            rf, rp = 0, 0
        wf, wp = rf, rp
    else:
        sizes = {n: os.stat(p).st_size for n, p in segs.items()}
        contradictions = position_problems(meta, sizes)
        if contradictions:
            problems.append(Problem("meta contradicts segments", ERROR, meta_file, 0,
                                    "; ".join(contradictions)))
        if not read_is_trusted(meta, sizes):
            # The queue does not trust it either: it counts every segment from the first.
            meta = None
            rf, rp = (min(segs), 0) if segs else (0, 0)
            wf, wp = rf, rp
        else:
            rf, rp = meta.read
            wf, wp = meta.write
            recount = bool(contradictions) or meta.depth < 0
            if limit is not None and limit < (wf, wp):
                limit = (wf, wp)  # stored after the record was read: published too
    if limit is not None:
        segs = {n: p for n, p in segs.items() if n <= limit[0]}

    reports: list[SegmentReport] = []
    # --- consumed leftovers: before the read file; the queue deletes them on open
    for num in sorted(n for n in segs if n < rf):
        size = os.stat(segs[num]).st_size
        reports.append(SegmentReport(num, name(segs[num]), size, size, size, 0, 0, 0,
                                     "consumed", None, None, None))
        notes.append(f"{name(segs[num])}: consumed segment left behind (deleted on next open)")

    # --- every number from the read file to the last segment must exist (the
    # meta's write file only once something was written to it)
    live = sorted(n for n in segs if n >= rf)
    top = live[-1] if live else rf - 1
    if meta is not None:
        # Bounded by the files that exist, whatever numbers the meta holds.
        bound = live[-1] + 1 if live else rf
        top = max(top, min(wf if wp > 0 else wf - 1, bound))
    missing = [n for n in range(rf, top + 1) if n not in segs]
    for n in missing:
        what = ("the segment holding the read position is gone" if n == rf
                else "segment between the read and write positions is gone")
        problems.append(Problem("missing segment", ERROR, name(layout.segment_path(n)),
                                rp if n == rf else 0, what))
    if rf not in segs:
        rf, rp = (live[0], 0) if live else (wf, 0)
    last = live[-1] if live else None
    marked = os.path.exists(layout.empty_marker_path)

    indexed = 0
    unindexed = 0
    depth = 0
    new_read = (rf, rp)
    for num in live:
        path = segs[num]
        is_read = num == rf
        is_write = meta is not None and num == wf
        marks: tuple[int, ...] = ()
        if is_write:
            marks += (wp,)
        start = 0
        consumed = 0
        stop = limit[1] if limit is not None and num == limit[0] else None
        if is_read and rp > 0:
            pre = walk_segment(path, num, 0, min_size, max_size, (rp, *marks), progress,
                               stop)
            mark = pre.marks[rp]
            # Where reading starts is the queue's own rule (scan.realign); the walk
            # only counts the records on either side of it.
            back = realign(path, num, rp, min_size, max_size)
            if back is None and mark.boundary:
                w = pre
                start, consumed = rp, pre.before(rp)
            elif back is None:
                # Damage before the read position: already consumed, never read again.
                notes.append(f"{name(path)}: unreadable bytes at offset {pre.end} before the "
                             f"read position {rp} (consumed, ignored)")
                w = walk_segment(path, num, rp, min_size, max_size, marks, progress, stop)
                start, consumed = rp, pre.records
            else:
                # The read position is inside a whole record, or past the file's end: go
                # back to the record holding it (delivered again rather than lost).
                detail = (f"read position is past the end of the file ({pre.size} bytes)"
                          if rp > pre.size else
                          "read position is not at a record boundary (the record around "
                          f"it starts at {back})")
                problems.append(Problem("bad position", ERROR, name(path), rp, detail))
                w = pre
                start, consumed = back, mark.before
            new_read = (num, start)
        else:
            w = walk_segment(path, num, 0, min_size, max_size, marks, progress, stop)
        rejected = (is_write and num == last and not recount and limit is None
                    and write_rejected(path, num, wp, min_size, max_size))
        recount = recount or rejected
        if num == last and (recount or num >= wf) and limit is None:
            cut_zero_tail(w, path, num, start if recount else wp if num == wf else 0,
                          marked, min_size, max_size)
        # A walk from the segment's start counted the consumed records too; one from
        # the read position (damage before it) did not.
        unread = w.records - (consumed if w.start == 0 else 0)
        if start > w.end:
            unread = 0
        idx_unread, tail = unread, 0
        if meta is not None:
            if num > wf:
                idx_unread, tail = 0, unread
            elif is_write:
                m = w.marks.get(wp)
                if wp > w.size:
                    problems.append(Problem("meta ahead", ERROR, name(path), wp,
                                            f"the meta's write position is past the end of the "
                                            f"file ({w.size} bytes)"))
                elif rejected or (m is not None and not m.boundary and wp <= w.end):
                    problems.append(Problem("bad position", ERROR, name(path), wp,
                                            "write position is not at a record boundary"))
                if m is not None:
                    before_wp = m.before - (consumed if w.start == 0 else 0)
                    idx_unread = max(0, min(unread, before_wp))
                    tail = unread - idx_unread
        indexed += idx_unread
        unindexed += tail
        depth += unread
        if w.problem is not None:
            if w.problem == TORN:
                where = "segment being written" if num == last else "completed segment"
                detail = (f"{w.size - w.end} byte(s) after the last whole record "
                          f"({where})")
                problems.append(Problem("torn tail", ERROR, name(path), w.end, detail))
            elif w.problem == ZEROS:
                problems.append(Problem("zero-filled tail", ERROR, name(path), w.end,
                                        f"{w.size - w.end} byte(s) of zeros that read as empty "
                                        "messages never put (the file's size reached the disk "
                                        "before its data; no empty-message marker)"))
            elif w.problem == BAD_LENGTH:
                problems.append(Problem("bad length", ERROR, name(path), w.end,
                                        f"length field {w.bad_length} outside "
                                        f"[{min_size}, {max_size}]; "
                                        f"{w.size - w.end} byte(s) unreadable"))
        role = "unread"
        if is_read and is_write:
            role = "read+write"
        elif is_read:
            role = "read"
        elif is_write:
            role = "write"
        elif meta is not None and num > wf:
            role = "tail"
        reports.append(SegmentReport(num, name(path), w.size, start, w.end, consumed, unread,
                                     tail, role, w.problem,
                                     w.end if w.problem is not None else None, w.bad_length))

    write = new_read
    if last is not None:
        write = (last, next((s.end for s in reports if s.num == last), 0))
    if meta is not None:
        if unindexed and limit is not None:
            notes.append(f"{unindexed} record(s) published by the live producer past the "
                         f"meta's write position {meta.write_file_num},{meta.write_pos}")
        elif unindexed:
            problems.append(Problem("stale meta", WARNING,
                                    name(layout.segment_path(meta.write_file_num)),
                                    meta.write_pos,
                                    f"{unindexed} whole record(s) past the meta's write position "
                                    f"{meta.write_file_num},{meta.write_pos}, written after the "
                                    "last meta sync"))
        if meta.depth != indexed:
            problems.append(Problem("depth mismatch", ERROR, meta_file, 0,
                                    f"meta depth is {meta.depth}, but {indexed} whole record(s) "
                                    "lie between its read and write positions"))
    for b in layout.bad_files():
        notes.append(f"{name(b)}: quarantined")
    return QueueReport(
        directory=layout.directory, name=layout.name, meta=stored, meta_state=meta_state,
        meta_error=meta_error, segments=tuple(sorted(reports, key=lambda s: s.num)),
        bad_files=tuple(layout.bad_files()), locked_by_pid=holder(layout),
        read=new_read, write=write, depth=depth,
        indexed_depth=indexed if meta is not None else None,
        problems=tuple(problems), notes=tuple(notes), missing=tuple(missing),
    )


_LIVE_TRIES = 5


def analyze_live(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
                 progress: Progress | None = None) -> tuple[QueueReport, RolesState]:
    """:func:`analyze` beside live roles, and the roles it found; takes no lock.

    With a live producer, reads only up to its published position. A consumer may move
    its read position and delete consumed segments during the scan: a scan that found
    problems or a vanished file while the meta or a role's record changed is done again
    (up to a few times), so a moving queue is not reported as damaged.

    Raises QueueNotFound if the queue has no files at all, OSError if a file cannot be
    read.
    """
    for attempt in range(_LIVE_TRIES):
        roles = roles_state(layout)
        before = _snapshot(layout)
        try:
            rep = analyze(layout, min_size, max_size, progress, roles.limit)
        except FileNotFoundError:
            if not roles.live or attempt == _LIVE_TRIES - 1:
                raise
            continue
        if rep.sound or not roles.live or attempt == _LIVE_TRIES - 1:
            return rep, roles
        if _snapshot(layout) == before and roles_state(layout) == roles:
            return rep, roles  # nothing moved: the problems are real
    raise AssertionError("unreachable")


def _snapshot(layout: Layout) -> tuple[object, ...]:
    try:
        meta: object = load_meta(layout.meta_path)
    except ValueError:
        meta = "unreadable"
    return (meta, tuple(sorted(layout.segments())))
