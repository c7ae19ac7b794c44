"""The meta file: a frozen value and its atomic store.

go-diskqueue's layout, ASCII, exactly
``"%d\\n%d,%d\\n%d,%d\\n" % (depth, read_file_num, read_pos, write_file_num, write_pos)``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .access import open_file, read_fd
from .layout import FILE_MODE, fsync_dir
from .space import exchange_paths

#: A native store of the common case: (directory, spare, name, data) -> 0 or an errno.
Swap = Callable[[bytes, bytes, bytes, bytes], int]

_META_RE = re.compile(rb"\A(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n?\Z")
_INT64_MAX = (1 << 63) - 1  # go-diskqueue's numbers are int64
SPARE_SIZE = 4096  # blocks kept allocated for the next meta store
_LOAD_TRIES = 100  # reads of a meta file that a live queue keeps replacing


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

        Raises ValueError if ``data`` is not in go-diskqueue's meta layout, a
        number does not fit go-diskqueue's int64, or the read position lies
        beyond the write position.
        """
        m = _META_RE.match(data)
        if m is None:
            raise ValueError(f"not a diskqueue meta file: {data[:64]!r}")
        meta = cls(*(int(g) for g in m.groups()))
        if any(abs(v) > _INT64_MAX for v in (meta.depth, *meta.read, *meta.write)):
            raise ValueError(f"a number of {data[:64]!r} does not fit in 64 bits")
        if meta.read > meta.write:
            raise ValueError(f"read position {meta.read} is past write position {meta.write}")
        return meta


def position_problems(meta: Meta, sizes: Mapping[int, int]) -> list[str]:
    """What the segment files (number -> size in bytes) contradict in ``meta``'s positions.

    Empty if the positions can be right: the write position is inside its file
    (or at 0 of the next file, not created yet), the read position inside an
    existing file (or equal to the write position), every file between them
    exists. Records past the write position are not a contradiction (written
    after the last meta sync), nor are files below the read file (consumed
    leftovers), unless the meta claims records where none can be. Costs one
    pass over ``sizes``, whatever the numbers in ``meta``.
    """
    out: list[str] = []
    rf, rp = meta.read
    wf, wp = meta.write
    last = max(sizes, default=None)
    if wf in sizes:
        if sizes[wf] < wp:
            out.append(f"write position {wf},{wp} is past the end of segment {wf} "
                       f"({sizes[wf]} bytes)")
    elif wp != 0:
        out.append(f"write position {wf},{wp} is in a segment that does not exist")
    elif last is not None and wf > last + 1:
        out.append(f"write segment {wf} lies past the last segment {last} and the next one")
    if meta.read != meta.write:
        if rf not in sizes:
            out.append(f"read position {rf},{rp} is in a segment that does not exist")
        elif sizes[rf] < rp:
            out.append(f"read position {rf},{rp} is past the end of segment {rf} "
                       f"({sizes[rf]} bytes)")
        between = sum(1 for n in sizes if rf <= n < wf)
        if rf in sizes and between < wf - rf:
            out.append(f"{wf - rf - between} segment(s) between the read file {rf} and the "
                       f"write file {wf} are missing")
    elif meta.depth != 0 and any(n < rf for n in sizes):
        out.append(f"depth {meta.depth} with equal read and write positions, beside "
                   "segments below the read file")
    return out


def read_is_trusted(meta: Meta, sizes: Mapping[int, int]) -> bool:
    """Can readers start at ``meta``'s read position, given the segment files
    (number -> size)?

    Yes when the positions fit the files. When they do not, only if the read
    position lies inside an existing file and no file below it exists (which
    would otherwise be skipped, or deleted as consumed): else every reader of
    the queue (the queue itself, verify, repair, dump) starts at the first
    segment, and records may be delivered again but none is lost.
    """
    if not position_problems(meta, sizes):
        return True
    rf, rp = meta.read
    return rf in sizes and rp <= sizes[rf] and not any(n < rf for n in sizes)


