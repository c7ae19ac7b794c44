"""The consumer role: the get side of a queue whose put side another process may hold
(see :mod:`.roles` for who writes which file when)."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from .._format.access import open_file, read_fd
from .._format.codec import HEADER_SIZE, parse_payloads
from .._format.layout import Layout, file_size, fsync_dir
from .._format.meta import Meta, load_meta, store_meta
from .._format.roles import (
    REC_SIZE,
    Seqs,
    decode_position,
    encode_seqs,
    live_record,
    meta_lock,
    read_record,
    read_seqs,
    seqs_for,
    store_role_meta,
)
from .._format.scan import Record, read_span, scan_segment
from ..errors import CorruptionError, QueueNotFound, RoleError
from .buffers import QUEUE_OPEN, QUEUE_SHUTDOWN, Lifecycle, succeed
from .lane import available as native_available
from .notify import FileWatch, local_fs
from .options import Options
from .position import Stretch
from .roles import RoleEngine

log = logging.getLogger("aiodiskqueue")

#: The most published bytes the event loop reads itself (see ConsumerEngine._look): a
#: consumer that keeps up with its producer reads what was just written (a batch, or a
#: millisecond of a fast producer's batches, see HOLD_FOR) from the page cache in
#: microseconds, where a hop to the I/O thread and back costs two thread wake-ups. More
#: than this (a backlog, possibly no longer cached) goes to the thread.
INLINE_READ_MAX = 256 * 1024

#: A producer that publishes faster than this a batch (s between the looks that read
#: something, HOLD_AFTER times in a row) gets read every HOLD_FOR instead: the watch holds
#: its calls meanwhile (FileWatch.hold). A wake-up per batch costs the consumer some 20 us
#: of CPU and the producer, whose write of its record wakes a sleeping process, some more;
#: a message waits HOLD_FOR at most for it, and at rates up to 1/HOLD_GAP it never does.
HOLD_GAP = 0.0001
HOLD_AFTER = 4
HOLD_FOR = 0.001

# What _look leaves to do.
_DONE = 0  # nothing: all that was asked for is read
_AGAIN = 1  # more is published than the budget took: look again
_HOP = 2  # the read is not one for the loop: the I/O thread reads it


class ConsumerEngine(RoleEngine):
    """The get side of a queue whose put side another object or process may hold."""

    role = "consumer"
    peer = "producer"

    def __init__(self, layout: Layout, opts: Options) -> None:
        super().__init__(layout, opts)
        # The put side's checks pass (sizes, maxsize), so that what a put raises is the
        # RoleError of accept(); reads check sizes with the options, not these.
        self.min_size, self.max_size, self.maxsize = 0, 2**62, 0
        self.seq_r0 = 0  # number of the record at the open position
        self.seq_w = 0  # number of the producer's next record, as published
        self._view = (0, 0)  # the producer's published write position
        self._stale_session = 0  # a producer record from before this open: not trusted
        self._stored: tuple[int, int] = (0, 0)
        self._stored_seq = 0
        self._oldest = 0
        self._pfd = -1
        # The producer's record as last read: a look decodes it again only when it changed.
        self._rec_raw = b""
        self._fd = -1
        self._fnum = -1
        self._sizes: dict[int, int] = {}
        self._synced_file = -1  # the segment whose directory entry a store made durable
        self._meta_held = False  # hold_meta(): close stores no meta
        # Reads of what the producer published go on the event loop where they are small
        # (see _look); with AIODISKQUEUE_PURE_PYTHON=1 every read goes to the I/O thread.
        self._inline = native_available()  # and, from _open and watch(), local and notified
        self._changed = True  # a change the ioLoop has not looked at yet
        self._look_error: BaseException | None = None  # raised by a look on the watch's call
        # The watch's hold (see HOLD_GAP): when the last look read something, how many in a
        # row came quickly, whether the watch holds its calls.
        self._last_got = 0.0
        self._quick = 0
        self._held = False

    # Putting messages is the producer's.
    def check_put(self, n: int) -> None:
        """Raises RoleError: a consumer has no put side."""
        raise RoleError(self.role, "put()")

    def accept(self, datas: list[bytes], nbytes: int,
               waiter: asyncio.Future[None] | None = None) -> None:
        """Raises RoleError: a consumer has no put side."""
        raise RoleError(self.role, "put()")

    async def wait_not_full(self) -> None:
        """Raises RoleError: a consumer has no put side."""
        raise RoleError(self.role, "put()")

    def _before_lock(self) -> None:
        lay = self.layout
        if not (os.path.exists(lay.meta_path) or lay.segments()
                or os.path.exists(lay.role_path("producer"))):
            raise QueueNotFound(lay.directory, lay.name)

    def _open(self, mfd: int) -> None:
        lay = self.layout
        # A network or FUSE filesystem: a read may wait on a server, not come from this
        # host's page cache (statfs: here, on the I/O thread).
        self._inline = self._inline and local_fs(lay.directory)
        segs = lay.segments()
        on_disk = load_meta(lay.meta_path)
        live = live_record(lay.role_path("producer")) is not None
        if on_disk is None and not segs and not live:
            raise QueueNotFound(lay.directory, lay.name)
        if on_disk is None:
            start = (min(segs, default=0), 0)
            on_disk = Meta(0, *start, *start)
        base = seqs_for(on_disk, read_seqs(mfd))
        self._pfd = open_file(lay.role_path("producer"), os.O_RDWR | os.O_CREAT, lay.file_mode)
        rec = read_record(self._pfd)
        read = on_disk.read
        self.seq_r0 = base.seq_r
        self._view, self.seq_w = on_disk.write, base.seq_w
        if live and rec is not None:
            self._take_view(rec.session, rec.file_num, rec.pos, rec.seq)
        else:
            # No producer: what was written past the meta, whole records only (the next
            # producer's open cuts a torn tail at the same place).
            self._stale_session = rec.session if rec is not None else 0
            self._scan_tail()
        self.runs.reset(read)
        self.read_at = read
        self._stored, self._stored_seq = read, base.seq_r
        self._depth = self.seq_w - self.seq_r0
        self.write_at = self._view
        self._oldest = min(segs, default=read[0])
        self.bytes_on_disk = sum(file_size(p) for p in segs.values())
        self._publish(read, base.seq_r)
        os.pwrite(mfd, encode_seqs(None, base), 0)

    def _scan_tail(self) -> None:
        wf, wp = self._view
        n = 0
        for num in sorted(k for k in self.layout.segments() if k >= wf):
            start = wp if num == wf else 0
            s = scan_segment(self.layout.segment_path(num), num, start, None,
                             self.opts.min_msg_size, self.opts.max_msg_size)
            if s.records or num == wf:
                self._view = (num, s.end)
                n += s.records
            if s.problem is not None:
                break
        self.seq_w += n

    def _take_view(self, session: int, fnum: int, pos: int, seq: int) -> bool:
        if session == self._stale_session or seq < self.seq_w:
            return False
        at = (fnum, pos)
        changed = seq != self.seq_w or at != self._view
        self._view, self.seq_w = at, seq
        return changed

    def _close_files(self) -> None:
        for fd in (self._pfd, self._fd):
            if fd >= 0:
                os.close(fd)
        self._pfd = self._fd = -1
        self._fnum = -1

    # ------------------------------------------------------------------ jobs (I/O thread)

    def _refresh(self) -> bool:
        """Read the producer's record: True if it moved on."""
        data = os.pread(self._pfd, REC_SIZE, 0)
        if data == self._rec_raw:
            return False  # taken before (or empty): nothing new
        found = decode_position(data)
        if found is None:
            rec = read_record(self._pfd)  # empty, or a write half done: read again
            if rec is None:
                return False
            found = (rec.session, rec.file_num, rec.pos, rec.seq)
        else:
            self._rec_raw = data
        return self._take_view(*found)

    def _reader(self, num: int) -> int | None:
        if self._fnum != num:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd, self._fnum = -1, -1
            try:
                self._fd = read_fd(self.layout.segment_path(num))
            except FileNotFoundError:
                return None
            self._fnum = num
        return self._fd

    def _read(self, at: tuple[int, int], budget: int
              ) -> tuple[list[Record], int, tuple[int, int], CorruptionError | None]:
        """Whole records from ``at`` up to the producer's published position."""
        out: list[Record] = []
        nbytes = 0
        fnum, pos = at
        view = self._view
        o = self.opts
        while budget > 0 and (fnum, pos) < view:
            fd = self._reader(fnum)
            if fnum < view[0]:
                if fd is None:
                    log.warning("%s: segment missing; going on with the next one",
                                self.layout.segment_path(fnum))
                    fnum, pos = fnum + 1, 0
                    continue
                stop = self._sizes.get(fnum) or os.fstat(fd).st_size  # finished: final size
                self._sizes[fnum] = stop
                if pos >= stop:
                    fnum, pos = fnum + 1, 0
                    continue
            else:
                if fd is None:
                    break  # not created yet
                stop = view[1]
            span = read_span(fd, fnum, pos, stop, budget, o.min_msg_size, o.max_msg_size)
            out.extend(span.records)
            nbytes += sum(len(r[0]) for r in span.records)
            budget -= span.end - pos
            pos = span.end
            if span.problem is not None:
                # Inside what the producer published every record is whole: this is damage.
                err = CorruptionError(self.layout.segment_path(fnum), pos,
                                      f"{span.problem} record in published data")
                return out, nbytes, (fnum, pos), err
        return out, nbytes, (fnum, pos), None

    def _step(self, budget: int
              ) -> tuple[bool, list[Record], int, tuple[int, int], CorruptionError | None]:
        """See the producer's record, then read what it published."""
        moved = self._refresh()
        if budget <= 0:
            return moved, [], 0, self.read_at, None
        return (moved, *self._read(self.read_at, budget))

    def _look(self, budget: int) -> int:
        """On the event loop: see the producer's record, then read what it published,
        ``budget`` bytes or so, if that is small and in the segment open for reading (one
        pread, parsed in C); apply both. What is left: :data:`_DONE`, :data:`_AGAIN`, or
        :data:`_HOP` (a read for the I/O thread; the record's news are applied already).

        Anything unusual in the small read (a short read, a bad length, a record not
        whole) goes through :meth:`_read`, here, which says what it is.
        """
        seq_w = self.seq_w
        moved = self._refresh()
        fnum, pos = at = self.read_at
        view = self._view
        n = view[1] - pos
        if budget <= 0 or at >= view:
            self._apply(seq_w, None, 0, at, None)
            if moved:
                self._seen()
            return _DONE
        if view[0] != fnum or fnum != self._fnum or n > INLINE_READ_MAX:
            self._apply(seq_w, None, 0, at, None)
            if moved:
                self._seen()
            return _HOP
        if n <= budget:
            o = self.opts
            buf = os.pread(self._fd, n, pos)
            payloads, stop, bad = parse_payloads(buf, pos, o.min_msg_size, o.max_msg_size)
            if bad is None and stop == view[1]:
                # _apply's steps, for the usual case: counted as landed() counts writes
                if self.seq_w != seq_w:
                    self._depth += self.seq_w - seq_w
                self.write_at = self.read_at = view
                self.add_ready(Stretch(payloads, fnum, pos, stop),
                               n - HEADER_SIZE * len(payloads))
                if self.getters:
                    self.wake_waiters()
                self._seen()
                return _DONE
        recs, nbytes, to, err = self._read(at, budget)
        self._apply(seq_w, recs, nbytes, to, err)
        if moved or recs:
            self._seen()
            if to < self._view:
                return _AGAIN
        return _DONE

    def _seen(self) -> None:
        """The producer's record moved on: a polling watch looks again soon."""
        if self._watch is not None:
            self._watch.changed()

    def _store(self, read: tuple[int, int], seq_r: int, view: tuple[int, int],
               seq_w: int) -> tuple[tuple[int, int], int, int]:
        """Store the read position (on the meta thread), then delete the segments it has
        moved past; ``(read, seq_r, bytes freed)``."""
        self._sync_data(view[0])
        with meta_lock(self.layout.roles_path, self.layout.file_mode) as mfd:
            store_role_meta(self.layout.meta_path, mfd, read, seq_r, view, seq_w,
                            mode=self.layout.file_mode)
            self._publish(read, seq_r)
            # The meta past them is durable: the segments before the read file go now
            # (the reader is past them: a file it still has open is only unlinked).
            freed = 0
            for n in range(self._oldest, read[0]):
                path = self.layout.segment_path(n)
                size = self._sizes.pop(n, None)
                try:
                    size = size if size is not None else file_size(path)
                    os.remove(path)
                except FileNotFoundError:
                    continue
                freed += size
            self._oldest = max(self._oldest, read[0])
        return read, seq_r, freed

    def _sync_data(self, fnum: int) -> None:
        """Make the data up to the producer's published position durable before a meta
        names it (the producer fsyncs by its own count): fdatasync the write segment
        (any descriptor of a file flushes it) and, for a new one, the directory. Earlier
        segments were fsynced by the producer when it rolled."""
        try:
            fd = read_fd(self.layout.segment_path(fnum))
        except FileNotFoundError:
            return  # not created yet: the position is its start
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if fnum != self._synced_file:
            fsync_dir(self.layout.directory)
            self._synced_file = fnum

    def stored(self, res: tuple[tuple[int, int], int, int]) -> None:
        read, seq_r, freed = res
        self._stored, self._stored_seq = read, seq_r
        self.bytes_on_disk -= freed

    # ------------------------------------------------------------------ the loop

    def _dirty(self) -> bool:
        return self.stored_at() != self._stored

    def _stored_now(self) -> tuple[tuple[int, int], int]:
        at = self.stored_at()
        return at, self.seq_r0 + self.gets - self.handing

    def watch(self) -> FileWatch:
        """The watch on the producer's record: it calls :meth:`_on_change` (made on first
        use)."""
        if self._watch is None:
            assert self.loop is not None
            self._watch = FileWatch(self.loop, self.layout.role_path("producer"),
                                    on_change=self._on_change)
            if not self._watch.inotify:
                self._inline = False  # changes are polled for: no look on the loop
        return self._watch

    def _on_change(self) -> None:
        """The producer's record changed (or a look or poll is due). While the ioLoop
        sleeps, look here, on the watch's call: a consumer that keeps up is woken once per
        batch it reads, with no task to switch to, no future, no thread. What the look
        leaves (a large read, a segment to open, the read-ahead past its low-water mark,
        the periodic store's timer to arm) and any change that comes while the ioLoop is
        busy are the ioLoop's, in its next round."""
        held, self._held = self._held, False
        if (not self._inline or not self.parked or self.purge_waiters
                or self._look_error is not None
                or (self.state is not QUEUE_OPEN and self.state is not QUEUE_SHUTDOWN)):
            self._quick = 0
            self._changed = True
            self._poke()
            return
        want = self.ready_bytes <= self.low_water and self.corruption is None
        at = self.read_at
        try:
            left = self._look(self.opts.read_buffer_bytes - self.ready_bytes if want else 0)
        except BaseException as exc:  # noqa: BLE001 - the ioLoop raises it (the queue breaks)
            self._look_error = exc
            self._poke()
            return
        if self.read_at != at:
            now = time.monotonic()
            self._quick = self._quick + 1 if held or now - self._last_got < HOLD_GAP else 0
            self._last_got = now
            if self._quick >= HOLD_AFTER:
                assert self._watch is not None
                self._held = self._watch.hold(HOLD_FOR)
        elif held:
            self._quick = 0  # nothing came during the hold: a wake-up per change again
        if left != _DONE or self.ready_bytes > self.low_water:
            self._changed = True
            self._poke()
        elif ((self._timer is None or self._timer_at != self._sync_due_at) and self._dirty()):
            self._poke()  # the ioLoop arms the timer of the periodic store

    async def _loop(self) -> None:
        io = self.io
        assert io is not None and self.loop is not None
        self.watch()
        while True:
            if self._look_error is not None:
                raise self._look_error
            if self.purge_waiters:
                await self._purge()
                self._changed = True
                continue
            if self.state is Lifecycle.CLOSING:
                return
            if self.storing is not None and self.storing.done():
                self.store_done()
            if self._round_due():
                # Between hops the view is the loop's to read: the store gets a copy.
                self.store_beside(self._store, *self._stored_now(), self._view, self.seq_w,
                                  waiters=self._round_started())
            want = self.ready_bytes <= self.low_water and self.corruption is None
            if want or self._changed:
                self._changed = False  # a change from now on is looked at again
                budget = self.opts.read_buffer_bytes - self.ready_bytes if want else 0
                left = self._look(budget) if self._inline else _HOP
                if left == _AGAIN:
                    continue
                if left == _HOP:
                    seq_w = self.seq_w
                    if self._inline:  # the record was read and applied by the look
                        moved = False
                        recs, nbytes, to, err = await io.run(self._read, self.read_at, budget)
                    else:
                        moved, recs, nbytes, to, err = await io.run(self._step, budget)
                    self._apply(seq_w, recs, nbytes, to, err)
                    if moved or recs:
                        self._seen()
                        if to < self._view:
                            continue  # more is published: read on
            if self._changed:
                continue  # a change came during the hop
            if self.ready_bytes > self.low_water:
                self.refill_at = self.low_water
                self.read_slot = self._wake  # refill() wakes the ioLoop
            await self._wait()

    def _apply(self, seq_w: int, recs: list[Record] | None, nbytes: int,
               to: tuple[int, int], err: CorruptionError | None) -> None:
        if self.seq_w != seq_w:
            self.depth = self.depth + (self.seq_w - seq_w)
        self.write_at = self._view
        if recs:
            self.add_ready(recs, nbytes)
        self.read_at = to
        if err is not None:
            log.error("%s", err)
            self.corruption = err
            self.wake_all_getters()
        self.wake_waiters()

    async def _final(self) -> None:
        io = self.io
        assert io is not None and self.meta_io is not None
        await self.store_settled()
        if self._meta_held:
            return  # sync() calls still waiting fail as closed
        waiters = self._round_started()
        await io.run(self._refresh)
        self.stored(await self.meta_io.run(self._store, *self._stored_now(), self._view,
                                           self.seq_w))
        succeed(waiters)

    def hold_meta(self) -> None:
        """Close without storing a meta file: the one on disk stays as it is.

        For an AckQueue's data queue whose commit failed: a read position stored past
        what its ack log holds would lose those messages. The next open reads on from
        the stored position, and the segments it names are kept.
        """
        self._meta_held = True

    # ------------------------------------------------------------------ purge

    def _purge_files(self, mfd: int) -> Meta:
        self._refresh()
        rec = read_record(self._pfd)
        self._stale_session = rec.session if rec is not None else 0  # its position is gone
        on_disk = load_meta(self.layout.meta_path)
        last = seqs_for(on_disk, read_seqs(mfd)) if on_disk is not None else None
        nxt = max(self._view[0], *self.layout.segments()) + 1
        new = Seqs(Meta(0, nxt, 0, nxt, 0), self.seq_w, self.seq_w)
        os.pwrite(mfd, encode_seqs(last, new), 0)  # before the meta: see store_role_meta
        store_meta(self.layout.meta_path, new.meta, mode=self.layout.file_mode)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd, self._fnum = -1, -1
        for num in sorted(self.layout.segments()):
            if num < nxt:
                os.remove(self.layout.segment_path(num))
        self._sizes.clear()
        self._view, self._oldest = (nxt, 0), nxt
        self.bytes_on_disk = 0
        return new.meta

    def purge_done(self) -> None:
        # Every message is taken: the number at the read position is the producer's next.
        self.seq_r0 = self.seq_w - self.gets
        self._stored, self._stored_seq = self.read_at, self.seq_w
        self.write_at = self._view
