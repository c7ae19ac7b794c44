"""The meta file: a frozen value and its atomic store.

go-diskqueue's layout, ASCII, exactly
``"%d\\n%d,%d\\n%d,%d\\n" % (depth, read_file_num, read_pos, write_file_num, write_pos)``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .layout import fsync_dir

_META_RE = re.compile(rb"\A(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n?\Z")


@dataclass(frozen=True, slots=True)
class Meta:
    """Positions and depth of a queue as stored in its meta file."""

    depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int

    @property
    def read(self) -> tuple[int, int]:
        """``(read_file_num, read_pos)``."""
        return (self.read_file_num, self.read_pos)

    @property
    def write(self) -> tuple[int, int]:
        """``(write_file_num, write_pos)``."""
        return (self.write_file_num, self.write_pos)

    def encode(self) -> bytes:
        """Return the exact bytes go-diskqueue writes for this state."""
        return b"%d\n%d,%d\n%d,%d\n" % (
            self.depth,
            self.read_file_num,
            self.read_pos,
            self.write_file_num,
            self.write_pos,
        )

    @classmethod
    def decode(cls, data: bytes) -> Meta:
        """Parse meta file bytes.

        Raises ValueError if ``data`` is not in go-diskqueue's meta layout or the
        read position lies beyond the write position.
        """
        m = _META_RE.match(data)
        if m is None:
            raise ValueError(f"not a diskqueue meta file: {data[:64]!r}")
        meta = cls(*(int(g) for g in m.groups()))
        if meta.read > meta.write:
            raise ValueError(f"read position {meta.read} is past write position {meta.write}")
        return meta


def load_meta(path: str) -> Meta | None:
    """Read the meta file at ``path``; ``None`` if it does not exist.

    Raises ValueError if it exists but cannot be parsed.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    return Meta.decode(data)


def store_meta(path: str, meta: Meta) -> None:
    """Replace the meta file atomically and durably.

    Written to a temp file, fsynced, renamed over the old one, then the
    directory is fsynced so the rename itself survives a power cut.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, meta.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
