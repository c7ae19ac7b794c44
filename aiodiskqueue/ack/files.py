"""The files of an AckQueue in its directory: listing, deletion, and the earlier layout.

An AckQueue ``NAME`` owns the data queue ``NAME.diskqueue.*``, the ack log
``NAME.ack.%06d.log`` and, with ``max_attempts``, the dead-letter queue in the
subdirectory ``NAME.dead-letters/`` (see :mod:`aiodiskqueue._format.layout`).
Earlier versions kept the dead letters in the sibling queue ``NAME.dead``;
:func:`migrate_dead_letters` moves them on open.
"""

from __future__ import annotations

import contextlib
import logging
import os

from .._format.access import make_dirs
from .._format.layout import (
    DIR_MODE,
    FILE_MODE,
    Layout,
    ack_log_files,
    dead_letter_layout,
    fsync_dir,
    legacy_dead_letter_layout,
    queue_files,
)
from .._format.lock import QueueLock

log = logging.getLogger(__name__)


def ack_queue_files(directory: str, name: str) -> list[str]:
    """Every existing file of AckQueue ``name`` in ``directory``, sorted (exact names only).

    The data queue, the ack log and the dead-letter queue; not the
    dead-letter directory itself, nor the earlier layout's ``NAME.dead``
    (after :func:`migrate_dead_letters` that is another queue's name).
    """
    out = queue_files(Layout(directory, name))
    out += ack_log_files(directory, name).values()
    out += queue_files(dead_letter_layout(directory, name))
    return sorted(out)


def remove_ack_queue_files(directory: str, name: str) -> None:
    """Delete every file of the closed AckQueue ``name`` and its dead-letter directory.

    Raises OSError if a file cannot be deleted.
    """
    for path in ack_queue_files(directory, name):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    dead_dir = dead_letter_layout(directory, name).directory
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(dead_dir)  # OSError if something else was put there: left alone
    fsync_dir(directory)


def migrate_dead_letters(directory: str, name: str, file_mode: int = FILE_MODE,
                         dir_mode: int = DIR_MODE) -> bool:
    """Move the dead letters of AckQueue ``name`` from ``NAME.dead`` to ``NAME.dead-letters/``.

    Called on open with the data queue locked, before the ack log is
    opened. Nothing is moved if ``NAME`` has no ack log yet (a new queue: a
    ``NAME.dead`` beside it is another queue), if ``NAME.dead`` has no queue
    files or an ack log of its own (it is an AckQueue of its own), or once
    the new place has a meta file (moved already). A lock file or directory made
    here gets ``file_mode`` or ``dir_mode``. The
    segments move first and the meta file last, so a crash in between is
    finished by the next open. Returns whether files were moved.

    Raises QueueLocked if ``NAME.dead`` is open elsewhere, OSError if a rename fails.
    """
    old = legacy_dead_letter_layout(directory, name)
    segments = old.segments()
    bad = old.bad_files()
    has_meta = os.path.exists(old.meta_path)
    if not (segments or bad or has_meta):
        return False
    if not ack_log_files(directory, name) or ack_log_files(directory, old.name):
        return False
    new = dead_letter_layout(directory, name)
    if os.path.exists(new.meta_path):
        log.warning("%s: both %s and %s hold dead letters; keeping the second, leaving the first",
                    name, old.meta_path, new.directory)
        return False
    lock = QueueLock(old.lock_path, file_mode)
    lock.acquire()
    try:
        make_dirs(new.directory, dir_mode)
        fsync_dir(directory)
        for num, path in sorted(segments.items()):
            os.rename(path, new.segment_path(num))
        for path in bad:
            rest = os.path.basename(path)[len(old.name):]  # ".diskqueue.000001.dat.bad"
            os.rename(path, os.path.join(new.directory, name + rest))
        fsync_dir(new.directory)
        if has_meta:
            os.rename(old.meta_path, new.meta_path)
            fsync_dir(new.directory)
        for path in old.meta_temp_files():
            os.unlink(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old.lock_path)
    finally:
        lock.release()
    fsync_dir(directory)
    log.info("%s: dead letters moved from %s to %s", name, old.meta_path, new.directory)
    return True


__all__ = ["ack_queue_files", "migrate_dead_letters", "remove_ack_queue_files"]
