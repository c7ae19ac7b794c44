"""Exclusive ownership of a queue across processes and queue objects.

``flock`` on ``NAME.diskqueue.lock``: the kernel drops it when the process dies,
so a crash never leaves a stale lock. flock locks belong to the open file
description, so a second open of the same queue inside one process conflicts
too. The holder's pid is written into the file for error messages and tools.
"""

from __future__ import annotations

import fcntl
import os

from ..errors import QueueLocked


class QueueLock:
    """An exclusive, non-blocking lock on one queue."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises QueueLocked if another process or queue object holds it.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise QueueLocked(self.path, read_lock_pid(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock; idempotent. The lock file stays (removing it would race)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None


def read_lock_pid(path: str) -> int | None:
    """The pid written by the last holder, or None."""
    try:
        with open(path, "rb") as f:
            text = f.read(32).strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_holder(path: str) -> int | None:
    """Pid of the live process holding the lock at ``path``, or None if it is free.

    Probes with a shared non-blocking flock and creates nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_lock_pid(path) or -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
