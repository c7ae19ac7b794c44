"""Reading a queue's messages from its files without opening it: ``dump`` (also
``--follow`` while a producer writes) and the live ``stats`` of a queue in use.

Nothing here writes a file or takes the queue's lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._format.layout import Layout, file_size
from .._format.meta import load_meta
from .._format.scan import BAD_LENGTH, TORN, ZEROS, Span, iter_spans, tail_summary, unread_start
from .inspect import ERROR, Problem, walk_segment

# ---------------------------------------------------------------------- reading messages


class StoredMessage(NamedTuple):
    """One stored message, its number from the first message shown, and where its record starts."""

    seq: int
    file: str
    offset: int
    payload: bytes


def start_position(layout: Layout, min_size: int = 0,
                   max_size: int = 1 << 20) -> tuple[int, int]:
    """Where the oldest unread message is, by the queue's own rule
    (:func:`~aiodiskqueue._format.scan.unread_start`)."""
    try:
        meta = load_meta(layout.meta_path)
    except ValueError:
        meta = None
    return unread_start(meta, layout.segments(), min_size, max_size)


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
                     max_size: int = 1 << 20) -> Iterator[StoredMessage]:
    """Yield the readable records of every ``.bad`` file, oldest segment first.

    Each file is read from its start up to its first damage: what an operator
    can still salvage from it.
    """
    index = 0
    for path in sorted(layout.bad_files(), key=lambda p: (_bad_num(p), p)):
        fname = os.path.basename(path)
        for span in iter_spans(path, _bad_num(path), 0, None, min_size, max_size):
            for payload, _, end in span.records:
                yield StoredMessage(index, fname, end - 4 - len(payload), payload)
                index += 1


def iter_messages(layout: Layout, min_size: int = 0, max_size: int = 1 << 20,
                  start: tuple[int, int] | None = None,
                  on_problem: Callable[[Problem], None] | None = None,
                  ) -> Iterator[StoredMessage]:
    """Yield the stored messages from ``start`` (default: the oldest unread) to the end.

    Follows the queue's reading rules: a damaged segment is reported through
    ``on_problem`` and reading goes on with the next one; a missing segment is
    skipped. Nothing is consumed.
    """
    fnum, pos = start if start is not None else start_position(layout, min_size, max_size)
    index = 0
    segs = layout.segments()
    last = max(segs, default=-1)
    for num, path in sorted(segs.items()):
        if num < fnum:
            continue
        begin = pos if num == fnum else 0
        fname = os.path.basename(path)
        try:
            stop, zeros = (_zero_tail(layout, num, path, begin, min_size, max_size)
                           if num == last else (None, None))
            spans = iter_spans(path, num, begin, stop, min_size, max_size)
            for span in spans:
                for payload, _, end in span.records:
                    yield StoredMessage(index, fname, end - 4 - len(payload), payload)
                    index += 1
                if span.problem is not None and on_problem is not None:
                    kind = "torn tail" if span.problem == TORN else "bad length"
                    on_problem(Problem(kind, ERROR, fname, span.end,
                                       "reading goes on with the next segment"))
            if zeros is not None and on_problem is not None:
                on_problem(zeros)
        except FileNotFoundError:
            continue  # consumed and deleted by the queue while we looked


def _zero_tail(layout: Layout, num: int, path: str, begin: int, min_size: int,
               max_size: int) -> tuple[int | None, Problem | None]:
    """Where reading the last segment stops, by the queue's rule for a zero-filled
    tail (:func:`~aiodiskqueue._format.scan.zero_filled_tail`), and the problem there;
    ``(None, None)`` when it ends in records."""
    try:
        meta = load_meta(layout.meta_path)
    except ValueError:
        meta = None
    if meta is not None and num < meta.write_file_num:
        return None, None
    pos = begin if meta is None else meta.write_pos if num == meta.write_file_num else 0
    pos = max(pos, begin)
    t = tail_summary(path, num, pos, os.path.exists(layout.empty_marker_path), min_size,
                     max_size)
    if t.problem == ZEROS:
        detail = (f"{t.size - t.end} byte(s) of zeros that read as empty messages never put "
                  "(a zero-filled tail: the queue cuts them on open)")
        return t.end, Problem("zero-filled tail", ERROR, os.path.basename(path), t.end, detail)
    if t.problem == BAD_LENGTH:
        # Where the damage starts: after the records, without zeros that precede it.
        return t.end, Problem("bad length", ERROR, os.path.basename(path), t.end,
                              "reading goes on with the next segment")
    return None, None


class Follower:
    """Reads new records as they are written, like ``tail -f``; never consumes.

    Call :meth:`poll` repeatedly; each call returns the messages written since
    the previous one. A record still being written (an incomplete tail) is
    waited for, not reported. The newest segment's zero-filled tail is held back
    and reported once, by the queue's rule (see :func:`_zero_tail`).
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

    def poll(self) -> list[StoredMessage]:
        """Messages that appeared since the last call."""
        out: list[StoredMessage] = []
        while True:
            # List first: a segment newer than ours existing now means ours was
            # complete before this scan began (the writer rolls only after writing).
            segs = self.layout.segments()
            newer = sorted(n for n in segs if n > self.fnum)
            path = segs.get(self.fnum)
            if path is not None:
                fname = os.path.basename(path)
                try:
                    # The newest segment may end in a zero-filled tail: held back (read
                    # again next time), not skipped, so records written after zero-length
                    # ones that were real still come, in order.
                    stop, zeros = (None, None) if newer else _zero_tail(
                        self.layout, self.fnum, path, self.pos, self.min_size, self.max_size)
                    if zeros is not None and os.path.exists(path):
                        self._report_once(zeros)
                    for span in iter_spans(path, self.fnum, self.pos, stop,
                                           self.min_size, self.max_size):
                        for payload, _, end in span.records:
                            out.append(StoredMessage(self.index, fname, end - 4 - len(payload),
                                               payload))
                            self.index += 1
                        self.pos = span.end
                        # An incomplete record at the end of the newest segment is
                        # still being written: wait for it. A segment whose name is gone
                        # was consumed and removed while we read it (the queue may free
                        # a removed segment in steps): not damage.
                        if ((span.problem == BAD_LENGTH or (span.problem == TORN and newer))
                                and os.path.exists(path)):
                            self._report(path, span)
                except FileNotFoundError:
                    pass  # consumed and deleted by the queue
            if not newer:
                return out
            self.fnum, self.pos = newer[0], 0

    def _report_once(self, problem: Problem) -> None:
        key = (self.fnum, problem.offset)
        if key not in self._reported:
            self._reported.add(key)
            self.problems.append(problem)

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
    The newest segment's zero-filled tail counts as neither depth nor puts.
    Each sample scans only new bytes and the unread part of the read segment.
    """

    def __init__(self, layout: Layout, min_size: int = 0, max_size: int = 1 << 20) -> None:
        self.layout = layout
        self.min_size = min_size
        self.max_size = max_size
        self._scanned: dict[int, tuple[int, int]] = {}  # num -> (end scanned, records)
        self._prev: Sample | None = None
        self._written = 0

    def _count(self, num: int, path: str, stop: int | None) -> tuple[int, int]:
        """Records of segment ``num`` up to ``stop`` (None: its end), counted once."""
        end, records = self._scanned.get(num, (0, 0))
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return end, records
        fresh = self._prev is None
        if size < end:  # cut by a repair or recovery: count again, not as new puts
            end, records, fresh = 0, 0, True
        if min(size, size if stop is None else stop) > end:
            w = walk_segment(path, num, end, self.min_size, self.max_size, stop=stop)
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
        last = max(segs, default=-1)
        for num in sorted(segs):
            # The newest segment may end in a zero-filled tail: no messages, no puts.
            stop = None
            if num == last:
                try:
                    stop = _zero_tail(self.layout, num, segs[num], rp if num == rf else 0,
                                      self.min_size, self.max_size)[0]
                except FileNotFoundError:
                    pass
            end, records = self._count(num, segs[num], stop)
            size_total += file_size(segs[num])
            if num < rf:
                continue
            if num == rf and rp > 0:
                depth += walk_segment(segs[num], num, rp, self.min_size, self.max_size,
                                      stop=stop).records if rp < end else 0
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
