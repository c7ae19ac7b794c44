"""Offline analysis of a queue's files, and the repair planner and executor.

Everything here reads segments through :func:`aiodiskqueue._scan.iter_spans`
(the one record reader) and names files and positions through
:class:`aiodiskqueue._layout.Layout`. :func:`analyze` never writes;
:func:`execute` is the only function that changes files, and only while it
holds the queue's lock.

Problem kinds reported by :func:`analyze` (``severity`` in brackets):

- ``torn tail`` [error]: bytes after the last whole record of a segment.
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
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._format.layout import Layout, free_bad_name, fsync_dir
from .._format.lock import QueueLock, lock_holder
from .._format.meta import Meta, load_meta, store_meta
from .._format.scan import BAD_LENGTH, TORN, Span, iter_spans

ERROR = "error"
WARNING = "warning"

Progress = Callable[[int], None]
"""Called with the number of bytes just scanned."""


class QueueNotFound(LookupError):
    """Neither a meta file nor any segment of the queue exists in the directory."""

    def __init__(self, directory: str, name: str) -> None:
        super().__init__(f"no queue named {name!r} in {directory}")
        self.directory = directory
        self.name = name


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
) -> Walk:
    """Read segment ``num`` from ``start`` to its end, counting records around ``marks``.

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
    for span in iter_spans(path, num, start, None, min_size, max_size):
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
        return f"{self.severity.upper():7} {self.kind:15} {self.file} @ {self.offset}: {self.detail}"


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


def queue_exists(layout: Layout) -> bool:
    """Whether the queue has a meta file, a segment or a quarantined segment."""
    return (os.path.exists(layout.meta_path) or bool(layout.segments())
            or bool(layout.bad_files()))


def holder(layout: Layout) -> int | None:
    """Pid of the live process that has the queue open, or None (creates nothing)."""
    return lock_holder(layout.lock_path)


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
                   max_size: int = 1 << 20) -> tuple[int, tuple[int, int]]:
    """Whole records past the meta's write position, and the real end of the data.

    Scans only what was written after the last meta sync, so it is cheap even
    for a large queue: this is what the queue itself recovers on open.
    """
    wf, wp = meta.write
    count, end = 0, (wf, wp)
    for num, path in sorted(layout.segments().items()):
        if num < wf:
            continue
        try:
            w = walk_segment(path, num, wp if num == wf else 0, min_size, max_size)
        except FileNotFoundError:
            continue
        if num == wf and w.size < wp:
            break  # the meta is ahead of the data: nothing past it
        count += w.records
        end = (num, w.end)
    return count, end


def analyze(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
            progress: Progress | None = None) -> QueueReport:
    """Scan every record of the queue and report its state and problems; read-only.

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
        rf, rp = meta.read
        wf, wp = meta.write

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
        top = max(top, wf if wp > 0 else wf - 1)
    missing = [n for n in range(rf, top + 1) if n not in segs]
    for n in missing:
        what = ("the segment holding the read position is gone" if n == rf
                else "segment between the read and write positions is gone")
        problems.append(Problem("missing segment", ERROR, name(layout.segment_path(n)),
                                rp if n == rf else 0, what))
    if rf not in segs:
        rf, rp = (live[0], 0) if live else (wf, 0)
    last = live[-1] if live else None

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
        if is_read and rp > 0:
            pre = walk_segment(path, num, 0, min_size, max_size, (rp,) + marks, progress)
            mark = pre.marks.get(rp)
            if mark is not None and mark.boundary:
                w = pre
                start, consumed = rp, pre.before(rp)
            elif mark is not None and pre.end >= rp:
                # The read position falls inside a whole record: go back to its
                # start, delivering it again rather than losing it.
                problems.append(Problem("bad position", ERROR, name(path), rp,
                                        "read position is not at a record boundary (the "
                                        f"record around it starts at {mark.prev_boundary})"))
                w = pre
                start, consumed = mark.prev_boundary, mark.before
            elif pre.size < rp:
                problems.append(Problem("bad position", ERROR, name(path), rp,
                                        f"read position is past the end of the file "
                                        f"({pre.size} bytes)"))
                w = pre
                start, consumed = pre.end, pre.records
            else:
                # Damage before the read position: already consumed, never read again.
                notes.append(f"{name(path)}: unreadable bytes at offset {pre.end} before the "
                             f"read position {rp} (consumed, ignored)")
                w = walk_segment(path, num, rp, min_size, max_size, marks, progress)
                start, consumed = rp, pre.records
            new_read = (num, start)
        else:
            w = walk_segment(path, num, 0, min_size, max_size, marks, progress)
        unread = w.records - consumed
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
                elif m is not None and not m.boundary and wp <= w.end:
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
        if unindexed:
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
        directory=layout.directory, name=layout.name, meta=meta, meta_state=meta_state,
        meta_error=meta_error, segments=tuple(sorted(reports, key=lambda s: s.num)),
        bad_files=tuple(layout.bad_files()), locked_by_pid=holder(layout),
        read=new_read, write=write, depth=depth,
        indexed_depth=indexed if meta is not None else None,
        problems=tuple(problems), notes=tuple(notes), missing=tuple(missing),
    )


# ---------------------------------------------------------------------- repair


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a repair."""

    kind: str  # "truncate", "quarantine", "placeholder", "move meta", "write meta"
    file: str
    offset: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"kind": self.kind, "file": self.file, "offset": self.offset,
                "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.kind:11} {self.file} @ {self.offset}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Plan:
    """The actions that make a queue consistent, and the meta it ends with."""

    actions: tuple[Action, ...]
    meta: Meta
    report: QueueReport = field(repr=False)

    @property
    def needed(self) -> bool:
        """Whether anything has to change on disk."""
        return bool(self.actions)


