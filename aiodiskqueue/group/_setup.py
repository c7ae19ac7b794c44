"""Opening a group: its name checked against the plain queues, its meta stored once and
compared, the group lock that serializes claiming, creating and removing shards."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._core.options import Options
from .._format.access import open_file
from .._format.group import GroupLayout, GroupMeta, create_group_meta
from .._format.layout import Layout, ack_log_files, queue_files
from ..errors import (
    GroupFormatError,
    GroupNameConflict,
    GroupOptionConflict,
    ShardDamaged,
)

_LOCK_POLL_MIN = 0.001
_LOCK_POLL_MAX = 0.05


def prepare_group(lay: GroupLayout, opts: Options) -> GroupMeta:
    """Check that ``lay``'s name is no plain queue's, store the group meta if there is
    none yet (creating the group directory) and check ``opts`` against it. Blocking.

    Raises GroupNameConflict if a plain queue ``NAME`` has files in the directory,
    GroupFormatError if the group meta is damaged or of another version (or the
    group's path is not a directory), GroupOptionConflict naming the first option
    that differs from the stored one, OSError if the files cannot be made.
    """
    plain = Layout(lay.directory, lay.name)
    if queue_files(plain) or ack_log_files(lay.directory, lay.name):
        raise GroupNameConflict(lay.directory, lay.name, "group")
    if os.path.exists(lay.path) and not os.path.isdir(lay.path):
        raise GroupFormatError(lay.path, "not a directory")
    mine = GroupMeta(opts.max_bytes_per_file, opts.min_msg_size, opts.max_msg_size)
    stored = create_group_meta(lay, mine)
    diffs = mine.differences(stored)
    if diffs:
        option, have, want = diffs[0]
        raise GroupOptionConflict(option, have, want, lay.meta_path)
    return stored


def check_shard(path: str) -> bool:
    """Whether the shard at ``path`` is there: False if it is gone (removed by a consumer's
    retention, or by hand, since it was listed).

    Raises ShardDamaged if it is not a directory, or one this process may not read and
    write.
    """
    if not os.path.lexists(path):
        return False
    if not os.path.isdir(path):
        raise ShardDamaged(path, "is not a directory (replaced by hand?)")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise ShardDamaged(path, "is not readable and writable by this process")
    return True


def finish_removals(lay: GroupLayout) -> None:
    """Delete shards whose removal was cut short (renamed, not yet deleted); call with the
    group lock held."""
    for path in lay.removing():
        shutil.rmtree(path, ignore_errors=True)


class GroupLock:
    """``group.lock``: held exclusively, briefly, to claim, create or remove a shard, so
    that a producer never claims a shard a consumer is removing and two producers
    never create the same one."""

    __slots__ = ("mode", "path")

    def __init__(self, path: str, mode: int) -> None:
        self.path = path
        self.mode = mode

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold the lock for the body of an ``async with``, waiting for it on the loop.

        The wait tries ``flock(LOCK_NB)`` with a backoff (1 ms up to 50 ms) rather than
        blocking a thread: the lock is held for a claim's few file operations, and a
        thread of the loop's executor blocked in ``flock`` for each waiter could leave
        none for the holder, which needs one to finish. Cancelled while waiting, it
        holds nothing.
        """
        fd = open_file(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            delay = _LOCK_POLL_MIN
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(delay)
                    delay = min(_LOCK_POLL_MAX, delay * 2)
        except BaseException:
            os.close(fd)
            raise
        try:
            yield
        finally:
            os.close(fd)  # drops the flock
