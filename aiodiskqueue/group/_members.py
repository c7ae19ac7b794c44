"""Who consumes a group: one member lock file per live consumer object.

A consumer holds ``flock(LOCK_EX)`` on ``member-<id>.lock`` in the group directory while
it runs; the kernel drops it when the process dies, and closing the descriptor (or the
process ending) is an inotify event in the group directory that wakes the other
consumers. The file is locked before it gets its name (made under a dot name, locked,
renamed), so a member file without a lock is one whose consumer is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets

from .._format.probe import held_exclusively
from .layout import GroupLayout


class Membership:
    """This consumer's member file, and the count of live members."""

    __slots__ = ("_fd", "id", "lay")

    def __init__(self, lay: GroupLayout) -> None:
        self.lay = lay
        self.id = secrets.token_hex(8)
        self._fd = -1

    def join(self) -> None:
        """Create and lock this consumer's member file (blocking)."""
        tmp = os.path.join(self.lay.path, f".member-{self.id}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.pwrite(fd, b"%d\n" % os.getpid(), 0)
            os.rename(tmp, self.lay.member_path(self.id))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fd = fd

    def live(self) -> int:
        """How many consumers of the group run now (this one included); removes the
        member files of those that are gone (blocking)."""
        n = 0
        for member, path in self.lay.members().items():
            if member == self.id:
                n += 1
                continue
            held = held_exclusively(path)
            if held:
                n += 1
            elif held is False:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return n

    def poke(self) -> None:
        """Rewrite the member file: an inotify event that makes the other consumers look
        at the group again (after this one released shards)."""
        if self._fd >= 0:
            os.pwrite(self._fd, b"%d\n" % os.getpid(), 0)

    def leave(self) -> None:
        """Remove the member file and drop its lock; idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.lay.member_path(self.id))
            os.close(fd)