def plan_repair(report: QueueReport) -> Plan:
    """Work out the repair of ``report``'s queue; touches nothing.

    Torn tails of the last segment are truncated (the bytes are not a record).
    A segment damaged anywhere else is quarantined: copied whole to ``.bad``,
    then cut after its last whole record, so every readable record stays in the
    queue. A missing segment between the read and write positions is replaced
    by an empty one so the numbering stays contiguous. Finally the meta file is
    rewritten with the recounted depth and the real end of the data, which
    indexes records written after the last meta sync.
    """
    lay = Layout(report.directory, report.name)
    actions: list[Action] = []
    live = [s for s in report.segments if s.role != "consumed"]
    last = live[-1].num if live else None
    if report.meta_state == "unreadable":
        actions.append(Action("move meta", os.path.basename(lay.meta_path), 0,
                              "move the unparsable meta file aside as .bad"))
    for s in live:
        if s.problem is None or s.problem_offset is None:
            continue
        if s.problem == TORN and s.num == last:
            actions.append(Action("truncate", s.file, s.end,
                                  f"cut {s.size - s.end} byte(s) of torn tail"))
        else:
            actions.append(Action("quarantine", s.file, s.end,
                                  f"copy to .bad, then keep the {s.consumed + s.unread} whole "
                                  f"record(s) before offset {s.end}"))
    rf = report.read[0]
    for n in report.missing:
        if n > rf and (last is not None and n < last):
            actions.append(Action("placeholder", os.path.basename(lay.segment_path(n)), 0,
                                  "create an empty segment in place of the missing one"))
    meta = Meta(report.depth, *report.read, *report.write)
    if report.meta is None or meta != report.meta:
        old = "none" if report.meta is None else _meta_text(report.meta)
        actions.append(Action("write meta", os.path.basename(lay.meta_path), 0,
                              f"{old} -> {_meta_text(meta)}"))
    return Plan(tuple(actions), meta, report)


def _meta_text(m: Meta) -> str:
    return (f"depth {m.depth}, read {m.read_file_num},{m.read_pos}, "
            f"write {m.write_file_num},{m.write_pos}")


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def execute(plan: Plan) -> list[str]:
    """Carry out ``plan`` (the caller holds the queue's lock); return what was done.

    Each quarantined copy is complete and fsynced before its segment is cut.
    The meta file is stored last, atomically, so a crash part-way leaves a
    queue that the next repair or open still recovers.
    Raises OSError if a step fails; the steps before it stay done.
    """
    lay = Layout(plan.report.directory, plan.report.name)
    done: list[str] = []
    for a in plan.actions:
        path = os.path.join(lay.directory, a.file)
        if a.kind == "move meta":
            dst = free_bad_name(path)
            os.rename(path, dst)
            done.append(f"moved {a.file} to {os.path.basename(dst)}")
        elif a.kind == "truncate":
            os.truncate(path, a.offset)
            _fsync_path(path)
            done.append(f"truncated {a.file} at {a.offset}")
        elif a.kind == "quarantine":
            dst = free_bad_name(path)
            tmp = dst + ".tmp"
            shutil.copyfile(path, tmp)
            _fsync_path(tmp)
            os.rename(tmp, dst)
            fsync_dir(lay.directory)
            os.truncate(path, a.offset)
            _fsync_path(path)
            done.append(f"quarantined {a.file} as {os.path.basename(dst)}, kept bytes "
                        f"0..{a.offset}")
        elif a.kind == "placeholder":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            done.append(f"created empty {a.file}")
        elif a.kind == "write meta":
            continue
        else:  # pragma: no cover - plan_repair makes only the kinds above
            raise ValueError(f"unknown repair action {a.kind!r}")
    fsync_dir(lay.directory)
    if any(a.kind == "write meta" for a in plan.actions):
        store_meta(lay.meta_path, plan.meta)
        done.append(f"wrote {os.path.basename(lay.meta_path)}: {_meta_text(plan.meta)}")
    return done