def load_meta(path: str) -> Meta | None:
    """Read the meta file at ``path``; ``None`` if it does not exist.

    Safe beside a live queue storing its meta: a store writes into the spare
    and swaps it with the meta file, so a file a reader opened as the meta may
    be the spare by the time it reads, half rewritten. A read counts only if
    two reads of the file agree, it is still the file at ``path`` afterwards,
    its size is what was read, and it parses; else it is read again.

    Raises ValueError if it exists but cannot be parsed.
    """
    error = ValueError(f"{path} changed during each of {_LOAD_TRIES} reads")
    for _ in range(_LOAD_TRIES):
        try:
            fd = read_fd(path)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, 4096, 0)
            again = os.pread(fd, 4096, 0)
            try:
                at_path = os.stat(path).st_ino
            except FileNotFoundError:
                at_path = -1
            # After the stat, so no truncate of a half rewritten file is pending. (Over
            # 4 KiB is no meta file: decoding it says so.)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if data == again and at_path == st.st_ino and len(data) in (st.st_size, 4096):
            try:
                return Meta.decode(data)
            except ValueError as exc:  # damaged, or caught half way through a store
                error = exc
    raise error


def spare_path(path: str) -> str:
    """The preallocated file the next meta store of ``path`` writes into.

    Named like a temp file of process 0 (never a real store's pid), so whatever
    lists a queue's temp files (the broker removing a store) finds it too.
    """
    return f"{path}.0.tmp"


def swap_names(path: str) -> tuple[bytes, bytes, bytes]:
    """The names a :data:`Swap` of the meta file at ``path`` takes: its directory, and
    the spare's and the meta file's names in it."""
    return (os.fsencode(os.path.dirname(path) or "."),
            os.fsencode(os.path.basename(spare_path(path))), os.fsencode(os.path.basename(path)))


def store_meta(path: str, meta: Meta, swap: Swap | None = None, *,
               mode: int = FILE_MODE) -> None:
    """Replace the meta file atomically and durably.

    The new content goes into the spare file when there is one (blocks already
    allocated: this works on a full disk), else into a temp file, and is
    fsynced. That file is then swapped with the old meta file in one atomic
    step, and the old one is kept as the next spare: no block is freed, so
    none has to be won back, whoever else writes to the disk meanwhile. Where
    the filesystem cannot swap names (or there is no meta file yet), the file
    is renamed over the meta file and a new spare allocated (best effort: on a
    full disk the next store tries again). Either way the directory is fsynced,
    so the change survives a power cut. A temp file or spare made here gets exactly
    ``mode``, and so does the meta file it becomes.

    ``swap``, when given, is a native version of the common case (the spare exists and
    the names can be swapped) that releases the GIL once for all of its system calls
    (``aiodiskqueue._core._writer.swap_file``). It returns 0 or an errno; on an errno
    the steps below run and redo all of it.

    Raises OSError if neither file can be written.
    """
    data = meta.encode()
    spare = spare_path(path)
    directory = os.path.dirname(path) or "."
    if swap is not None and not swap(*swap_names(path), data):
        return
    try:
        fd = open_file(spare, os.O_WRONLY, mode)
        tmp = spare
    except FileNotFoundError:
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        # Write into allocated blocks, then shrink: neither needs a free block.
        os.write(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    if exchange_paths(tmp, path):
        fsync_dir(directory)  # stored
        if tmp != spare:
            try:
                os.rename(tmp, spare)  # the old meta file, kept as the spare
            except OSError:
                pass  # a leftover temp file, removed by the next open
        return
    os.replace(tmp, path)
    fsync_dir(directory)
    try:
        make_spare(path, mode=mode)
    except OSError:
        pass  # the meta is stored; the next store uses a temp file, or makes the spare


def make_spare(path: str, *, mode: int = FILE_MODE) -> bool:
    """Allocate the spare file for the next meta store of ``path``; False if there is no room.

    Raises OSError on errors other than a full disk or quota.
    """
    spare = spare_path(path)
    fd = open_file(spare, os.O_WRONLY | os.O_CREAT, mode)
    try:
        os.posix_fallocate(fd, 0, SPARE_SIZE)
        return True
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP or exc.errno == errno.EINVAL:
            # No fallocate here: write zeros, which allocates the blocks just the same.
            try:
                os.write(fd, bytes(SPARE_SIZE))
                return True
            except OSError as exc2:
                exc = exc2
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
    finally:
        os.close(fd)
    try:
        os.remove(spare)  # a spare without blocks would fail like a temp file
    except FileNotFoundError:
        pass
    return False
