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

from .._format.access import open_file
from .._format.group import GroupLayout
from .._format.probe import held_exclusively


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
        fd = open_file(tmp, os.O_RDWR | os.O_CREAT, self.lay.file_mode)
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

    def live(self) -> list[str]:
        """The ids of the consumers of the group that run now (this one included),
        sorted; removes the member files of those that are gone (blocking)."""
        ids = []
        for member, path in self.lay.members().items():
            if member == self.id:
                ids.append(member)
                continue
            held = held_exclusively(path)
            if held:
                ids.append(member)
            elif held is False:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if self.id not in ids:
            ids.append(self.id)
        return sorted(ids)

    def share(self, shards: int) -> int:
        """How many of ``shards`` shards this consumer should hold (blocking): the
        shards divided among the live consumers, the remainder going one each to the
        first by id, so that the shares add up to the shards (``ceil`` for all would
        leave a newcomer with none where 3 consumers share 4 shards)."""
        ids = self.live()
        base, extra = divmod(shards, len(ids))
        return base + (1 if ids.index(self.id) < extra else 0)

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
