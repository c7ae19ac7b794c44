"""Consume mode: the queue's lock, and releasing what a committed batch read."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from .._format.access import queue_modes, read_fd
from .._format.layout import Layout, fsync_dir
from .._format.lock import QueueLock, RoleLock, lock_holder, read_lock_pid
from .._format.meta import Meta, load_meta, store_meta
from .._format.roles import (
    holder_pid,
    meta_lock,
    published_record,
    read_seqs,
    seqs_for,
    store_role_meta,
)
from ..errors import DiskQueueError, QueueLocked
from ._files import Pos, view_queue
from ._ranges import count_records


class QueueBusy(QueueLocked):
    """The Spark source or sink needs a queue's lock, and a live process holds it."""

    def __init__(self, layout: Layout, pid: int | None, what: str,
                 path: str | None = None) -> None:
        holder = f"process {pid}" if pid else "another process"
        path = layout.lock_path if path is None else path
        if path == layout.lock_path:
            why = ("a live DiskQueue, or a Spark commit that did not finish in time); close "
                   "the queue there, or open it there with role='producer': a stream "
                   "consumes beside a live producer")
        else:
            why = ("the consumer role: a live DiskQueue with role='consumer', or another "
                   "consuming stream); a queue has one consumer at a time")
        DiskQueueError.__init__(
            self,
            f"cannot {what} queue {layout.name!r} in {layout.directory}: it is open in {holder} "
            f"(which holds {path}: {why}",
        )
        self.path = path
        self.pid = pid


LOCK_WAIT = 10.0  # seconds to wait for a queue's lock held by someone else


def lock_queue(layout: Layout, what: str, wait: float) -> QueueLock:
    """Take the queue's lock, retrying for ``wait`` seconds: another Spark commit holds
    it only for a moment, while a DiskQueue holds it as long as it is open."""
    deadline = time.monotonic() + wait
    while True:
        lock = QueueLock(layout.lock_path, layout.file_mode)
        try:
            lock.acquire()
            return lock
        except QueueLocked as exc:
            if time.monotonic() >= deadline:
                raise QueueBusy(layout, exc.pid, what) from None
        time.sleep(0.05)


def consume_blocker(layout: Layout) -> tuple[int, str] | None:
    """What keeps a stream from consuming ``layout`` now: ``(pid, path)`` of a holder of
    the whole queue or of its consumer role (pid -1 if unknown), None if nothing does (a
    live producer alone is no obstacle)."""
    pid = lock_holder(layout.lock_path)
    if pid is None:
        return None
    role_path = layout.role_path("consumer")
    cons = holder_pid(role_path)
    if cons is not None:
        return cons, role_path
    if published_record(layout.role_path("producer")) is not None or \
            holder_pid(layout.role_path("producer")) is not None:
        return None  # a producer role holds the lock file shared: no obstacle
    return read_lock_pid(layout.lock_path) or pid, layout.lock_path


def lock_consumer(layout: Layout, what: str, wait: float) -> RoleLock:
    """Take the queue's consumer role, retrying for ``wait`` seconds.

    Raises QueueBusy naming the holder if the queue is open whole or its consumer role is
    held for longer.
    """
    deadline = time.monotonic() + wait
    while True:
        lock = RoleLock(layout.lock_path, layout.role_path("consumer"), layout.file_mode)
        try:
            lock.acquire()
            return lock
        except QueueLocked as exc:
            if time.monotonic() >= deadline:
                raise QueueBusy(layout, exc.pid, what, exc.path) from None
        time.sleep(0.05)


def release(layout: Layout, end: Pos, min_size: int, max_size: int, *,
            lock_wait: float = LOCK_WAIT, known: Iterable[int] = ()) -> bool:
    """Consume queue ``layout`` up to ``end``: store the new read position, then
    delete the segments wholly before it.

    Idempotent: a position at or before the stored read position changes
    nothing. ``known``: segment numbers a directory listing saw (segments
    before the meta's read file are deleted only if listed there). Returns
    whether the meta file was changed. Raises QueueBusy if
    another process holds the queue whole or its consumer role for more than
    ``lock_wait`` seconds.

    With a live producer (which holds the producer role), this takes the consumer role
    and stores only the meta's read half (see
    :func:`~aiodiskqueue._format.roles.store_role_meta`); otherwise the whole queue's
    lock, as before. A file it creates gets the mode of the queue's files
    (:func:`~aiodiskqueue._format.access.queue_modes`).
    """
    layout = queue_modes(layout)
    try:
        current = load_meta(layout.meta_path)
    except ValueError:
        current = None
    if current is not None and end <= current.read:
        return False  # already released: no lock needed, so an open DiskQueue is no obstacle
    if current is None and not layout.segments():
        return False  # the queue is gone (removed when drained): nothing to release
    if published_record(layout.role_path("producer")) is not None:
        return _release_beside_producer(layout, end, min_size, max_size, lock_wait, known)
    lock = lock_queue(layout, "consume", lock_wait)
    try:
        view_meta = load_meta(layout.meta_path)
        if view_meta is None:
            segs = layout.segments()
            first = min(segs) if segs else end[0]
            view_meta = Meta(0, first, 0, first, 0)
            depth_known = False
        else:
            # The segments from the read file to ``end``, and those a listing saw before
            # it: looked up one by one, not by listing a directory of many queues.
            nums = set(range(view_meta.read[0], end[0] + 1))
            nums.update(n for n in known if n <= end[0])
            segs = {n: p for n in sorted(nums) if os.path.exists(p := layout.segment_path(n))}
            depth_known = True
        if end <= view_meta.read:
            return False
        if end >= view_meta.write:
            # Everything the meta counted is consumed; records past ``end`` (a tail
            # written after the last meta sync) are found again by the core's recovery.
            meta = Meta(0, *end, *end)
        else:
            consumed = 0
            rf, rp = view_meta.read
            for num in range(rf, end[0] + 1):
                if num not in segs:
                    continue
                stop = end[1] if num == end[0] else None
                consumed += count_records(segs[num], rp if num == rf else 0, stop,
                                          min_size, max_size)
            depth = view_meta.depth - consumed if depth_known else 0
            meta = Meta(max(depth, 0), *end, *view_meta.write)
        store_meta(layout.meta_path, meta, mode=layout.file_mode)
        # Deleting only after the meta that moved past a file is durable: a crash in
        # between leaves consumed files, which the next open removes.
        for num in sorted(segs):
            if num < end[0]:
                os.remove(segs[num])
        return True
    finally:
        lock.release()