def repair(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
           progress: Progress | None = None) -> tuple[Plan, list[str]]:
    """Lock the queue, analyze it again under the lock, and repair it.

    Raises QueueLocked if another process has the queue open, QueueNotFound
    if it does not exist, OSError if a step fails.
    """
    if not queue_exists(layout):
        raise QueueNotFound(layout.directory, layout.name)
    lock = QueueLock(layout.lock_path)
    lock.acquire()
    try:
        plan = plan_repair(analyze(layout, min_size, max_size, progress))
        done = execute(plan) if plan.needed else []
    finally:
        lock.release()
    return plan, done


# ---------------------------------------------------------------------- reading messages


class Message(NamedTuple):
    """One stored message, its number from the first message shown, and where its record starts."""

    seq: int
    file: str
    offset: int
    payload: bytes


def start_position(layout: Layout) -> tuple[int, int]:
    """Where the oldest unread message is: the meta's read position, or the first segment."""
    try:
        meta = load_meta(layout.meta_path)
    except ValueError:
        meta = None
    segs = layout.segments()
    if meta is None:
        return (min(segs), 0) if segs else (0, 0)
    return meta.read


def _bad_num(path: str) -> int:
    # NAME.diskqueue.000020.dat.bad[.N]: the segment number it was quarantined from.
    part = os.path.basename(path).rsplit(".diskqueue.", 1)[-1].split(".", 1)[0]
    return int(part) if part.isdigit() else -1


def quarantine_summary(path: str, min_size: int = 0, max_size: int = 1 << 20) -> dict[str, Any]:
    """What a ``.bad`` file still holds: whole records up to its first damage."""
    w = walk_segment(path, _bad_num(path), 0, min_size, max_size)
    return {"file": os.path.basename(path), "size": w.size, "records": w.records,
            "readable_bytes": w.end, "problem": w.problem,
            "problem_offset": w.end if w.problem is not None else None}


def iter_quarantined(layout: Layout, min_size: int = 0,
                     max_size: int = 1 << 20) -> Iterator[Message]:
    """Yield the readable records of every ``.bad`` file, oldest segment first.

    Each file is read from its start up to its first damage: what an operator
    can still salvage from it.
    """
    index = 0
    for path in sorted(layout.bad_files(), key=lambda p: (_bad_num(p), p)):
        fname = os.path.basename(path)
        for span in iter_spans(path, _bad_num(path), 0, None, min_size, max_size):
            for payload, _, end in span.records:
                yield Message(index, fname, end - 4 - len(payload), payload)
                index += 1


def iter_messages(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
                  start: tuple[int, int] | None = None,
                  on_problem: Callable[[Problem], None] | None = None,
                  ) -> Iterator[Message]:
    """Yield the stored messages from ``start`` (default: the oldest unread) to the end.

    Follows the queue's reading rules: a damaged segment is reported through
    ``on_problem`` and reading goes on with the next one; a missing segment is
    skipped. Nothing is consumed.
    """
    fnum, pos = start if start is not None else start_position(layout)
    index = 0
    for num, path in sorted(layout.segments().items()):
        if num < fnum:
            continue
        begin = pos if num == fnum else 0
        fname = os.path.basename(path)
        try:
            spans = iter_spans(path, num, begin, None, min_size, max_size)
            for span in spans:
                for payload, _, end in span.records:
                    yield Message(index, fname, end - 4 - len(payload), payload)
                    index += 1
                if span.problem is not None and on_problem is not None:
                    kind = "torn tail" if span.problem == TORN else "bad length"
                    on_problem(Problem(kind, ERROR, fname, span.end,
                                       "reading goes on with the next segment"))
        except FileNotFoundError:
            continue  # consumed and deleted by the queue while we looked


