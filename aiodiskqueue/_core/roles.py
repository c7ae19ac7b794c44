"""A queue held by one role: a producer or a consumer, each perhaps in its own process.

Each engine keeps the in-memory bookkeeping of :class:`~.buffers.QueueBuffers` (so
``DiskQueue`` calls the same methods as for a whole queue) and runs its own small
ioLoop on one I/O thread; meta stores run on a second thread, beside it. Who writes
which file when (see ``_format/roles.py`` for the files):

- the producer appends records (:class:`~.store.SegmentStore`, its open cuts a torn
  tail), then rewrites its record in ``NAME.diskqueue.producer`` (write position and
  sequence number) before the batch's ``put()`` calls return; it fsyncs by
  ``sync_every`` and stores the meta (its write half, the consumer's last stored read
  half) on close, on ``sync()`` and at most every ``sync_interval`` seconds;
- the consumer reads only up to the producer's published position (so a record
  being written is not there yet), waits for that record to change (:mod:`.notify`),
  stores the meta (its read half, the producer's published write half, fdatasynced
  first) by ``sync_every`` takes, ``sync_interval``, ``sync()`` and close, and only
  then deletes the segments it has moved past.

Every meta store holds the meta writers' lock and records the sequence numbers of
the meta's two positions, from which the depth follows; both roles always write a
meta file go-diskqueue reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import Any

from .._format.access import as_queue_error, check_dir, make_dirs
from .._format.layout import Layout
from .._format.lock import RoleLock
from .._format.meta import Meta
from .._format.roles import (
    encode_record,
    holder_pid,
    live_record,
    meta_lock,
)
from ..errors import (
    DiskQueueError,
    OptionConflict,
    QueueLocked,
    QueuePermissionError,
    RoleError,
)
from .buffers import Lifecycle, QueueBuffers, fail, succeed
from .iothread import IOThread
from .notify import FileWatch
from .options import Options

log = logging.getLogger("aiodiskqueue")

_AGREED = ("max_bytes_per_file", "min_msg_size", "max_msg_size")


class RoleEngine(QueueBuffers):
    """What a producer and a consumer engine share: the role lock, the I/O thread, the
    published record, the check of the options the roles must agree on."""

    role = ""
    peer = ""

    def __init__(self, layout: Layout, opts: Options) -> None:
        super().__init__(layout, opts)
        self._direct_left = 0  # DiskQueue.put reads it: never a direct write here
        self.lock = RoleLock(layout.lock_path, layout.role_path(self.role), layout.file_mode)
        self.session = random.getrandbits(62) + 1
        self._pid = os.getpid()  # the holder named in the record: see start()
        self._rfd = -1
        self.io: IOThread | None = None
        # Meta stores run on a thread of their own, beside the reads and writes: their
        # fsyncs would hold up delivery for tens of milliseconds on the I/O thread.
        self.meta_io: IOThread | None = None
        self.storing: asyncio.Future[Any] | None = None
        self._store_waiters: list[asyncio.Future[None]] = []
        self.task: asyncio.Task[None] | None = None
        self._sync_due_at = 0.0
        self._watch: FileWatch | None = None
        # The one future every request resolves: put_req, sync_req, purge_req and
        # exit_req all name it (see _rearm). The periodic sync timer stays armed across
        # rounds while its due time holds (_timer_at).
        self._wake: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.parked = False  # the ioLoop sleeps in _wait: a poke wakes it
        self._poke_cb = self._poke  # one bound method, added and removed as a callback

    # ------------------------------------------------------------------ start / stop

    async def start(self) -> None:
        """Take the role, work out the state and start the ioLoop.

        Raises QueueLocked if the role is held, OptionConflict if an option contradicts
        the live other role's, DiskQueueError on I/O errors.
        """
        self.loop = loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        self.io = IOThread(f"aiodiskqueue-{self.role}-{self.layout.name}")
        try:
            await self.io.run(self._open_locked)
        except BaseException as exc:
            self.io.stop()
            self.io = None
            self.state = Lifecycle.CLOSED
            if isinstance(exc, PermissionError):
                raise as_queue_error(exc, self.layout.directory) from exc
            if isinstance(exc, OSError) and not isinstance(exc, DiskQueueError):
                raise DiskQueueError(f"cannot open queue {self.layout.name!r} in "
                                     f"{self.layout.directory!r} as {self.role}: {exc}") from exc
            raise
        self._rearm()
        self.meta_io = IOThread(f"aiodiskqueue-{self.role}-meta-{self.layout.name}")
        self._sync_due_at = loop.time() + self.opts.sync_interval
        self.state = Lifecycle.OPEN
        self.task = loop.create_task(self._run(), name=f"aiodiskqueue-{self.role}")

    def _open_locked(self) -> None:
        check_dir(self.layout.directory)  # else a queue it may not see looks like none
        self._before_lock()
        make_dirs(self.layout.directory, self.layout.dir_mode)
        self._rfd = self.lock.acquire()
        try:
            with meta_lock(self.layout.roles_path, self.layout.file_mode) as mfd:
                self._check_peer()
                self._open(mfd)
        except BaseException:
            self._close_files()
            self.lock.release()
            raise

    def _check_peer(self) -> None:
        """Raise OptionConflict if the live holder of the other role disagrees."""
        rec = live_record(self.layout.role_path(self.peer))
        if rec is None:
            return
        for name in _AGREED:
            mine, theirs = getattr(self.opts, name), getattr(rec, name)
            if mine != theirs:
                raise OptionConflict(name, mine, theirs, self.peer, rec.pid)

    def role_record(self, at: tuple[int, int], seq: int, live: bool = True) -> bytes:
        """This role's record with position ``at`` numbered ``seq``, as its file holds it."""
        o = self.opts
        return encode_record(self._pid, self.session, at[0], at[1], seq, o.max_bytes_per_file,
                             o.min_msg_size, o.max_msg_size, live)

    @property
    def record_fd(self) -> int:
        """The descriptor of this role's own record file (open while the role is held)."""
        return self._rfd

    @property
    def sync_due_at(self) -> float:
        """When (loop time) the periodic sync round is due."""
        return self._sync_due_at

    @property
    def timer_armed(self) -> bool:
        """The periodic sync timer is armed (the ioLoop arms it when it parks dirty)."""
        return self._timer is not None

    def _publish(self, at: tuple[int, int], seq: int, live: bool = True) -> None:
        os.pwrite(self._rfd, self.role_record(at, seq, live), 0)

    def watch(self) -> FileWatch:
        """The watch on the file the other role changes (made on first use)."""
        if self._watch is None:
            assert self.loop is not None
            self._watch = FileWatch(self.loop, self.layout.roles_path if self.role == "producer"
                                    else self.layout.role_path("producer"))
        return self._watch

    def _before_lock(self) -> None:
        """Checks that must come before any file is created."""

    def _open(self, mfd: int) -> None:
        raise NotImplementedError

    def _close_files(self) -> None:
        """Close what the role opened (on the I/O thread)."""

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            log.exception("%s: %s ioLoop failed", self.layout.meta_path, self.role)
            self.settle()
            self.state = Lifecycle.BROKEN
            self.error = exc
        finally:
            await self._finish()

    async def _loop(self) -> None:
        raise NotImplementedError

    async def _final(self) -> None:
        raise NotImplementedError

    async def _finish(self) -> None:
        io = self.io
        assert io is not None
        if self.state is not Lifecycle.BROKEN:
            try:
                await self._final()
            except BaseException as exc:
                log.exception("%s: final sync of the %s failed", self.layout.meta_path,
                              self.role)
                self.error = exc
        if self._watch is not None:
            self._watch.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.storing is not None:  # broken: the store's waiters fail below
            await asyncio.wait([self.storing])
            self.sync_waiters += self._store_waiters
        try:
            await io.run(self._close_files)
        except BaseException:
            log.exception("%s: error while closing", self.layout.meta_path)
        io.stop()
        self.io = None
        if self.meta_io is not None:
            self.meta_io.stop()
            self.meta_io = None
        self.lock.release()
        if self.state is not Lifecycle.BROKEN:
            self.settle()
            self.state = Lifecycle.CLOSED
        err = self.closed_error()
        for group in (self.put_waiters, self.sync_waiters, self.purge_waiters):
            fail(group, err)
        self.wake_all_getters()
        self.wake_all_putters()

    # ------------------------------------------------------------------ meta stores

    def store_beside(self, fn: Callable[..., Any], *args: Any,
                     waiters: list[asyncio.Future[None]]) -> None:
        """Run the meta store ``fn(*args)`` on the meta thread; :meth:`stored` applies its
        result, then ``waiters`` are resolved. One at a time."""
        assert self.meta_io is not None and self.storing is None
        self.storing = self.meta_io.run(fn, *args)
        self._store_waiters = waiters

    def store_done(self) -> None:
        """Apply the finished meta store (raises what it raised, failing its waiters)."""
        fut, waiters = self.storing, self._store_waiters
        assert fut is not None and fut.done()
        self.storing, self._store_waiters = None, []
        try:
            res = fut.result()
        except QueuePermissionError as exc:
            fail(waiters, exc)  # names the file and its mode as it is
            raise
        except OSError as exc:
            err = DiskQueueError(f"storing the meta of {self.layout.name!r} failed: {exc}")
            err.__cause__ = exc
            fail(waiters, err)
            raise err from exc
        self.stored(res)
        self.syncs += 1
        succeed(waiters)

    async def store_settled(self) -> None:
        """Wait for the meta store in flight, if any, and apply it."""
        if self.storing is not None:
            await asyncio.wait([self.storing])
            self.store_done()

    def stored(self, res: Any) -> None:
        """A meta store finished with ``res``: the role takes in what it stored."""

    def _rearm(self) -> asyncio.Future[None]:
        """A new wake future: every request (put, sync, purge, exit) resolves it."""
        assert self.loop is not None
        w: asyncio.Future[None] = self.loop.create_future()
        self._wake = self.put_req = self.sync_req = self.purge_req = self.exit_req = w
        return w

    def _poke(self, _fut: object = None) -> None:
        """Wake the ioLoop sleeping in _wait (a done callback of what it waits on beside
        the requests). Not sleeping, it looks at their state in its next round anyway."""
        if self.parked:
            w = self._wake
            if w is not None and not w.done():
                w.set_result(None)

    def _on_timer(self) -> None:
        self._timer = None
        if self._dirty():  # a timer left from an earlier round: nothing to store
            self._poke()

    async def _wait(self, *extra: asyncio.Future[Any]) -> None:
        """Sleep until a request, one of ``extra``, the meta store in flight or the
        periodic sync timer (one future: the others wake it by done callbacks)."""
        loop = self.loop
        assert loop is not None
        w = self._wake
        assert w is not None
        if w.done():
            # Woken while the loop was busy (a hop): the request is served by the next
            # round, not lost in a wait on a new future.
            self._rearm()
            return
        if self.state is Lifecycle.CLOSING:
            return
        storing = self.storing
        for f in extra:
            if f.done():
                return
        if storing is not None and storing.done():
            return
        if self._dirty():
            due = self._sync_due_at
            if self._timer is None or self._timer_at != due:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer_at = due
                self._timer = loop.call_at(due, self._on_timer)
        poke = self._poke_cb
        for f in extra:
            f.add_done_callback(poke)
        if storing is not None:
            storing.add_done_callback(poke)
        self.parked = True
        try:
            await w
        finally:
            self.parked = False
            for f in extra:
                f.remove_done_callback(poke)
            if storing is not None:
                storing.remove_done_callback(poke)
            if self._wake is w:
                self._rearm()

    def _dirty(self) -> bool:
        raise NotImplementedError

    def _round_due(self) -> bool:
        """A sync round is due: asked for, counted, or timed (and no store in flight)."""
        loop = self.loop
        assert loop is not None
        if self.storing is not None:
            return False
        return bool(self.sync_waiters) or (self._dirty() and (
            self.since_sync >= self.sync_every or loop.time() >= self._sync_due_at))

    def _round_started(self, timed: bool = True) -> list[asyncio.Future[None]]:
        """A sync round starts: its waiters; ``timed``: the periodic timer starts over."""
        loop = self.loop
        assert loop is not None
        waiters, self.sync_waiters = self.sync_waiters, []
        self.since_sync = 0
        if timed:
            self._sync_due_at = loop.time() + self.opts.sync_interval
        return waiters

    # ------------------------------------------------------------------ the other side

    def request_purge(self) -> asyncio.Future[None]:
        """Drop every message not yet taken, as :meth:`QueueBuffers.request_purge` does,
        if the other role is free: this object then takes it for the purge.

        Raises RoleError naming the holder if the other role is held (nothing is
        changed then: the probe is one non-blocking flock). A holder that takes the
        role between the probe and the purge makes the purge fail with RoleError.
        """
        pid = holder_pid(self.layout.role_path(self.peer))
        if pid is not None:
            raise RoleError(self.role, f"purge() while process {pid} holds the {self.peer} "
                                       "role (it needs both roles)")
        return super().request_purge()

    async def _purge(self) -> None:
        io = self.io
        assert io is not None
        await self.store_settled()
        waiters, self.purge_waiters = self.purge_waiters, []
        try:
            meta = await io.run(self._purge_blocking)
        except OSError as exc:
            err = DiskQueueError(f"purge of {self.layout.meta_path} failed: {exc}")
            err.__cause__ = exc
            fail(waiters, err)
            return
        except DiskQueueError as exc:
            fail(waiters, exc)
            return
        self.purged(meta)
        self.purge_done()
        succeed(waiters)
        self.wake_all_putters()

    def _purge_blocking(self) -> Meta:
        other = RoleLock(self.layout.lock_path, self.layout.role_path(self.peer),
                         self.layout.file_mode)
        try:
            other.acquire()
        except QueueLocked as exc:
            raise RoleError(self.role, f"purge() while process {exc.pid} holds the "
                                       f"{self.peer} role (it needs both roles)") from None
        try:
            with meta_lock(self.layout.roles_path, self.layout.file_mode) as mfd:
                return self._purge_files(mfd)
        finally:
            other.release()

    def _purge_files(self, mfd: int) -> Meta:
        raise NotImplementedError

    def purge_done(self) -> None:
        """After a purge: the role's own numbers follow (on the event loop)."""

    def hold_meta(self) -> None:
        """Not for a producer: it stores no read position (the consumer overrides this).

        Raises RoleError.
        """
        raise RoleError(self.role, "hold_meta() (closing without a read position stored)")
