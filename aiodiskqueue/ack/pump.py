"""The background task of an :class:`~aiodiskqueue.AckQueue`: hops to the ack log,
log syncs, commits, purges and dead-lettering, one at a time.

A *hop* writes the journal's pending records to the log on its I/O thread (and reads
back the bodies of due entries); a *log sync* is a hop with an fsync; a *commit* stops
taking messages, writes a head record with the data queue's read position, fsyncs the
log and then syncs the data queue (see the package's design notes in
:mod:`aiodiskqueue.ack`).

Records that nothing waits for (a delivery's, a finish's) *linger* before their hop:
it is sent once :data:`LINGER_RECORDS` are pending or the oldest has waited
:data:`LINGER` seconds, since each hop costs thread wake-ups (why they are dear:
docs/design.md, "Why wake-ups decide the design"). Records that something
waits for (a deferred put, a load, a log sync, a commit) go at once, and a commit
writes whatever lingers first, so no durability promise moves; and a delivery
finished while its record lingers is never written with its body (see
:mod:`.journal`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, final

from .._core.iothread import IOThread
from .._format import nsq
from ..errors import DiskQueueError, QueueClosed, QueuePermissionError
from .codec import head_record
from .files import migrate_dead_letters
from .journal import Entry, EntryState, Journal
from .log import AckLog, Recovered

if TYPE_CHECKING:
    from ..queue import DiskQueue

log = logging.getLogger(__name__)

#: Seconds the oldest record nothing waits for may linger before a hop writes it ...
LINGER = 0.002
#: ... unless this many are pending (the hop then goes at once).
LINGER_RECORDS = 512
_TIMER_SLACK = 0.001
LOAD_BATCH = 256
"""Bodies of due entries read back from the log in one hop, at most."""


class PumpHost(Protocol):
    """What the pump needs of the delivery state it serves (``ack.dispatch.Dispatcher``)."""

    @property
    def fetch_seq(self) -> int:
        """Messages taken out of the data queue, ever."""

    def take_fetched(self, payload: bytes) -> None:
        """A message the pump waited for in the data queue: take it, make it ready."""

    def make_ready(self, e: Entry) -> None:
        """An entry whose body was read back: ready (or dead if out of attempts)."""

    def make_due(self, e: Entry, after: int | None = None) -> None:
        """A held requeue whose log sync is done: due again, behind ``after``."""

    def lost(self, e: Entry) -> None:
        """An entry whose log record is damaged: forget it."""

    def drop_waiting(self) -> None:
        """A purge: forget every ready, loading and deferred entry."""

    def wake_for_ready(self) -> None:
        """Wake as many getters as entries are ready."""

    def wake_all(self) -> None:
        """Wake every getter (taking resumed, or the queue closing)."""

    def n_ready(self) -> int:
        """Entries ready in memory."""

    def n_getters(self) -> int:
        """Getters waiting."""

    def wants_fetch(self) -> bool:
        """Whether the pump should wait for the data queue's next message for the getters."""

    def is_open(self) -> bool:
        """True while the queue is open."""

    def check_open(self) -> None:
        """Raise the closed error unless the queue is open."""

    def closed_error(self) -> DiskQueueError:
        """The error for an operation on a queue that is not open."""

    def closing(self) -> None:
        """The pump is closing the queue: no more deliveries."""

    def closed(self) -> None:
        """The pump closed the queue: stop the timer, wake every getter."""


@dataclass(frozen=True, slots=True)
class PumpConfig:
    """The queue's settings the pump works by."""

    name: str
    directory: str
    segment_bytes: int
    reserve_bytes: int
    sync_every: int
    sync_interval: float
    nsq: bool
    file_mode: int
    dir_mode: int