class Follower:
    """Reads new records as they are written, like ``tail -f``; never consumes.

    Call :meth:`poll` repeatedly; each call returns the messages written since
    the previous one. A record still being written (an incomplete tail) is
    waited for, not reported.
    """

    def __init__(self, layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
                 start: tuple[int, int] | None = None) -> None:
        self.layout = layout
        self.min_size = min_size
        self.max_size = max_size
        self.fnum, self.pos = start if start is not None else start_position(layout)
        self.index = 0
        self.problems: list[Problem] = []
        self._reported: set[tuple[int, int]] = set()

    def poll(self) -> list[Message]:
        """Messages that appeared since the last call."""
        out: list[Message] = []
        while True:
            # List first: a segment newer than ours existing now means ours was
            # complete before this scan began (the writer rolls only after writing).
            segs = self.layout.segments()
            newer = sorted(n for n in segs if n > self.fnum)
            path = segs.get(self.fnum)
            if path is not None:
                fname = os.path.basename(path)
                try:
                    for span in iter_spans(path, self.fnum, self.pos, None,
                                           self.min_size, self.max_size):
                        for payload, _, end in span.records:
                            out.append(Message(self.index, fname, end - 4 - len(payload),
                                               payload))
                            self.index += 1
                        self.pos = span.end
                        # An incomplete record at the end of the newest segment is
                        # still being written: wait for it.
                        if span.problem == BAD_LENGTH or (span.problem == TORN and newer):
                            self._report(path, span)
                except FileNotFoundError:
                    pass  # consumed and deleted by the queue
            if not newer:
                return out
            self.fnum, self.pos = newer[0], 0

    def _report(self, path: str, span: Span) -> None:
        key = (self.fnum, span.end)
        if key in self._reported:
            return
        self._reported.add(key)
        kind = "bad length" if span.problem == BAD_LENGTH else "torn tail"
        self.problems.append(Problem(kind, ERROR, os.path.basename(path), span.end,
                                     "reading goes on with the next segment"))


# ---------------------------------------------------------------------- live statistics


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a queue from its files."""

    time: float
    depth: int
    written: int  # records counted on disk since the first sample (grows with puts)
    put_rate: float | None
    get_rate: float | None
    bytes_on_disk: int
    read: tuple[int, int]
    write: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"time": self.time, "depth": self.depth, "put_rate": self.put_rate,
                "get_rate": self.get_rate, "bytes": self.bytes_on_disk,
                "read_file_num": self.read[0], "read_pos": self.read[1],
                "write_file_num": self.write[0], "write_pos": self.write[1]}


class Watcher:
    """Derives depth and put/get rates from successive snapshots of the files.

    Puts are the whole records that appear past the previously seen end of the
    data; the read position comes from the meta file, so gets are seen when the
    queue syncs its meta (every ``sync_every`` messages or ``sync_interval``).
    Each sample scans only new bytes and the unread part of the read segment.
    """

    def __init__(self, layout: Layout, min_size: int = 0, max_size: int = 1 << 20) -> None:
        self.layout = layout
        self.min_size = min_size
        self.max_size = max_size
        self._scanned: dict[int, tuple[int, int]] = {}  # num -> (end scanned, records)
        self._prev: Sample | None = None
        self._written = 0

    def _count(self, num: int, path: str) -> tuple[int, int]:
        end, records = self._scanned.get(num, (0, 0))
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return end, records
        fresh = self._prev is None
        if size < end:  # cut by a repair or recovery: count again, not as new puts
            end, records, fresh = 0, 0, True
        if size > end:
            w = walk_segment(path, num, end, self.min_size, self.max_size)
            if not fresh:
                self._written += w.records
            end, records = w.end, records + w.records
            self._scanned[num] = (end, records)
        return end, records

    def sample(self, now: float) -> Sample:
        """Take one snapshot at time ``now`` (seconds, any monotonic clock)."""
        try:
            meta = load_meta(self.layout.meta_path)
        except ValueError:
            meta = None
        segs = self.layout.segments()
        if meta is not None:
            rf, rp = meta.read
        else:
            rf, rp = (min(segs), 0) if segs else (0, 0)
        depth = 0
        write = (rf, rp)
        size_total = 0
        for num in sorted(segs):
            end, records = self._count(num, segs[num])
            size_total += _size(segs[num])
            if num < rf:
                continue
            if num == rf and rp > 0:
                depth += walk_segment(segs[num], num, rp, self.min_size,
                                      self.max_size).records if rp < end else 0
            else:
                depth += records
            write = (num, end)
        for num in [n for n in self._scanned if n not in segs]:
            del self._scanned[num]
        prev = self._prev
        put_rate = get_rate = None
        if prev is not None and now > prev.time:
            dt = now - prev.time
            puts = self._written - prev.written
            put_rate = puts / dt
            get_rate = max(0, prev.depth + puts - depth) / dt
        s = Sample(now, depth, self._written, put_rate, get_rate, size_total, (rf, rp), write)
        self._prev = s
        return s


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
