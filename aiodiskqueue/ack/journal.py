"""The event-loop side of the ack log: entries, the pending batch, space accounting.

Every message taken out of the data queue (or put with a delay) becomes an
:class:`Entry` with a key unique within the queue. Its ``E`` record carries the
whole message, so after a crash the log alone can deliver it again; ``U`` and
``D`` records are small. The pending batch is encoded and written in one hop.

Elision: a message finished before its ``E`` record was encoded never has it
written; its ``D`` record carries the ``fetch_seq`` instead, which is all that
recovery needs (see :mod:`aiodiskqueue.ack`). Under load most messages are
fetched and finished within one batch, so the log then holds ~40 bytes per
message instead of a second copy of the body.

Space: each segment counts the bytes of the live ``E`` records it holds.
Segments are deleted from the oldest end once they hold none. When the log is
more than twice its live bytes (plus one segment), the oldest segment's live
entries are copied to the end and it is deleted: a full rotation copies at most
the live bytes while freeing at least as many dead ones, so the cost stays O(1)
amortised per message.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from .codec import done_record, entry_record, update_record
from .log import Loc, LogJob, LogResult, Recovered


class LogState(enum.Enum):
    """Where an entry's ``E`` record is."""

    PENDING = 0  # in the pending batch, not encoded yet
    WRITING = 1  # encoded into the hop in flight
    WRITTEN = 2  # on disk at ``loc``
    ELIDED = 3  # finished before it was encoded: never written


class EntryState(enum.Enum):
    """Where an entry is in its delivery life cycle."""

    READY = "ready"  # due, body in memory, waiting for a consumer
    LOADING = "loading"  # due, body to be read from the log
    DEFERRED = "deferred"  # waiting for its due time
    IN_FLIGHT = "in_flight"
    DEAD = "dead"  # on its way to the dead-letter queue
    GONE = "gone"  # finished or dead-lettered


# The members as module constants, for the per-message paths (here and in the modules
# that import them): a member looked up through its class costs ~0.1 us on Python 3.11.
LOG_PENDING, LOG_WRITING = LogState.PENDING, LogState.WRITING
LOG_WRITTEN, LOG_ELIDED = LogState.WRITTEN, LogState.ELIDED
ENTRY_READY, ENTRY_IN_FLIGHT = EntryState.READY, EntryState.IN_FLIGHT
ENTRY_DEFERRED, ENTRY_GONE = EntryState.DEFERRED, EntryState.GONE


class Entry:
    """One message known to the ack log."""

    __slots__ = (
        "after",
        "attempts",
        "body",
        "built",
        "due_ns",
        "fetch_seq",
        "key",
        "loc",
        "log_state",
        "msg",
        "msg_id",
        "state",
        "timestamp",
        "ver",
    )

    def __init__(self, key: int, fetch_seq: int, due_ns: int, attempts: int,
                 msg_id: bytes, timestamp: int, body: bytes | None) -> None:
        self.key = key
        self.fetch_seq = fetch_seq
        self.due_ns = due_ns  # wall-clock ns; 0 = deliver at once (also: in flight)
        self.attempts = attempts  # deliveries so far
        self.msg_id = msg_id
        self.timestamp = timestamp
        self.body = body  # None while only on disk
        self.loc: Loc | None = None
        self.log_state = LOG_PENDING
        self.state = ENTRY_READY
        self.ver = 0  # bumped on each state change: older heap items are stale
        self.msg: Any = None  # the Message of the current delivery
        self.built = -1  # the build number that encoded the E record
        # Made due again (requeued, timed out, deferred): delivered once the data
        # queue's takes reach this fetch_seq, behind what was queued then.
        self.after = 0


@dataclass(slots=True)
class SegInfo:
    """Size and live bytes of one segment."""

    size: int = 0
    live: int = 0
    keys: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Built:
    """What a built job needs when its result comes back."""

    job: LogJob
    entries: list[tuple[int, Entry]]  # index into job.records -> entry written
    copies: list[tuple[int, Loc]]  # key, old location
    reads: list[Entry]
    waiters: list[asyncio.Future[None]]
    records: list[tuple[str, Any]]  # the pending items, to retry after a failure


