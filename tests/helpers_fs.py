"""Filling a filesystem, for the full-disk tests."""

from __future__ import annotations

import errno
from pathlib import Path


def take_every_free_byte(path: Path) -> int:
    """Write zeros into a new file at ``path`` until the filesystem refuses even one
    byte (ENOSPC); return how many were taken. Raises any other OSError."""
    taken = 0
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    taken += f.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return taken
