"""Disk space held in reserve for a file's own future writes.

An append-only file that must keep working on a full filesystem (the ack log:
draining a full disk has to append its records before any consumed segment
can be deleted) reserves blocks past its end with Linux's
``fallocate(FALLOC_FL_KEEP_SIZE)``. Its size does not change, so readers and
recovery see exactly the bytes written, and writes into the reserved range
need no new block, full disk or not. Nothing else can take those blocks.

Where the call is missing (not Linux) or the filesystem does not support it,
:func:`reserve_past_end` returns None and the file simply has no reserve.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable

_FALLOC_FL_KEEP_SIZE = 0x01
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)

_Fallocate = Callable[[int, int, int, int], int]


def _load() -> _Fallocate | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_fallocate = _load()


def reserve_past_end(fd: int, offset: int, length: int) -> bool | None:
    """Allocate the blocks of ``[offset, offset + length)`` of ``fd`` without changing its
    size.

    True if they are allocated now; False if there is no room (blocks already
    allocated stay); None if this platform or filesystem cannot reserve blocks.
    Raises OSError on any other error.
    """
    if _fallocate is None:
        return None
    if length <= 0:
        return True
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_ROOM:
        return False
    if err in _UNSUPPORTED:
        return None
    raise OSError(err, os.strerror(err))