@final
class Pump:
    """Runs the queue's log and commit work; the delivery state calls :meth:`kick` when
    there is some, and is called back through :class:`PumpHost`.

    The pump owns the ack log (its files and I/O thread), the data and dead-letter
    queues' opening, syncing and closing, the waiters for durability (commit, log sync,
    purge), the requeues held back until a log sync (``sync_every=1``), the entries
    whose bodies are to be read back from the log, and the entries on their way to the
    dead-letter queue.
    """

    def __init__(self, config: PumpConfig, data: DiskQueue, dead: DiskQueue | None) -> None:
        self.config = config
        self.name = config.name
        self._sync_every = config.sync_every
        self._sync_interval = config.sync_interval
        self.data = data
        """The data queue (opened, synced and closed by the pump)."""
        self.dead_q = dead
        """The dead-letter queue, if ``max_attempts > 0``."""
        self._host: PumpHost
        self._loop: asyncio.AbstractEventLoop
        self._journal: Journal
        self._loading: deque[Entry] = deque()  # due, their bodies to be read from the log
        self._io: IOThread | None = None
        self._store: AckLog | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.paused = False
        """True while taking from the data queue is stopped (during a commit)."""
        self._dead: list[Entry] = []  # out of attempts, to be put into the dead-letter queue
        self.commits = 0
        self.log_syncs = 0
        self.dead_lettered = 0
        """Messages put into the dead-letter queue since open."""
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

    async def open(self, host: PumpHost, loop: asyncio.AbstractEventLoop) -> tuple[Journal, int]:
        """Open the data and dead-letter queues and the log; return the journal rebuilt
        from the log and the count of takes it holds (``fetch_seq``).

        Raises QueueLocked if a queue is open elsewhere, DiskQueueError if a file cannot
        be opened (the caller closes what was opened with :meth:`close_stores`).
        """
        self._host = host
        self._loop = loop
        cfg = self.config
        await self.data.__aenter__()
        if self.dead_q is not None:
            # The data queue's lock is held: no other opener of this queue races the move.
            try:
                await loop.run_in_executor(None, migrate_dead_letters, cfg.directory, cfg.name,
                                           cfg.file_mode, cfg.dir_mode)
            except QueuePermissionError:
                raise
            except OSError as exc:
                raise DiskQueueError(f"cannot move the dead letters of {cfg.name!r} in "
                                     f"{cfg.directory!r} to their new place: {exc}") from exc
            await self.dead_q.__aenter__()
        self._io = IOThread(f"aiodiskqueue-ack-{cfg.name}")
        self._store = AckLog(cfg.directory, cfg.name, cfg.segment_bytes, cfg.reserve_bytes,
                             cfg.file_mode)
        try:
            rec: Recovered = await self._io.run(self._store.open)
        except QueuePermissionError:
            raise
        except OSError as exc:
            raise DiskQueueError(f"cannot open the ack log of {cfg.name!r} in "
                                 f"{cfg.directory!r}: {exc}") from exc
        await self.data.sync()  # the data queue's first meta, before any take
        await self._skip_logged(rec)
        self._journal = Journal(rec, cfg.segment_bytes)
        return self._journal, rec.fetch_seq

    async def _skip_logged(self, rec: Recovered) -> None:
        """Drop the data queue's messages that the log already accounts for."""
        d = self.data
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
                            self.name, skip)
                break
            await d.get()

    def start(self) -> None:
        """Start the background task (the queue is open)."""
        self._commit_at = self._loop.time() + self._sync_interval
        self.task = self._loop.create_task(self._run(), name=f"aiodiskqueue-ack-{self.name}")

    async def close_stores(self) -> None:
        """Close the data queue, the dead-letter queue and the log."""
        await self.data.aclose()
        if self.dead_q is not None:
            await self.dead_q.aclose()
        io = self._io
        if io is not None:
            assert self._store is not None
            try:
                await io.run(self._store.close)
            except OSError:
                log.exception("%s: closing the ack log failed", self.name)
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
        if (self._linger_until is None or self._ops >= self._sync_every
                or len(self._journal.pending) >= LINGER_RECORDS):
            self.kick()

    def count_op(self) -> None:
        """Count one put, take, finish or requeue towards ``sync_every``."""
        self._ops += 1
        if self._ops >= self._sync_every:
            self.kick()

    async def wait_commit(self) -> None:
        """Wait for the next commit (raises as the commit does)."""
        self._host.check_open()
        fut = self._loop.create_future()
        self._sync_waiters.append(fut)
        self.kick()
        await fut

    async def wait_log_sync(self) -> None:
        """Wait until the log is fsynced with everything appended so far."""
        self._host.check_open()
        fut = self._loop.create_future()
        self._log_waiters.append(fut)
        self.kick()
        await fut

    async def wait_purge(self) -> None:
        """Wait for a purge of everything ready or deferred."""
        fut = self._loop.create_future()
        self._purge_waiters.append(fut)
        self.kick()
        await fut

    def load(self, e: Entry) -> None:
        """Read ``e``'s body back from the log (it is LOADING); the host's
        :meth:`~PumpHost.make_ready` follows."""
        self._loading.append(e)
        self.kick()

    def n_loading(self) -> int:
        """Entries whose bodies are to be read back."""
        return len(self._loading)

    def dead_letter(self, e: Entry) -> None:
        """Put ``e`` (out of attempts) into the dead-letter queue, then log it as done."""
        self._dead.append(e)
        self.kick()

    async def read_bodies(self, entries: list[Entry]) -> None:
        """Read the bodies of ``entries`` back from the log now (each made ready through
        the host), before the pump runs (right after :meth:`open`)."""
        for e in entries:
            e.state = EntryState.LOADING
        self._loading.extend(entries)
        while self._loading:
            await self.hop(False)

    def drop_loading(self) -> None:
        """Forget the entries waiting for their bodies (their records stay)."""
        self._loading.clear()

    def hold(self, e: Entry) -> None:
        """Keep a requeued entry back until the next log sync or commit."""
        self._held.append((e, e.ver))

    def drop_held(self) -> None:
        """Drop the held requeues (a purge)."""
        for e, ver in self._held:
            if e.ver == ver:
                e.ver += 1
                self._journal.done(e)
        self._held.clear()

    # ------------------------------------------------------------------ the loop

    def _commit_due(self) -> bool:
        # With sync_every=1 durability comes from the waiters: most need only
        # the log fsynced (finish, requeue, deferred put), a cheaper step.
        if self._sync_waiters or (self._sync_every > 1 and self._ops >= self._sync_every):
            return True
        return self._ops > 0 and self._loop.time() >= self._commit_at

    async def _run(self) -> None:
        host = self._host
        try:
            while host.is_open():
                if self._purge_waiters:
                    await self._purge()
                elif self._dead or self._dead_put:
                    await self._dead_letter()
                elif self._commit_due():
                    await self._commit()
                elif self._log_waiters:
                    await self._log_sync()
                elif self._journal.waiters or self._want_load() or self._space_work() \
                        or (self._journal.pending and self._lingered()):
                    await self.hop(False)
                else:
                    await self._idle()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("%s: ack queue pump failed", self.name)
                self.error = exc
        finally:
            await self._finish_close()

    def _lingered(self) -> bool:
        """Have the pending records lingered long enough (or grown many enough) for a
        hop? The first call after a hop starts the clock."""
        if len(self._journal.pending) >= LINGER_RECORDS:
            return True
        now = self._loop.time()
        if self._linger_until is None:
            self._linger_until = now + LINGER
            return False
        # uvloop runs a timer up to a millisecond early (its clock is cached in ms):
        # without the slack the task would wake again and again until the time is up.
        return now >= self._linger_until - _TIMER_SLACK

    def _want_load(self) -> bool:
        host = self._host
        return bool(self._loading) and host.n_ready() < max(LOAD_BATCH, host.n_getters())

    def _space_work(self) -> bool:
        journal = self._journal
        segs = journal.segs
        if len(segs) < 2:
            return False
        oldest = segs[min(segs)]
        if oldest.live == 0:
            return True
        total = sum(s.size for s in segs.values())
        return total > 2 * journal.live_bytes() + self.config.segment_bytes

    async def _idle(self) -> None:
        loop = self._loop
        self._wake = loop.create_future()
        waits: list[asyncio.Future[Any]] = [self._wake]
        if not self.paused and self._host.wants_fetch():
            if self._fetch_task is None or self._fetch_task.done():
                self._fetch_task = loop.create_task(self._fetch())
            waits.append(self._fetch_task)
        timer = None
        due = self._commit_at if self._ops > 0 else None
        linger = self._linger_until if self._journal.pending else None
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
                self._host.wake_all()

    async def _fetch(self) -> None:
        payload = await self.data.get()
        self._host.take_fetched(payload)

    async def _stop_fetch(self) -> None:
        t = self._fetch_task
        if t is not None:
            if not t.done():
                t.cancel()
            await asyncio.wait([t])
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if not isinstance(exc, QueueClosed):
                    log.error("%s: taking from the data queue failed: %r", self.name, exc)
            self._fetch_task = None

    async def hop(self, sync: bool) -> None:
        """Write the journal's pending records (fsync with ``sync``) and read due bodies.

        Raises DiskQueueError if a write fails with ``sync`` (otherwise it is retried).
        """
        host, journal, loading = self._host, self._journal, self._loading
        assert self._io is not None and self._store is not None
        self._linger_until = None  # this hop writes every record pending
        reads: list[Entry] = []
        while loading and len(reads) < LOAD_BATCH:
            e = loading.popleft()
            if e.state is EntryState.LOADING:
                reads.append(e)
        built = journal.build(sync, reads)
        if built is None:
            return
        try:
            res = await self._io.run(self._store.run, built.job)
        except OSError as exc:
            err = DiskQueueError(f"write to the ack log of {self.name!r} failed: {exc}")
            err.__cause__ = exc
            log.error("%s", err)
            journal.fail(built, err)
            loading.extendleft(reversed(reads))
            if sync:
                raise err from exc
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # A commit lets the data queue delete what was consumed, and it may use
                # the part of the log's reserve kept for it (see .log): commit next.
                self._ops = max(self._ops, 1)
                self._commit_at = self._loop.time()
            await asyncio.sleep(min(1.0, self._sync_interval))  # back off before retrying
            return
        written, lost = journal.apply(built, res)
        if built.job.sync:
            self.log_syncs += 1
        for e in lost:
            log.error("%s: message %s lost: its ack log record is damaged", self.name, e.key)
            host.lost(e)
        for e, payload in zip(built.reads, res.read_payloads, strict=True):
            if payload is None:
                if e.state is EntryState.LOADING:
                    log.error("%s: message %s lost: its ack log record is damaged",
                              self.name, e.key)
                    journal.done(e)
                continue
            ts, _, msg_id, body = nsq.decode(payload)
            e.timestamp, e.msg_id, e.body = ts, msg_id, body
            if e.state is EntryState.LOADING:
                host.make_ready(e)
        for e in written:
            if e.state is EntryState.DEFERRED:
                e.body = None
        host.wake_for_ready()

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
                log.error("%s: %s failed: %s", self.name, what, exc)
            self._held[:0] = held
            _complete(waiters, exc)
            return
        for e, ver in held:
            if e.ver == ver:  # not purged or otherwise moved on meanwhile
                self._host.make_due(e, e.after)
        _complete(waiters, None)

    async def commit_now(self, resume: bool = True) -> None:
        """Stop taking, write and fsync the log with a head record, then sync the data queue.

        With ``resume=False`` taking stays stopped (the caller resumes it).

        Raises DiskQueueError if a write or sync fails.
        """
        self._ops = 0
        self._commit_at = self._loop.time() + self._sync_interval
        self.paused = True
        try:
            await self._stop_fetch()
            st = self.data.statistics()
            seq = self._host.fetch_seq
            self._journal.head(head_record(seq, seq, st.read_file_num, st.read_pos,
                                           self._journal.next_key))
            await self.hop(True)
            await self.data.sync()
            self.commits += 1
        finally:
            if resume:
                self.paused = False
                self._host.wake_all()

    async def _purge(self) -> None:
        waiters, self._purge_waiters = self._purge_waiters, []
        try:
            # First a commit with taking stopped: the log then counts no take past
            # its last head, so the data queue's new position after its purge
            # (stored by the purge itself) never makes an open skip later messages.
            await self.commit_now(resume=False)
            await self.data.purge()
            self._host.drop_waiting()
            self._loading.clear()
            self.drop_held()  # requeued before the purge: dropped with the rest
            await self.commit_now()
        except (DiskQueueError, OSError) as exc:
            self.paused = False
            self._host.wake_all()
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
        dead_q = self.dead_q
        assert dead_q is not None
        batch, self._dead = self._dead, []
        if batch:
            payloads = [nsq.encode(e.timestamp, e.attempts, e.msg_id, e.body or b"")
                        if self.config.nsq else (e.body or b"") for e in batch]
            try:
                await dead_q.put_many(payloads)
            except DiskQueueError as exc:
                log.error("%s: dead-lettering %d message(s) failed: %s", self.name,
                          len(batch), exc)
                self._dead[:0] = batch
                await asyncio.sleep(min(1.0, self._sync_interval))
                return
            self._dead_put.extend(batch)
            self.dead_lettered += len(batch)  # in the dead-letter queue, for its consumers
        if self._sync_every != 1:  # with sync_every=1 the put returned once fsynced
            try:
                await dead_q.sync()
            except DiskQueueError as exc:
                # Put but maybe not durable: the next round syncs again, never puts again.
                log.error("%s: syncing %d dead letter(s) failed: %s", self.name,
                          len(self._dead_put), exc)
                await asyncio.sleep(min(1.0, self._sync_interval))
                return
        put, self._dead_put = self._dead_put, []
        for e in put:
            self._journal.done(e)
            self.count_op()

    async def _finish_close(self) -> None:
        host = self._host
        host.closing()
        try:
            if self._dead or self._dead_put:
                await self._dead_letter()
            await self.commit_now()
        except BaseException as exc:
            if isinstance(exc, DiskQueueError):
                log.error("%s: final commit failed: %s", self.name, exc)
            else:
                log.exception("%s: final commit failed", self.name)
            # The data queue may have handed out records the log does not hold yet: a
            # meta stored past them would lose them. Keep the one on disk; the next open
            # recovers every record after it and the log says which were finished.
            self.data._hold_meta()
        else:
            # The final commit fsynced the log and synced the data queue: a finish,
            # requeue or sync() that was waiting for that is done, not failed.
            _complete(self._sync_waiters + self._log_waiters, None)
        host.closed()
        err = host.closed_error()
        for w in self._sync_waiters + self._log_waiters + self._purge_waiters:
            if not w.done():
                w.set_exception(err)
        self._sync_waiters, self._log_waiters, self._purge_waiters = [], [], []
        await self.close_stores()


def _complete(waiters: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    """Complete every waiter that is still waiting: with ``exc``, or with success."""
    for w in waiters:
        if not w.done():
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)
