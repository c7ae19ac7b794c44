"""The blocking producer of a queue group: :class:`SyncQueueGroup`, for WSGI workers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from types import TracebackType
from typing import Any, final

from ..errors import DiskQueueError
from ..group.queue import QueueGroup
from ._base import _LoopThread
from ._queue import SyncDiskQueue

__all__ = ["SyncQueueGroup"]


@final
class SyncQueueGroup:
    """A blocking, thread-safe producer of a :class:`aiodiskqueue.QueueGroup`: each worker
    process of a WSGI server (gunicorn sync or threaded workers, Django, Flask) claims a
    shard of its own and puts into it; an asyncio consumer process reads the group.

    ``SyncQueueGroup(directory, name, uvloop=False, **options)`` opens the group as a
    producer on an event-loop thread this object owns (the options are
    :class:`aiodiskqueue.QueueGroup`'s). Open it in each worker after the fork (a
    server's post-fork hook, or lazily on the first request), not in a parent that forks:
    a call from a forked child raises DiskQueueError. ``put()`` returns once the record
    is written to the OS (fsynced with ``sync_every=1``); puts of many threads are
    written in shared batches, as :class:`aiodiskqueue.sync.DiskQueue` does.

    Raises as :meth:`aiodiskqueue.QueueGroup.open` does.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str, *, uvloop: bool = False,
                 **options: Any) -> None:
        self._pid = os.getpid()
        runner = _LoopThread(name, uvloop)
        try:
            self._group = asyncio.run_coroutine_threadsafe(
                QueueGroup.open(directory, name, "producer", **options), runner.loop).result()
        except BaseException:
            runner.stop()
            raise
        self._runner = runner
        self._q = SyncDiskQueue.attach(self._group.queue, runner.loop)
        self._closed = False

    def _check_process(self) -> SyncDiskQueue:
        if os.getpid() != self._pid:
            raise DiskQueueError(f"queue group {self._group.name!r} was opened in process "
                                 f"{self._pid}, not in this forked process {os.getpid()}: "
                                 "open it in each worker after the fork")
        return self._q

    def put(self, item: bytes | bytearray | memoryview, block: bool = True,
            timeout: float | None = None) -> None:
        """Put ``item`` into this worker's shard, as :meth:`aiodiskqueue.sync.DiskQueue.put`.

        Raises DiskQueueError from a forked process, otherwise as that ``put()``.
        """
        self._check_process().put(item, block, timeout)

    def put_nowait(self, item: bytes | bytearray | memoryview) -> None:
        """Accept ``item`` without waiting, as :meth:`aiodiskqueue.sync.DiskQueue.put_nowait`.

        Raises DiskQueueError from a forked process, otherwise as that ``put_nowait()``.
        """
        self._check_process().put_nowait(item)

    def put_many(self, items: Iterable[bytes | bytearray | memoryview]) -> None:
        """Put every item, in order, as one batch; returns once written.

        Raises DiskQueueError from a forked process, otherwise as
        :meth:`aiodiskqueue.sync.DiskQueue.put_many`.
        """
        self._check_process().put_many(items)

    def sync(self) -> None:
        """fsync this worker's shard and store its meta now.

        Raises DiskQueueError from a forked process or if the sync fails.
        """
        self._check_process().sync()

    def qsize(self) -> int:
        """This worker's shard's depth, as its producer counts it (from the consumer's last
        stored position).

        Raises DiskQueueError from a forked process.
        """
        return self._check_process().qsize()

    def empty(self) -> bool:
        """True if ``qsize() == 0``.

        Raises DiskQueueError from a forked process.
        """
        return self._check_process().empty()

    def full(self) -> bool:
        """True if ``maxsize > 0`` and ``qsize() >= maxsize`` (a ``put()`` would wait).

        Raises DiskQueueError from a forked process.
        """
        return self._check_process().full()

    @property
    def maxsize(self) -> int:
        """The bound on this worker's shard's ``qsize()`` for ``put()``; 0: unbounded."""
        return self._q.maxsize

    @property
    def shard(self) -> str:
        """The shard this worker claimed (its directory name in the group)."""
        shard = self._group.shard
        assert shard is not None  # open
        return shard

    @property
    def name(self) -> str:
        """The group's name."""
        return self._group.name

    @property
    def directory(self) -> str:
        """The directory holding the group's directory ``NAME.group``."""
        return self._group.directory

    @property
    def group(self) -> QueueGroup:
        """The async group behind this facade (use it only on its loop's thread)."""
        return self._group

    def close(self) -> None:
        """Close the shard (pending writes are written and synced) and stop the loop
        thread; idempotent. From a forked process it only forgets the parent's objects."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # the parent's thread and files are not this process's to close
        self._q.close()
        try:
            asyncio.run_coroutine_threadsafe(self._group.aclose(), self._runner.loop).result()
        finally:
            self._runner.stop()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def __enter__(self) -> SyncQueueGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<sync {self._group!r}{' closed' if self._closed else ''}>"
