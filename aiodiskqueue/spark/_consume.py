"""Consume mode: the queue's lock, and releasing what a committed batch read."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from .._format.layout import Layout, fsync_dir
from .._format.lock import QueueLock, lock_holder
from .._format.meta import Meta, load_meta, store_meta
from ..errors import DiskQueueError, QueueLocked
from ._files import Pos, view_queue
from ._ranges import count_records


class QueueBusy(QueueLocked):
    """The Spark source or sink needs a queue's lock, and a live process holds it."""

    def __init__(self, layout: Layout, pid: int | None, what: str) -> None:
        holder = f"process {pid}" if pid else "another process"
        DiskQueueError.__init__(
            self,
            f"cannot {what} queue {layout.name!r} in {layout.directory}: it is open in {holder} "
            f"(which holds {layout.lock_path}: a live DiskQueue, or a Spark commit that did "
            "not finish in time); close the queue there, or let producers write to new "
            "queue names and read them with a glob",
        )
        self.path = layout.lock_path
        self.pid = pid


LOCK_WAIT = 10.0  # seconds to wait for a queue's lock held by someone else


def lock_queue(layout: Layout, what: str, wait: float) -> QueueLock:
    """Take the queue's lock, retrying for ``wait`` seconds: another Spark commit holds
    it only for a moment, while a DiskQueue holds it as long as it is open."""
    deadline = time.monotonic() + wait
    while True:
        lock = QueueLock(layout.lock_path)
        try:
            lock.acquire()
            return lock
        except QueueLocked as exc:
            if time.monotonic() >= deadline:
                raise QueueBusy(layout, exc.pid, what) from None
        time.sleep(0.05)


def release(layout: Layout, end: Pos, min_size: int, max_size: int, *,
            lock_wait: float = LOCK_WAIT, known: Iterable[int] = ()) -> bool:
    """Consume queue ``layout`` up to ``end``: store the new read position, then
    delete the segments wholly before it.

    Idempotent: a position at or before the stored read position changes
    nothing. ``known``: segment numbers a directory listing saw (segments
    before the meta's read file are deleted only if listed there). Returns
    whether the meta file was changed. Raises QueueBusy if
    another process holds the queue's lock for more than ``lock_wait`` seconds.
    """
    try:
        current = load_meta(layout.meta_path)
    except ValueError:
        current = None
    if current is not None and end <= current.read:
        return False  # already released: no lock needed, so an open DiskQueue is no obstacle
    if current is None and not layout.segments():
        return False  # the queue is gone (removed when drained): nothing to release
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
        store_meta(layout.meta_path, meta)
        # Deleting only after the meta that moved past a file is durable: a crash in
        # between leaves consumed files, which the next open removes.
        for num in sorted(segs):
            if num < end[0]:
                os.remove(segs[num])
        return True
    finally:
        lock.release()


def wait_unheld(layout: Layout, wait: float) -> int | None:
    """Wait up to ``wait`` seconds for nobody to hold the queue's lock.

    Returns None once it is free, else the pid of the holder still holding it.
    """
    deadline = time.monotonic() + wait
    while True:
        pid = lock_holder(layout.lock_path)
        if pid is None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.05)


def remove_drained(layout: Layout, min_size: int, max_size: int) -> bool:
    """Remove a queue that holds no unread record: its segments, meta and lock file.

    Takes the queue's lock without waiting, and looks again under it: a queue
    some process holds, or with records past its read position, is left alone.
    Returns whether the queue was removed.
    """
    lock = QueueLock(layout.lock_path)
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