class Journal:
    """Pending records, live entries and segment accounting (event loop only)."""

    def __init__(self, rec: Recovered, segment_bytes: int) -> None:
        self.segment_bytes = segment_bytes
        self.pending: list[tuple[str, Any]] = []
        self.waiters: list[asyncio.Future[None]] = []
        self.entries: dict[int, Entry] = {}
        self.segs: dict[int, SegInfo] = {n: SegInfo(size) for n, size in rec.sizes.items()}
        self.next_key = rec.next_key
        self._builds = 0
        for key, st in rec.entries.items():
            e = Entry(key, st.fetch_seq, st.due_ns, st.attempts, b"", 0, None)
            e.loc = (st.seg, st.off, st.size)
            e.log_state = LOG_WRITTEN
            self.entries[key] = e
            seg = self.segs.setdefault(st.seg, SegInfo())
            seg.live += st.size
            seg.keys.add(key)

    # ------------------------------------------------------------------ records

    def add(self, fetch_seq: int, due_ns: int, attempts: int, msg_id: bytes, timestamp: int,
            body: bytes) -> Entry:
        """A new entry under a key never used in this queue; its ``E`` record is appended."""
        key = self.next_key
        self.next_key = key + 1
        e = Entry(key, fetch_seq, due_ns, attempts, msg_id, timestamp, body)
        self.entries[key] = e
        self.pending.append(("E", e))
        return e

    def update(self, e: Entry) -> None:
        """Record a new due time or attempts count of a live entry."""
        if e.log_state is not LOG_PENDING:  # a pending E is encoded with the new state
            self.pending.append(("U", e))

    def done(self, e: Entry) -> None:
        """Record that an entry is finished or dead-lettered; it is forgotten."""
        seq = 0
        if e.log_state is LOG_PENDING:
            e.log_state = LOG_ELIDED
            seq = e.fetch_seq
        self.pending.append(("D", (e.key, seq)))
        self._forget(e)

    def head(self, payload: bytes) -> None:
        """Append an ``H`` record."""
        self.pending.append(("H", payload))

    def wait_written(self) -> asyncio.Future[None]:
        """A future resolved once every record appended so far is written."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def _forget(self, e: Entry) -> None:
        e.state = ENTRY_GONE
        self.entries.pop(e.key, None)
        if e.loc is not None:
            seg = self.segs.get(e.loc[0])
            if seg is not None:
                seg.live -= e.loc[2]
                seg.keys.discard(e.key)
            e.loc = None

    # ------------------------------------------------------------------ hops

    def build(self, sync: bool, reads: list[Entry]) -> Built | None:
        """Encode the pending batch (plus reads, compaction, fsync) into one job."""
        self._builds += 1
        b = self._builds
        job = LogJob(sync=sync)
        written: list[tuple[int, Entry]] = []
        records, self.pending = self.pending, []
        out = job.records
        for kind, obj in records:
            if kind == "E":
                e = obj
                if e.log_state is not LOG_PENDING:
                    continue  # elided
                written.append((len(out), e))
                out.append(entry_record(e.key, e.fetch_seq, e.due_ns, e.timestamp, e.attempts,
                                        e.msg_id, e.body))
                e.log_state = LOG_WRITING
                e.built = b
            elif kind == "U":
                e = obj
                if e.state is ENTRY_GONE or e.built == b:
                    continue
                out.append(update_record(e.key, e.due_ns, e.attempts))
            elif kind == "D":
                out.append(done_record(*obj))
            else:
                out.append(obj)
        job.reads = [e.loc for e in reads if e.loc is not None]
        reads = [e for e in reads if e.loc is not None]
        copies = self._plan_space(job)
        waiters, self.waiters = self.waiters, []
        if not (job.records or job.reads or job.copies or job.delete or sync or waiters):
            return None
        return Built(job, written, copies, reads, waiters, records)

    def _plan_space(self, job: LogJob) -> list[tuple[int, Loc]]:
        nums = sorted(self.segs)
        if len(nums) < 2:
            return []
        active = nums[-1]
        for n in nums[:-1]:
            if self.segs[n].live > 0:
                break
            job.delete.append(n)
        if job.delete:
            return []
        oldest = nums[0]
        total = sum(s.size for s in self.segs.values())
        live = sum(s.live for s in self.segs.values())
        seg = self.segs[oldest]
        if oldest == active or total <= 2 * live + self.segment_bytes:
            return []
        copies: list[tuple[int, Loc]] = []
        for key in seg.keys:
            e = self.entries[key]
            assert e.loc is not None
            job.copies.append((*e.loc, e.due_ns, e.attempts))
            copies.append((key, e.loc))
        job.delete.append(oldest)
        return copies

    def apply(self, built: Built, res: LogResult) -> tuple[list[Entry], list[Entry]]:
        """Take a hop's result: locations, moved entries, sizes.

        Returns the entries just written, and the live entries whose record
        could not be read back for compaction and whose body is not in memory
        either: they are lost, the caller forgets them. One whose body is in
        memory is written again instead.
        """
        done: list[Entry] = []
        for idx, e in built.entries:
            if e.log_state is not LOG_WRITING:
                continue
            e.log_state = LOG_WRITTEN
            if e.state is ENTRY_GONE:
                continue  # finished while being written: its bytes are dead
            self._place(e, res.locs[idx])
            done.append(e)
        lost: list[Entry] = []
        for (key, old), new in zip(built.copies, res.copy_locs, strict=True):
            moved = self.entries.get(key)
            if moved is None or moved.loc != old:
                continue
            if new is None:  # damaged on disk, and its segment is gone now
                self._unplace(moved)
                if moved.body is None:
                    lost.append(moved)
                else:
                    moved.log_state = LOG_PENDING
                    self.pending.append(("E", moved))
                continue
            self._unplace(moved)
            self._place(moved, new)
        for n in list(self.segs):
            if n not in res.sizes:
                del self.segs[n]
        for n, size in res.sizes.items():
            self.segs.setdefault(n, SegInfo()).size = size
        for w in built.waiters:
            if not w.done():
                w.set_result(None)
        return done, lost

    def fail(self, built: Built, exc: BaseException) -> None:
        """A hop failed: its records go back to the front of the batch, waiters get ``exc``."""
        for _, e in built.entries:
            if e.log_state is LOG_WRITING:
                e.log_state = LOG_PENDING
        self.pending[:0] = built.records
        for w in built.waiters:
            if not w.done():
                w.set_exception(exc)

    def _place(self, e: Entry, loc: Loc) -> None:
        e.loc = loc
        seg = self.segs.setdefault(loc[0], SegInfo())
        seg.live += loc[2]
        seg.keys.add(e.key)

    def _unplace(self, e: Entry) -> None:
        if e.loc is not None:
            seg = self.segs.get(e.loc[0])
            if seg is not None:
                seg.live -= e.loc[2]
                seg.keys.discard(e.key)
            e.loc = None

    # ------------------------------------------------------------------ figures

    def bytes_on_disk(self) -> int:
        """Total size of the log's segments."""
        return sum(s.size for s in self.segs.values())

    def live_bytes(self) -> int:
        """Bytes of live ``E`` records."""
        return sum(s.live for s in self.segs.values())
