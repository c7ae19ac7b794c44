"""What the engine's schedulers share: a hop in flight and what it stands for.

A leaf: it imports nothing of the package at run time, so the engine, the flight
scheduler and the inline writes all import it and none of them imports another back.
"""

from __future__ import annotations

import asyncio
import mmap
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
# (see Engine.next_flight, Scheduler.read_first and next_done, which rely on it).
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


def sync_only(flight: Flight) -> bool:
    """Is ``flight`` a sync round on the I/O thread that writes and reads nothing?"""
    job = flight.job
    return (not flight.on_lane and job.payloads is None and job.read_from is None
            and job.recount_from is None and not job.reset_writer)


def round_only(flight: Flight) -> bool:
    """Is ``flight`` a sync round alone, on the I/O thread or a meta store on its native
    thread (a read may go beside either)?"""
    return flight.meta is not None or sync_only(flight)


async def next_done(flights: deque[Flight]) -> Flight:
    """Wait for the next flight to apply and remove it from ``flights``: the oldest, or a
    lane job (a read, or a write from the loop whose poll gave up) that is done first
    beside a sync round on the I/O thread or a meta store on its own native thread (so
    neither the consumer nor the producers wait for the round). Cancelling the wait
    leaves ``flights`` unchanged (a Hop runs to its end; the engine's close applies it)."""
    if (len(flights) > 1 and (not flights[0].on_lane or flights[0].meta is not None)
            and flights[1].on_lane):
        await asyncio.wait([flights[0].fut, flights[1].fut],
                           return_when=asyncio.FIRST_COMPLETED)
        if not flights[0].fut.done():
            beside = flights[1]
            del flights[1]
            return beside
    await flights[0].fut
    return flights.popleft()
