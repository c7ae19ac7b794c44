"""What the engine's schedulers share: a hop in flight and what it stands for.

A leaf: it imports nothing of the package at run time, so the engine, the flight
scheduler and the inline writes all import it and none of them imports another back.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from .._format.meta import Meta
    from .iothread import Hop
    from .store import Job

#: What a job of the native thread gives: (bytes written or read, errno of the write or
#: read or 0, errno of the fdatasync or 0).
LaneResult = tuple[int, int, int]

# Hops in flight at once. A second hop is sent when puts arrive while one runs (with
# sync_every=1, while its fsync runs), so the I/O thread goes straight on to it.
# Splitting one pending batch into two pipelined hops was measured slower: the I/O
# thread then waits for the GIL while the loop wakes producers.
# With two, what follows a meta store on the native meta thread is at most a lane read
# (see FlightPlan.next, read_first and next_done, which rely on it).
MAX_FLIGHTS = 2


@dataclass(slots=True)
class LaneWrite:
    """What a write-lane flight appended, for turning its outcome into a JobResult."""

    file_num: int
    pos: int
    total: int  # bytes, headers included
    from_loop: bool = False  # sent by an inline write whose poll gave up: it applies it


@dataclass(slots=True)
class LaneRead:
    """What a lane read flight reads: ``nbytes`` at ``pos`` of segment ``file_num``."""

    file_num: int
    pos: int
    nbytes: int
    buf: mmap.mmap  # filled by the native thread; look at it only once the flight is done


@dataclass(slots=True)
class Flight:
    """A hop in flight, with the futures its result resolves."""

    job: Job
    fut: Hop[Any]  # JobResult from the I/O thread, LaneResult from the write lane
    epoch: int
    waiters: list[asyncio.Future[None]]
    sync_waiters: list[asyncio.Future[None]]
    lane: LaneWrite | None = None
    read: LaneRead | None = None
    meta: Meta | None = None  # a meta store on the native meta thread

    @property
    def on_lane(self) -> bool:
        """Is this a job of a native thread (a write, a read or a meta store), not of the
        I/O thread?"""
        return self.lane is not None or self.read is not None or self.meta is not None
