"""Whether another open file description holds a file's ``flock`` exclusively: the one
probe behind every "who holds this queue" question (the queue lock, the role files)."""

from __future__ import annotations

import fcntl
import os

from .access import read_fd


def held_exclusively(path: str) -> bool | None:
    """True if some process (or queue object) holds ``path``'s flock exclusively, False if
    not, None if the file does not exist. A shared non-blocking probe: it creates nothing
    and never blocks a holder of a shared lock."""
    try:
        fd = read_fd(path)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
