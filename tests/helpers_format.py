"""An independent reader and writer of go-diskqueue's on-disk format, for tests.

Written from the format rules in the fixtures README only (it imports nothing
from aiodiskqueue), so it can serve as an oracle for what the queue writes and
reads.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path


def fixture_msg(i: int) -> bytes:
    """Message ``i`` of the ``fixture`` and ``partial`` fixtures (10..59 bytes)."""
    return b"msg-%05d-" % i + b"x" * (i % 50)


def multi_msg(i: int) -> bytes:
    """Message ``i`` of the ``multi`` fixture: ``5*(i % 1001)`` bytes, byte j ``(i+j) & 0xff``."""
    return bytes((i + j) & 0xFF for j in range(5 * (i % 1001)))


OVERSIZE_LENGTHS = [10, 200, 10, 82, 96, 0, 0, 300, 1]


def oversize_msg(i: int) -> bytes:
    """Message ``i`` of the ``oversize`` fixture."""
    return bytes((i * 31 + j) & 0xFF for j in range(OVERSIZE_LENGTHS[i]))


@dataclass(frozen=True)
class MetaText:
    """The five numbers of a meta file."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int

    def encode(self) -> bytes:
        """The exact meta file bytes."""
        return f"{self.depth}\n{self.read_file},{self.read_pos}\n" \
               f"{self.write_file},{self.write_pos}\n".encode()


_META = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n")


def parse_meta(data: bytes) -> MetaText:
    """Parse meta file bytes; raises ValueError unless they match the layout exactly."""
    m = _META.fullmatch(data)
    if m is None:
        raise ValueError(f"bad meta {data!r}")
    return MetaText(*(int(g) for g in m.groups()))


def seg_name(name: str, num: int) -> str:
    """``NAME.diskqueue.%06d.dat``."""
    return f"{name}.diskqueue.{num:06d}.dat"


def meta_name(name: str) -> str:
    """``NAME.diskqueue.meta.dat``."""
    return f"{name}.diskqueue.meta.dat"


def read_meta(directory: Path, name: str) -> MetaText:
    """Parse the meta file of queue ``name``."""
    return parse_meta((directory / meta_name(name)).read_bytes())


def segment_numbers(directory: Path, name: str) -> list[int]:
    """Numbers of the existing segment files (not ``.bad``), sorted."""
    pat = re.compile(re.escape(name) + r"\.diskqueue\.(\d+)\.dat")
    return sorted(int(m.group(1)) for e in os.listdir(directory)
                  if (m := pat.fullmatch(e)))


def bad_files(directory: Path) -> list[str]:
    """Names of quarantined files in ``directory``."""
    return sorted(e for e in os.listdir(directory) if ".bad" in e)


def records(data: bytes) -> list[bytes]:
    """Split a buffer of whole records; raises ValueError on a torn or negative record."""
    out = []
    off = 0
    while off < len(data):
        if off + 4 > len(data):
            raise ValueError(f"torn header at {off}")
        (n,) = struct.unpack_from(">i", data, off)
        if n < 0 or off + 4 + n > len(data):
            raise ValueError(f"bad record length {n} at {off}")
        out.append(data[off + 4: off + 4 + n])
        off += 4 + n
    return out


def read_queue(directory: Path, name: str) -> list[bytes]:
    """Every unread message of a queue, by the README's reader rules."""
    meta = read_meta(directory, name)
    out: list[bytes] = []
    for num in range(meta.read_file, meta.write_file + 1):
        path = directory / seg_name(name, num)
        if not path.exists():
            if num == meta.write_file and meta.write_pos == 0:
                continue
            raise ValueError(f"missing segment {path}")
        data = path.read_bytes()
        if num == meta.write_file:
            data = data[: meta.write_pos]
        start = meta.read_pos if num == meta.read_file else 0
        out.extend(records(data[start:]))
    if len(out) != meta.depth:
        raise ValueError(f"meta depth {meta.depth} but {len(out)} messages on disk")
    return out


def layout(messages: list[bytes], max_bytes: int, file_num: int = 0,
           pos: int = 0) -> tuple[dict[int, bytes], tuple[int, int]]:
    """Bytes each file gets when ``messages`` are appended at ``(file_num, pos)``.

    Returns ``({file_num: bytes appended to that file}, (write_file, write_pos))``
    by the roll rule: roll when ``pos > 0 and pos + 4 + n > max_bytes``.
    """
    files: dict[int, bytearray] = {}
    for m in messages:
        if pos > 0 and pos + 4 + len(m) > max_bytes:
            file_num, pos = file_num + 1, 0
        files.setdefault(file_num, bytearray()).extend(struct.pack(">i", len(m)) + m)
        pos += 4 + len(m)
    return {k: bytes(v) for k, v in files.items()}, (file_num, pos)


def write_queue(directory: Path, name: str, messages: list[bytes], max_bytes: int,
                consumed: int = 0, meta: bool = True) -> MetaText:
    """Write a queue as go-diskqueue would, with the first ``consumed`` messages read.

    Files wholly before the read position are left out, as go-diskqueue deletes them.
    """
    directory.mkdir(parents=True, exist_ok=True)
    files, (wf, wp) = layout(messages, max_bytes)
    # Position just past the consumed messages.
    _, (rf, rp) = layout(messages[:consumed], max_bytes)
    if consumed and rf in files and rp == len(files[rf]) and rf < wf:
        rf, rp = rf + 1, 0  # go-diskqueue moves to the next file once one is read through
    if not messages:
        rf = rp = 0
    for num, data in files.items():
        if num >= rf:
            (directory / seg_name(name, num)).write_bytes(data)
    m = MetaText(len(messages) - consumed, rf, rp, wf, wp)
    if meta:
        (directory / meta_name(name)).write_bytes(m.encode())
    return m


def patch_bytes(path: Path, offset: int, data: bytes) -> None:
    """Overwrite ``data`` at ``offset`` of an existing file."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
