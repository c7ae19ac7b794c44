"""Removing consumed segments on a thread of their own, off the sync round's path.

The kernel frees a segment in time that grows with its size and with its pages in the
page cache: removing a 100 MiB segment that was just read took 65-95 ms on the project
machine (ext4 mounted with ``discard``). Done inside a sync round, that held the next
round, and with it a consumer that may take no more than ``sync_every`` messages past
a stored meta, for as long.

A removal is queued only once the meta that moved past the segment is durable, as
before, so a crash leaves at most consumed leftovers, which the next open removes.
Purge and close wait for the queued removals, and so does an explicit ``sync()``: when
it returns, the segments it moved past are gone.
"""

from __future__ import annotations

import logging
import os
import queue
import threading

log = logging.getLogger("aiodiskqueue")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # Consumed data only: the next open removes the leftover.
        log.warning("%s: could not remove the consumed segment: %s", path, exc)


class SegmentRemover:
    """One queue's consumed segments, removed in order on a daemon thread made on first
    use. :meth:`remove` never raises: where no thread can be started (none left, or the
    interpreter is shutting down), it removes the file itself."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._paths: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._queued = 0  # queued and not yet removed; guarded by _done

    def remove(self, path: str) -> None:
        """Queue the removal of ``path`` (a consumed segment, already closed)."""
        if self._thread is None:
            thread = threading.Thread(target=self._main, daemon=True,
                                      name=f"aiodiskqueue-rm-{self._name}")
            try:
                thread.start()
            except RuntimeError:
                _remove(path)
                return
            self._thread = thread
        with self._done:
            self._queued += 1
        self._paths.put(path)

    def _main(self) -> None:
        paths = self._paths
        while True:
            path = paths.get()
            if path is None:
                return
            _remove(path)
            with self._done:
                self._queued -= 1
                self._done.notify_all()

    def settle(self) -> None:
        """Wait until every queued removal is done."""
        with self._done:
            self._done.wait_for(lambda: not self._queued)

    def close(self) -> None:
        """Wait for the queued removals and end the thread."""
        self.settle()
        if self._thread is not None:
            self._paths.put(None)
            self._thread.join()
            self._thread = None
