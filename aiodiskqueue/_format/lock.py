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
from .access import open_file
from .layout import FILE_MODE
from .probe import held_exclusively
from .roles import holder_pid


class QueueLock:
    """An exclusive, non-blocking lock on one queue; its file is created with ``mode``."""

    __slots__ = ("_fd", "mode", "path")

    def __init__(self, path: str, mode: int = FILE_MODE) -> None:
        self.path = path
        self.mode = mode
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises QueueLocked if another process or queue object holds it,
        QueuePermissionError if this process may not open its file.
        """
        fd = open_file(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = _role_holder(self.path)
            raise QueueLocked(self.path, pid if pid is not None and pid > 0
                              else read_lock_pid(self.path)) from None
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


class RoleLock:
    """One role of a queue: ``flock(LOCK_SH)`` on ``NAME.diskqueue.lock`` (so that a
    queue opened whole, by this or an older version, conflicts with every role) and
    ``flock(LOCK_EX)`` on the role's own file (one holder per role). Files it creates
    get ``mode``."""

    __slots__ = ("_fds", "lock_path", "mode", "role_path")

    def __init__(self, lock_path: str, role_path: str, mode: int = FILE_MODE) -> None:
        self.lock_path = lock_path
        self.role_path = role_path
        self.mode = mode
        self._fds: list[int] = []

    def acquire(self) -> int:
        """Take the role; return the role file's descriptor (open read-write).

        Raises QueueLocked naming the holder if the queue is open whole, or the role is
        held by another process or queue object, QueuePermissionError if this process
        may not open a file of it.
        """
        fd = open_file(self.lock_path, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise QueueLocked(self.lock_path, read_lock_pid(self.lock_path)) from None
        self._fds.append(fd)
        try:
            rfd = open_file(self.role_path, os.O_RDWR | os.O_CREAT, self.mode)
        except BaseException:
            self.release()
            raise
        try:
            fcntl.flock(rfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(rfd)
            self.release()
            raise QueueLocked(self.role_path, holder_pid(self.role_path)) from None
        self._fds.append(rfd)
        return rfd

    def release(self) -> None:
        """Drop the role; idempotent. The files stay (removing them would race)."""
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            os.close(fd)


def _role_holder(lock_path: str) -> int | None:
    """The pid of a role holder of the queue whose lock file is ``lock_path`` (-1 if held
    by a holder that has not written its pid yet), None if no role is held."""
    stem = lock_path[:-len(".lock")] if lock_path.endswith(".lock") else lock_path
    for role in ("producer", "consumer"):
        pid = holder_pid(f"{stem}.{role}")
        if pid is not None:
            return pid
    return None


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

    A producer or consumer role counts: its holder's pid (the producer's first).
    Probes with a shared non-blocking flock and creates nothing.
    """
    held = held_exclusively(path)
    if held is None:
        return None
    if held:
        return read_lock_pid(path) or -1
    return _role_holder(path)
