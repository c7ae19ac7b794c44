"""Where the ready messages lie on disk, and so where the consumer stands.

The read-ahead (``QueueBuffers.ready``) holds payloads alone, so that taking a message
is one ``popleft()`` and no position per message is built or stored. :class:`Runs`
keeps, for each stretch of ready messages that lie back to back in one segment, the
segment, where the stretch starts and ends, and how many messages it holds. The
consumer position (just past the last message taken), which goes into the meta file,
follows from that and from what is still ready: the messages not yet taken of the
oldest stretch are its last ones, so the position is that stretch's end less their
bytes. It is worked out when the meta is stored or statistics are read, not per take.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .._format.codec import HEADER_SIZE
from .._format.scan import Record


class Stretch(NamedTuple):
    """Messages read or handed over that lie back to back from ``start`` to ``end`` of
    segment ``file_num``."""

    payloads: list[bytes]
    file_num: int
    start: int
    end: int


class Runs:
    """The stretches of ready messages on disk, oldest first, and the position before
    the oldest (``base``).

    Only the event loop's thread changes it (:meth:`add`, :meth:`reset`). :meth:`at`
    only reads, so ``statistics()`` may call it from any thread (a metrics scrape, a
    ``repr``): there the numbers it is given can be a moment apart from the runs, and
    the answer is then a position near the true one, never an error. On the loop's
    thread, where the meta is stored, it is exact.
    """

    __slots__ = ("base", "count", "runs")

    def __init__(self) -> None:
        self.base = (0, 0)
        # (file_num, start, end, messages); replaced, never changed in place, so that a
        # copy taken from another thread holds whole runs.
        self.runs: deque[tuple[int, int, int, int]] = deque()
        self.count = 0  # messages in all runs, taken ones included

    def reset(self, at: tuple[int, int]) -> None:
        """No message is ready: the consumer stands at ``at``."""
        self.base = at
        self.runs.clear()
        self.count = 0

    def add(self, file_num: int, start: int, end: int, n: int, ready: int) -> None:
        """``n`` messages lying back to back from ``start`` to ``end`` of ``file_num``
        join the ``ready`` ones (counted before these join). Runs taken whole are
        dropped first, so the runs are never more than those holding ready messages."""
        runs = self.runs
        taken = self.count - ready
        while runs and runs[0][3] <= taken:
            fnum, _, rend, k = runs.popleft()
            self.base = (fnum, rend)
            self.count -= k
            taken -= k
        if n <= 0:
            return
        if runs:
            last = runs[-1]
            if last[0] == file_num and last[2] == start:
                runs[-1] = (file_num, last[1], end, last[3] + n)
                self.count += n
                return
        runs.append((file_num, start, end, n))
        self.count += n

    def add_records(self, records: list[Record], ready: int) -> list[bytes]:
        """Add ``records`` (``(payload, file_num, end)``) as runs; returns their
        payloads. Records that do not follow each other on disk start a new run."""
        payloads = [r[0] for r in records]
        file_num = start = end = -1
        n = 0
        for payload, fnum, rend in records:
            rstart = rend - HEADER_SIZE - len(payload)
            if n and (fnum != file_num or rstart != end):
                self.add(file_num, start, end, n, ready)
                ready += n
                n = 0
            if not n:
                file_num, start = fnum, rstart
            end = rend
            n += 1
        if n:
            self.add(file_num, start, end, n, ready)
        return payloads

    def at(self, ready: int, ready_bytes: int) -> tuple[int, int]:
        """The consumer position while ``ready`` messages of ``ready_bytes`` bytes
        (headers included) are not yet taken. Changes nothing."""
        runs = list(self.runs)  # one C call: whole runs, whatever another thread does
        base = self.base
        taken = self.count - ready
        for i, (file_num, start, end, n) in enumerate(runs):
            if taken < n:
                if taken <= 0:
                    return base
                # Partly taken: its untaken messages are its last ones.
                later = sum(r[2] - r[1] for r in runs[i + 1:])
                return (file_num, min(end, max(start, end - (ready_bytes - later))))
            taken -= n
            base = (file_num, end)
        return base
