"""The producer role: the put side of a queue whose get side another process may hold
(see :mod:`.roles` for who writes which file when)."""

from __future__ import annotations

import asyncio
import os

from .._format.access import read_fd
from .._format.layout import Layout
from .._format.meta import Meta, load_meta
from .._format.roles import (
    SEQS_SIZE,
    Seqs,
    decode_seqs,
    encode_seqs,
    meta_lock,
    read_seqs,
    seqs_for,
    store_role_meta,
)
from ..errors import DiskQueueError, RoleError
from . import lane as _lane
from .buffers import Lifecycle, fail, succeed, wake
from .options import Options
from .published import PublishedWrites
from .roles import RoleEngine
from .store import SegmentStore


class ProducerEngine(RoleEngine):
    """The put side of a queue whose get side another object or process may hold."""

    role = "producer"
    peer = "consumer"

    def __init__(self, layout: Layout, opts: Options) -> None:
        super().__init__(layout, opts)
        self.store = SegmentStore(layout, opts.max_bytes_per_file, opts.min_msg_size,
                                  opts.max_msg_size, opts.strict)
        self.seq_w = 0
        self.seq_r = 0  # the consumer's last stored read position's number
        self._meta_seq = -1  # seq_w of the last meta stored
        self._roles_fd = -1
        self._read_seen = (0, 0)  # the consumer's last stored read position
        # The roles file's bytes as last read and their decoded current entry: a batch
        # decodes them again only when they changed.
        self._seqs_raw = b""
        self._seqs_cur: Seqs | None = None
        # Appends inside the write segment that need no fsync, where the native writer
        # is built (see .published); the rest, and everything else, go to the I/O thread.
        self.writes: PublishedWrites | None = None
        # The watch on the roles file of the moment (the consumer's stores change it) and
        # whether it polls (while put() calls wait for room) or only hears inotify.
        self._watched: asyncio.Future[None] | None = None
        self._watched_polls = False

    async def start(self) -> None:
        await super().start()
        if _lane.available():
            assert self.loop is not None
            w = self.writes = PublishedWrites(self, _lane.WriteLane(self.loop,
                                                                    self.opts.spin_us))
            self.native_lane = True
            # Every put calls these: PublishedWrites' own, with no frame of the engine's
            # in between (without the lane, QueueBuffers' answer no).
            self.kick = w.kick  # type: ignore[method-assign]
            self.write_one = w.write_one  # type: ignore[method-assign]

    # Taking messages is the consumer's.
    def take(self) -> bytes:
        """Raises RoleError: a producer has no get side."""
        raise RoleError(self.role, "get()")

    def take_more(self, out: list[bytes], max_items: int) -> None:
        """Raises RoleError: a producer has no get side."""
        raise RoleError(self.role, "get_many()")

    async def wait_ready(self) -> None:
        """Raises RoleError: a producer has no get side."""
        raise RoleError(self.role, "get()")

    def _open(self, mfd: int) -> None:
        st = self.store.open()  # recovery: cuts a torn tail, finds records past the meta
        lay = self.layout
        on_disk = load_meta(lay.meta_path)
        base = (seqs_for(on_disk, read_seqs(mfd)) if on_disk is not None
                else Seqs(Meta(0, *st.meta.read, *st.meta.read), 0, 0))
        self.seq_r = base.seq_r
        self.seq_w = base.seq_r + st.meta.depth
        self.write_at = st.meta.write
        self.bytes_on_disk = st.bytes_on_disk
        self.recovered = st.recovered
        self._depth = st.meta.depth
        os.pwrite(mfd, encode_seqs(None, base), 0)
        self._store_meta_locked(mfd, st.meta.read)
        self.runs.reset(self._read_seen)
        self._publish(self.write_at, self.seq_w)
        self._roles_fd = read_fd(lay.roles_path)

    def _store_meta_locked(self, mfd: int, read: tuple[int, int] | None = None) -> None:
        self.stored(store_role_meta(self.layout.meta_path, mfd, read, self.seq_r, self.write_at,
                                    self.seq_w, mode=self.layout.file_mode))

    def _store_meta(self, at: tuple[int, int], seq_w: int) -> Seqs:
        """Store the meta with write half ``at`` (numbered ``seq_w``): on the meta thread."""
        with meta_lock(self.layout.roles_path, self.layout.file_mode) as mfd:
            return store_role_meta(self.layout.meta_path, mfd, None, 0, at, seq_w,
                                   mode=self.layout.file_mode)

    def stored(self, res: Seqs) -> None:
        if res.seq_r >= self.seq_r:
            self.seq_r, self._read_seen = res.seq_r, res.meta.read
        self._meta_seq = res.seq_w

    def _close_files(self) -> None:
        if self._roles_fd >= 0:
            os.close(self._roles_fd)
            self._roles_fd = -1
        self.store.close()

    # ------------------------------------------------------------------ jobs (I/O thread)

    def _job(self, payloads: list[bytes] | None, fsync: bool,
             live: bool = True) -> tuple[OSError | None, int]:
        """Write ``payloads``, fsync if asked, publish the write position; the consumer's
        last stored read number after it. Runs on the I/O thread."""
        err: OSError | None = None
        if self.writes is not None and self.writes.take_failed():
            try:
                self.store.reopen_writer()
            except OSError as exc:  # the next write opens it again (cutting it back)
                err = exc
        if payloads and err is None:
            try:
                self.store.write(payloads, False)
            except OSError as exc:
                err = exc
            else:
                self.seq_w += len(payloads)
        if fsync:
            self.store.sync(None)  # fdatasync, and the directory for a new segment
        if (payloads and err is None) or not live:
            self._publish((self.store.write_file, self.store.write_pos), self.seq_w, live)
        raw = os.pread(self._roles_fd, SEQS_SIZE, 0)
        if raw != self._seqs_raw:
            self._seqs_raw, self._seqs_cur = raw, decode_seqs(raw)[1]
        cur = self._seqs_cur
        if cur is not None and cur.seq_r >= self.seq_r:
            self.seq_r, self._read_seen = cur.seq_r, cur.meta.read
        return err, self.seq_r

    # ------------------------------------------------------------------ the loop

    def _dirty(self) -> bool:
        return self.since_sync > 0 or self.seq_w != self._meta_seq

    async def _loop(self) -> None:
        io = self.io
        assert io is not None
        while True:
            if self.writes is not None and self.writes.busy:
                await self.writes.settled()
            if self.storing is not None and self.storing.done():
                self.store_done()
            if self.pending:
                await self._write_batch()
                continue
            if self.purge_waiters:
                await self._purge()
                continue
            if self.state is Lifecycle.CLOSING:
                return
            if self._round_due():
                waiters = self._round_started(True)
                _err, seq_r = await io.run(self._job, None, True)
                self.seen_read(seq_r)
                self.store_beside(self._store_meta, self.write_at, self.seq_w, waiters=waiters)
                continue
            # The consumer's next meta store (its read position, so the depth): heard by
            # inotify; while put() calls wait for room, also looked for by polling.
            watched = self._watched
            if watched is None or (self.putters and not self._watched_polls):
                self._watched_polls = bool(self.putters)
                w = self.watch()
                watched = self._watched = w.wait() if self.putters else w.notified()
            await self._wait(watched)
            if self.putters or watched.done():
                self._watched = None
                _err, seq_r = await io.run(self._job, None, False)
                self.seen_read(seq_r)

    async def _write_batch(self, live: bool = True) -> None:
        io = self.io
        assert io is not None and self.loop is not None
        payloads, waiters, total = self.pending, self.put_waiters, self.pending_bytes
        self.pending, self.put_waiters, self.pending_bytes = [], [], 0
        n = len(payloads)
        self.since_sync += n
        # The meta is stored beside the next writes: on sync(), at most every
        # sync_interval, and on close, each time after an fsync of what it points to.
        meta = self.storing is None and (bool(self.sync_waiters)
                                         or self.loop.time() >= self._sync_due_at)
        fsync = meta or self.sync_every == 1 or self.since_sync >= self.sync_every
        w = self.writes
        if not fsync and w is not None and w.fits(total):
            if w.send(payloads, waiters, total):
                await w.settled()
            return
        syncs = self._round_started(meta) if fsync else []
        try:
            err, seq_r = await io.run(self._job, payloads, fsync, live)
        except OSError as exc:
            err, seq_r = exc, self.seq_r
        self.write_at = (self.store.write_file, self.store.write_pos)
        self.bytes_on_disk = self.store.bytes_on_disk
        if err is not None:
            self.unwritten -= n
            e = DiskQueueError(f"write to queue {self.layout.name!r} failed: {err}")
            e.__cause__ = err
            self.write_error = e
            fail(waiters, e)
            fail(syncs, e)
        else:
            self.landed(n, waiters, self.write_at, None, 0, False)
            if meta:
                self.store_beside(self._store_meta, self.write_at, self.seq_w, waiters=syncs)
            else:
                succeed(syncs)
        self.seen_read(seq_r)

    async def _finish(self) -> None:
        self._direct_left = 0
        w = self.writes
        if w is not None:
            await w.settled()  # no I/O-thread job beside a lane write
        try:
            await super()._finish()
        finally:
            if w is not None:
                w.close()

    async def wait_not_full(self) -> None:
        """Wait while the queue is at ``maxsize`` by the consumer's last stored position."""
        if self.depth + self.unwritten >= self.maxsize:
            wake(self.put_req)  # the ioLoop watches for the consumer's next store meanwhile
            await super().wait_not_full()

    def seen_read(self, seq_r: int) -> None:
        """The consumer's last stored read position is numbered ``seq_r``: the depth
        follows, and put() calls waiting for room may go on."""
        self.seq_r = seq_r
        self.depth = max(0, self.seq_w - seq_r)
        self.runs.reset(self._read_seen)  # statistics() shows the consumer's stored position
        self.wake_waiters()

    # ------------------------------------------------------------------ purge

    def _purge_files(self, mfd: int) -> Meta:
        on_disk = load_meta(self.layout.meta_path)
        last = seqs_for(on_disk, read_seqs(mfd)) if on_disk is not None else None
        nxt = self.store.write_file + 1
        new = Seqs(Meta(0, nxt, 0, nxt, 0), self.seq_w, self.seq_w)
        os.pwrite(mfd, encode_seqs(last, new), 0)  # before the meta: see store_role_meta
        meta = self.store.purge()
        self.seq_r, self._read_seen = self.seq_w, meta.read
        self.write_at = meta.write
        self._meta_seq = self.seq_w
        self._publish(meta.write, self.seq_w)
        return meta

    async def _final(self) -> None:
        io = self.io
        assert io is not None and self.meta_io is not None
        await self.store_settled()
        while self.pending:
            await self._write_batch()
            await self.store_settled()
        waiters = self._round_started(True)
        await io.run(self._job, None, True, False)
        self.stored(await self.meta_io.run(self._store_meta, self.write_at, self.seq_w))
        succeed(waiters)