def _release_beside_producer(layout: Layout, end: Pos, min_size: int, max_size: int,
                             lock_wait: float, known: Iterable[int]) -> bool:
    role = lock_consumer(layout, "consume", lock_wait)
    try:
        with meta_lock(layout.roles_path, layout.file_mode) as fd:
            on_disk = load_meta(layout.meta_path)
            if on_disk is None:
                raise DiskQueueError(f"{layout.meta_path}: missing while a producer holds "
                                     f"queue {layout.name!r}")
            if end <= on_disk.read:
                return False
            last = seqs_for(on_disk, read_seqs(fd))
            rf, rp = on_disk.read
            nums = set(range(rf, end[0] + 1))
            nums.update(n for n in known if n <= end[0])
            segs = {n: p for n in sorted(nums) if os.path.exists(p := layout.segment_path(n))}
            consumed = 0
            for num in range(rf, end[0] + 1):
                if num in segs:
                    consumed += count_records(segs[num], rp if num == rf else 0,
                                              end[1] if num == end[0] else None,
                                              min_size, max_size)
            seq_r = last.seq_r + consumed
            write, seq_w = None, 0
            if end > on_disk.write:
                # The meta must not name a read position past its write position: the
                # producer's published one (read again now: it only moves on) goes in,
                # its data made durable first, as the core's consumer does.
                prod = published_record(layout.role_path("producer"))
                if prod is None or prod.at < end:
                    write, seq_w = end, seq_r
                else:
                    write, seq_w = prod.at, prod.seq
                for num in range(on_disk.write[0], write[0] + 1):
                    _fdatasync(layout.segment_path(num))
                fsync_dir(layout.directory)
            store_role_meta(layout.meta_path, fd, end, seq_r, write, seq_w,
                            mode=layout.file_mode)
        # Deleting only after the meta that moved past a file is durable; the producer's
        # write segment is at or after ``end``, never before it.
        for num in sorted(segs):
            if num < end[0]:
                os.remove(segs[num])
        return True
    finally:
        role.release()


def _fdatasync(path: str) -> None:
    try:
        fd = read_fd(path)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def wait_unheld(layout: Layout, wait: float) -> int | None:
    """Wait up to ``wait`` seconds for nothing to keep a stream from consuming the queue
    (see :func:`consume_blocker`: a live producer alone does not).

    Returns None once nothing does, else the pid of the holder still in the way.
    """
    deadline = time.monotonic() + wait
    while True:
        held = consume_blocker(layout)
        if held is None or time.monotonic() >= deadline:
            return None if held is None else held[0]
        time.sleep(0.05)


def remove_drained(layout: Layout, min_size: int, max_size: int) -> bool:
    """Remove a queue that holds no unread record: its segments, meta and lock file.

    Takes the queue's lock without waiting, and looks again under it: a queue
    some process holds, or with records past its read position, is left alone.
    Returns whether the queue was removed.
    """
    lock = QueueLock(layout.lock_path, queue_modes(layout).file_mode)
    try:
        lock.acquire()
    except QueueLocked:
        return False
    try:
        view = view_queue(layout, min_size, max_size, owned=True)
        if not view.drained or view.missing:
            return False
        for path in view.layout.segments().values():
            os.remove(path)
        if view.meta is not None:
            os.remove(layout.meta_path)
        # The lock file goes last, while still held: a process that opens the queue now
        # starts a new one, as on a fresh directory.
        os.remove(layout.lock_path)
        fsync_dir(layout.directory)
        return True
    except FileNotFoundError:
        return False
    finally:
        lock.release()
