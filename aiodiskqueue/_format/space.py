"""Disk space held in reserve for a file's own future writes.

Two ways, both needing no free block once set up:

- :func:`reserve_past_end` (the ack log, below);
- :func:`exchange_paths`, which swaps two names atomically (the meta file's
  store: the old meta file becomes the spare that the next store writes into,
  so a store frees no block that somebody else could take).

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
from typing import Any

_FALLOC_FL_KEEP_SIZE = 0x01
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _libc_function(names: tuple[str, ...], argtypes: tuple[Any, ...]) -> Any:
    """The first of ``names`` in the C library, typed to return an int; None if missing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    fn = next((f for f in (getattr(libc, n, None) for n in names) if f is not None), None)
    if fn is not None:
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return fn


_fallocate = _libc_function(("fallocate64", "fallocate"),
                            (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64))
_renameat2 = _libc_function(("renameat2",),  # glibc 2.28 and later
                            (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                             ctypes.c_uint))
_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1
# A name missing, or no exchange here (EPERM: a sandbox that filters the call); a plain
# rename by the caller then fails if the error is real.
_NO_EXCHANGE = (errno.ENOENT, errno.EPERM, errno.EXDEV, *_UNSUPPORTED)
#: Errors of a native swap (``_writer.swap_file``) that mean it cannot work on this
#: filesystem or in this sandbox at all: the store stops trying it.
CANNOT_SWAP = frozenset((errno.EPERM, errno.EXDEV, *_UNSUPPORTED))


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


def exchange_paths(a: str, b: str) -> bool:
    """Swap the files at ``a`` and ``b`` in one atomic step (Linux's
    ``renameat2(RENAME_EXCHANGE)``); neither is freed, so this needs no block.

    True if swapped. False if either does not exist, or this platform,
    filesystem or sandbox cannot exchange (the caller then renames instead).
    Raises OSError on any other error.
    """
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), a, None, b)
