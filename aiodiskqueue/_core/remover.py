"""Removing consumed segments on a thread of their own, off the sync round's path.

The kernel frees a segment in time that grows with its size and with its pages in the
page cache: removing a 100 MiB segment that was just read took 75-95 ms on the project
machine (ext4). Done inside a sync round, that held the next round, and with it a
consumer that may take no more than ``sync_every`` messages past a stored meta, for as
long.

A removal is queued only once the meta that moved past the segment is durable, as
before, so a crash leaves at most consumed leftovers, which the next open removes.
Purge and close wait for the queued removals, and so does an explicit ``sync()``: when
it returns, the segments it moved past are gone.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os

log = logging.getLogger("aiodiskqueue")


def _remove(path: str) -> int:
    """Remove ``path``; its size if it was removed, else 0."""
    try:
        size = os.stat(path).st_size
        os.remove(path)
        return size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        # Consumed data only: the next open removes the leftover.
        log.warning("%s: could not remove the consumed segment: %s", path, exc)
        return 0


class SegmentRemover:
    """One queue's consumed segments, removed in order on one thread, made on first use.

    Neither the stat nor the removal runs on the caller's thread (the event loop may
    queue one); the bytes freed are collected with :meth:`freed`.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._queued: list[concurrent.futures.Future[int]] = []

    def remove(self, path: str) -> None:
        """Queue the removal of ``path`` (a consumed segment, already closed)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"aiodiskqueue-rm-{self._name}")
        self._queued.append(self._pool.submit(_remove, path))

    def freed(self) -> int:
        """Bytes removed since the last call (removals still queued are not counted)."""
        total = 0
        pending = []
        for f in self._queued:
            if f.done():
                total += f.result()
            else:
                pending.append(f)
        self._queued = pending
        return total

    def settle(self) -> None:
        """Wait until every queued removal is done (:meth:`freed` counts them then)."""
        concurrent.futures.wait(self._queued)

    def close(self) -> None:
        """Wait for the queued removals and end the thread."""
        self.settle()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
