"""The background task of an :class:`~aiodiskqueue.AckQueue`: hops to the ack log,
log syncs, commits, purges and dead-lettering, one at a time.

A *hop* writes the journal's pending records to the log on its I/O thread (and reads
back the bodies of due entries); a *log sync* is a hop with an fsync; a *commit* stops
taking messages, writes a head record with the data queue's read position, fsyncs the
log and then syncs the data queue (see the package's design notes in
:mod:`aiodiskqueue.ack`).

Records that nothing waits for (a delivery's, a finish's) *linger* before their hop:
it is sent once :data:`LINGER_RECORDS` are pending or the oldest has waited
:data:`LINGER` seconds. A hop wakes the I/O thread, which then waits for the GIL after
each system call; where a thread's sleep and wake-up are dear (a VM whose idle vCPUs
halt: 40-70 us of CPU each on the project's, see ``bench/README.md``), hops sent as
soon as the thread is free cost a consumer that waits on the network between
messages (the broker's) more than its messages do. Records that something
waits for (a deferred put, a load, a log sync, a commit) go at once, and a commit
writes whatever lingers first, so no durability promise moves; and a delivery
finished while its record lingers is never written with its body (see
:mod:`.journal`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, final

from .._core.iothread import IOThread
from .._format import nsq
from ..errors import DiskQueueError, QueueClosed
from .codec import head_record
from .files import migrate_dead_letters
from .journal import Entry, EntryState, Journal
from .log import AckLog, Recovered

if TYPE_CHECKING:
    from .queue import AckQueue

log = logging.getLogger(__name__)

#: Seconds the oldest record nothing waits for may linger before a hop writes it ...
LINGER = 0.002
#: ... unless this many are pending (the hop then goes at once).
LINGER_RECORDS = 512
_TIMER_SLACK = 0.001
LOAD_BATCH = 256
"""Bodies of due entries read back from the log in one hop, at most."""


@final
class Pump:
    """Runs the queue's log and commit work; the queue calls :meth:`kick` when there is some.

    The pump owns the ack log's I/O thread, the waiters for durability (commit, log
    sync, purge), the requeues held back until a log sync (``sync_every=1``), and the
    entries on their way to the dead-letter queue.
    """

    def __init__(self, q: AckQueue) -> None:
        self._q = q
        self._io: IOThread | None = None
        self._store: AckLog | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.paused = False
        """True while taking from the data queue is stopped (during a commit)."""
        self.dead: list[Entry] = []
        """Entries out of attempts, to be put into the dead-letter queue."""
        self.commits = 0
        self.log_syncs = 0
        self._wake: asyncio.Future[None] | None = None
        self._fetch_task: asyncio.Task[None] | None = None
        self._ops = 0
        self._commit_at = 0.0
        # Entries put into the dead-letter queue, not yet logged as done: they are once
        # that queue is synced (see _dead_letter).
        self._dead_put: list[Entry] = []
        self._sync_waiters: list[asyncio.Future[None]] = []  # need a commit
        self._log_waiters: list[asyncio.Future[None]] = []  # need the log fsynced
        self._purge_waiters: list[asyncio.Future[None]] = []
        # sync_every=1: entries requeued for now, held back until the log sync that
        # records their last delivery, so attempts seen by consumers never go back
        # after a crash. (entry, its ver when held)
        self._held: list[tuple[Entry, int]] = []
        # When the oldest pending record that nothing waits for is due to be written.
        self._linger_until: float | None = None

    # ------------------------------------------------------------------ life cycle

    async def recover(self) -> Journal:
        """Open the data and dead-letter queues and the log; rebuild the journal from the
        log and schedule its entries (ready ones to load, deferred ones at their due time).

        Raises QueueLocked if a queue is open elsewhere, DiskQueueError if a file cannot
        be opened (the caller closes what was opened).
        """
        q = self._q
        await q._data.__aenter__()
        if q._dead_q is not None:
            # The data queue's lock is held: no other opener of this queue races the move.
            try:
                await q._loop.run_in_executor(None, migrate_dead_letters, q.directory, q.name)
            except OSError as exc:
                raise DiskQueueError(f"cannot move the dead letters of {q.name!r} in "
                                     f"{q.directory!r} to their new place: {exc}") from exc
            await q._dead_q.__aenter__()
        self._io = IOThread(f"aiodiskqueue-ack-{q.name}")
        self._store = AckLog(q.directory, q.name, q._segment_bytes, q._log_reserve_bytes)
        try:
            rec: Recovered = await self._io.run(self._store.open)
        except OSError as exc:
            raise DiskQueueError(f"cannot open the ack log of {q.name!r} in "
                                 f"{q.directory!r}: {exc}") from exc
        await q._data.sync()  # the data queue's first meta, before any take
        await self._skip_logged(rec)
        q._fetch_seq = rec.fetch_seq
        journal = Journal(rec, q._segment_bytes)
        q._journal = journal
        now, wall = q._clock.monotonic(), q._clock.time_ns()
        for e in sorted(journal.entries.values(), key=lambda e: e.key):
            if e.due_ns <= wall:  # in flight at the crash, or came due while closed
                e.state = EntryState.LOADING
                q._need_load.append(e)
            else:
                q._defer(e, now + (e.due_ns - wall) / 1e9)
        return journal

    async def _skip_logged(self, rec: Recovered) -> None:
        """Drop the data queue's messages that the log already accounts for."""
        q = self._q
        d = q._data
        skip = rec.fetch_seq
        if rec.commit is not None:
            cseq, cfile, cpos = rec.commit
            skip = rec.fetch_seq - cseq
            st = d.statistics()
            while (st.read_file_num, st.read_pos) < (cfile, cpos) and d.qsize():
                await d.get()
                st = d.statistics()
        for _ in range(skip):
            if not d.qsize():
                log.warning("%s: the ack log has %d more take(s) than the data queue holds",
                            q.name, skip)
                break
            await d.get()

    def start(self) -> None:
        """Start the background task (the queue is open)."""
        q = self._q
        self._commit_at = q._loop.time() + q._sync_interval
        self.task = q._loop.create_task(self._run(), name=f"aiodiskqueue-ack-{q.name}")

    async def close_stores(self) -> None:
        """Close the data queue, the dead-letter queue and the log."""
        q = self._q
        await q._data.aclose()
        if q._dead_q is not None:
            await q._dead_q.aclose()
        io = self._io
        if io is not None:
            assert self._store is not None
            try:
                await io.run(self._store.close)
            except OSError:
                log.exception("%s: closing the ack log failed", q.name)
            io.stop()
            self._io = None

    # ------------------------------------------------------------------ requests

    def kick(self) -> None:
        """Wake the task: there is work (or a waiter) for it."""
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def records_added(self, ops: int = 0) -> None:
        """Records that nothing waits for were appended, for ``ops`` operations that count
        towards ``sync_every``: wake the task, unless the records linger behind earlier
        ones (the task's timer, or :data:`LINGER_RECORDS`, ends that) and no commit is due.
        """
        self._ops += ops
        if (self._linger_until is None or self._ops >= self._q._sync_every
                or len(self._q._journal.pending) >= LINGER_RECORDS):
            self.kick()

    def count_op(self) -> None:
        """Count one put, take, finish or requeue towards ``sync_every``."""
        self._ops += 1
        if self._ops >= self._q._sync_every:
            self.kick()

    async def wait_commit(self) -> None:
        """Wait for the next commit (raises as the commit does)."""
        q = self._q
        q._check_open()
        fut = q._loop.create_future()
        self._sync_waiters.append(fut)
        self.kick()
        await fut

    async def wait_log_sync(self) -> None:
        """Wait until the log is fsynced with everything appended so far."""
        q = self._q
        q._check_open()
        fut = q._loop.create_future()
        self._log_waiters.append(fut)
        self.kick()
        await fut

    async def wait_purge(self) -> None:
        """Wait for a purge of everything ready or deferred."""
        q = self._q
        fut = q._loop.create_future()
        self._purge_waiters.append(fut)
        self.kick()
        await fut

    def hold(self, e: Entry) -> None:
        """Keep a requeued entry back until the next log sync or commit."""
        self._held.append((e, e.ver))

    def drop_held(self) -> None:
        """Drop the held requeues (a purge)."""
        for e, ver in self._held:
            if e.ver == ver:
                e.ver += 1
                self._q._journal.done(e)
        self._held.clear()

    # ------------------------------------------------------------------ the loop

    def _commit_due(self) -> bool:
        # With sync_every=1 durability comes from the waiters: most need only
        # the log fsynced (finish, requeue, deferred put), a cheaper step.
        if self._sync_waiters or (self._q._sync_every > 1 and self._ops >= self._q._sync_every):
            return True
        return self._ops > 0 and self._q._loop.time() >= self._commit_at

    async def _run(self) -> None:
        q = self._q
        try:
            while q._is_open():
                if self._purge_waiters:
                    await self._purge()
                elif self.dead or self._dead_put:
                    await self._dead_letter()
                elif self._commit_due():
                    await self._commit()
                elif self._log_waiters:
                    await self._log_sync()
                elif q._journal.waiters or self._want_load() or self._space_work() \
                        or (q._journal.pending and self._lingered()):
                    await self.hop(False)
                else:
                    await self._idle()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("%s: ack queue pump failed", q.name)
                self.error = exc
        finally:
            await self._finish_close()

    def _lingered(self) -> bool:
        """Have the pending records lingered long enough (or grown many enough) for a
        hop? The first call after a hop starts the clock."""
        q = self._q
        if len(q._journal.pending) >= LINGER_RECORDS:
            return True
        now = q._loop.time()
        if self._linger_until is None:
            self._linger_until = now + LINGER
            return False
        # uvloop runs a timer up to a millisecond early (its clock is cached in ms):
        # without the slack the task would wake again and again until the time is up.
        return now >= self._linger_until - _TIMER_SLACK

    def _want_load(self) -> bool:
        q = self._q
        return bool(q._need_load) and len(q._ready) < max(LOAD_BATCH, len(q._getters))

    def _space_work(self) -> bool:
        journal = self._q._journal
        segs = journal.segs
        if len(segs) < 2:
            return False
        oldest = segs[min(segs)]
        if oldest.live == 0:
            return True
        total = sum(s.size for s in segs.values())
        return total > 2 * journal.live_bytes() + self._q._segment_bytes

    async def _idle(self) -> None:
        q = self._q
        loop = q._loop
        self._wake = loop.create_future()
        waits: list[asyncio.Future[Any]] = [self._wake]
        if (q._getters and not q._ready and not self.paused
                and len(q._inflight) < q._max_in_flight):
            if self._fetch_task is None or self._fetch_task.done():
                self._fetch_task = loop.create_task(self._fetch())
            waits.append(self._fetch_task)
        timer = None
        due = self._commit_at if self._ops > 0 else None
        linger = self._linger_until if q._journal.pending else None
        if linger is not None and (due is None or linger < due):
            due = linger
        if due is not None:
            timer = loop.call_at(due, self.kick)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if timer is not None:
                timer.cancel()
        t = self._fetch_task
        if t is not None and t.done():
            self._fetch_task = None
            if not t.cancelled() and t.exception() is not None:
                # The data queue refused to deliver (strict reading stopped at damage):
                # the getters take again and raise what its get_nowait() raises.
                q._wake_getters(len(q._getters))

    async def _fetch(self) -> None:
        q = self._q
        payload = await q._data.get()
        # Same step as the take: the fetch_seq order is the data queue's order.
        q._make_ready(q._take(payload))

    async def _stop_fetch(self) -> None:
        t = self._fetch_task
        if t is not None:
            if not t.done():
                t.cancel()
            await asyncio.wait([t])
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, QueueClosed):
                    log.error("%s: taking from the data queue failed: %r", self._q.name, exc)
            self._fetch_task = None

    async def hop(self, sync: bool) -> None:
        """Write the journal's pending records (fsync with ``sync``) and read due bodies.

        Raises DiskQueueError if a write fails with ``sync`` (otherwise it is retried).
        """
        q = self._q
        assert self._io is not None and self._store is not None
        self._linger_until = None  # this hop writes every record pending
        reads: list[Entry] = []
        while q._need_load and len(reads) < LOAD_BATCH:
            e = q._need_load.popleft()
            if e.state is EntryState.LOADING:
                reads.append(e)
        built = q._journal.build(sync, reads)
        if built is None:
            return
        try:
            res = await self._io.run(self._store.run, built.job)
        except OSError as exc:
            err = DiskQueueError(f"write to the ack log of {q.name!r} failed: {exc}")
            err.__cause__ = exc
            log.error("%s", err)
            q._journal.fail(built, err)
            q._need_load.extendleft(reversed(reads))
            if sync:
                raise err from exc
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # A commit lets the data queue delete what was consumed, and it may use
                # the part of the log's reserve kept for it (see .log): commit next.
                self._ops = max(self._ops, 1)
                self._commit_at = q._loop.time()
            await asyncio.sleep(min(1.0, q._sync_interval))  # back off before retrying
            return
        written, lost = q._journal.apply(built, res)
        if built.job.sync:
            self.log_syncs += 1
        for e in lost:
            log.error("%s: message %s lost: its ack log record is damaged", q.name, e.key)
            if e.state is EntryState.DEFERRED:
                q._inflight.undefer(e)
            q._journal.done(e)
        for e, payload in zip(built.reads, res.read_payloads, strict=True):
            if payload is None:
                if e.state is EntryState.LOADING:
                    log.error("%s: message %s lost: its ack log record is damaged",
                              q.name, e.key)
                    q._journal.done(e)
                continue
            ts, _, msg_id, body = nsq.decode(payload)
            e.timestamp, e.msg_id, e.body = ts, msg_id, body
            if e.state is EntryState.LOADING:
                q._make_ready(e)
        for e in written:
            if e.state is EntryState.DEFERRED:
                e.body = None
        if q._ready:
            q._wake_getters(len(q._ready))

    async def _log_sync(self) -> None:
        """fsync the log with everything appended so far (not a commit: see the module doc).

        The data queue keeps its older position; on open the log's entries past
        the last commit are skipped in it by count, so this is enough to make a
        finish, requeue or deferred put durable.
        """
        waiters, self._log_waiters = self._log_waiters, []
        await self._durable_step(self.hop(True), waiters)

    async def _commit(self) -> None:
        waiters = self._sync_waiters + self._log_waiters
        self._sync_waiters, self._log_waiters = [], []
        await self._durable_step(self.commit_now(), waiters, "commit")

    async def _durable_step(self, step: Coroutine[Any, Any, None],
                            waiters: list[asyncio.Future[None]], what: str = "") -> None:
        """Run a log sync or commit, then complete its waiters and release the held requeues.

        On success, requeued entries held for it become due; on failure they stay
        held for the next step and every waiter gets the error.
        """
        held, self._held = self._held, []
        try:
            await step
        except (DiskQueueError, OSError) as exc:
            if what:
                log.error("%s: %s failed: %s", self._q.name, what, exc)
            self._held[:0] = held
            _complete(waiters, exc)
            return
        for e, ver in held:
            if e.ver == ver:  # not purged or otherwise moved on meanwhile
                self._q._make_due(e, e.after)
        _complete(waiters, None)

    async def commit_now(self, resume: bool = True) -> None:
        """Stop taking, write and fsync the log with a head record, then sync the data queue.

        With ``resume=False`` taking stays stopped (the caller resumes it).

        Raises DiskQueueError if a write or sync fails.
        """
        q = self._q
        self._ops = 0
        self._commit_at = q._loop.time() + q._sync_interval
        self.paused = True
        try:
            await self._stop_fetch()
            st = q._data.statistics()
            q._journal.head(head_record(q._fetch_seq, q._fetch_seq, st.read_file_num,
                                        st.read_pos, q._journal.next_key))
            await self.hop(True)
            await q._data.sync()
            self.commits += 1
        finally:
            if resume:
                self.paused = False
                if q._getters:
                    q._wake_getters(len(q._getters))

    async def _purge(self) -> None:
        q = self._q
        waiters, self._purge_waiters = self._purge_waiters, []
        try:
            # First a commit with taking stopped: the log then counts no take past
            # its last head, so the data queue's new position after its purge
            # (stored by the purge itself) never makes an open skip later messages.
            await self.commit_now(resume=False)
            await q._data.purge()
            q._drop_waiting()
            self.drop_held()  # requeued before the purge: dropped with the rest
            await self.commit_now()
        except (DiskQueueError, OSError) as exc:
            self.paused = False
            q._wake_getters(len(q._getters))
            _complete(waiters, exc)
        else:
            _complete(waiters, None)

    async def _dead_letter(self) -> None:
        """Put the entries out of attempts into the dead-letter queue, make them durable
        there, and only then log them as done.

        The ``D`` record may become durable at any write of the log (a commit fsyncs it,
        so do a segment roll and a compaction): written before the dead letter is
        durable, a power cut in between would lose the message from both queues.
        """
        q = self._q
        dead_q = q._dead_q
        assert dead_q is not None
        batch, self.dead = self.dead, []
        if batch:
            payloads = [nsq.encode(e.timestamp, e.attempts, e.msg_id, e.body or b"")
                        if q._nsq else (e.body or b"") for e in batch]
            try:
                await dead_q.put_many(payloads)
            except DiskQueueError as exc:
                log.error("%s: dead-lettering %d message(s) failed: %s", q.name, len(batch),
                          exc)
                self.dead[:0] = batch
                await asyncio.sleep(min(1.0, q._sync_interval))
                return
            self._dead_put.extend(batch)
            q._dead_lettered += len(batch)  # in the dead-letter queue, for its consumers
        if q._sync_every != 1:  # with sync_every=1 the put returned once fsynced
            try:
                await dead_q.sync()
            except DiskQueueError as exc:
                # Put but maybe not durable: the next round syncs again, never puts again.
                log.error("%s: syncing %d dead letter(s) failed: %s", q.name,
                          len(self._dead_put), exc)
                await asyncio.sleep(min(1.0, q._sync_interval))
                return
        put, self._dead_put = self._dead_put, []
        for e in put:
            q._journal.done(e)
            self.count_op()

    async def _finish_close(self) -> None:
        q = self._q
        q._set_closing()
        try:
            if self.dead or self._dead_put:
                await self._dead_letter()
            await self.commit_now()
        except BaseException as exc:
            if isinstance(exc, DiskQueueError):
                log.error("%s: final commit failed: %s", q.name, exc)
            else:
                log.exception("%s: final commit failed", q.name)
            # The data queue may have handed out records the log does not hold yet: a
            # meta stored past them would lose them. Keep the one on disk; the next open
            # recovers every record after it and the log says which were finished.
            q._data._hold_meta()
        q._inflight.stop()
        q._set_closed()
        err = q._closed_error()
        for w in self._sync_waiters + self._log_waiters + self._purge_waiters:
            if not w.done():
                w.set_exception(err)
        self._sync_waiters, self._log_waiters, self._purge_waiters = [], [], []
        q._wake_getters(len(q._getters))
        await self.close_stores()


def _complete(waiters: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    """Complete every waiter that is still waiting: with ``exc``, or with success."""
    for w in waiters:
        if not w.done():
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)
