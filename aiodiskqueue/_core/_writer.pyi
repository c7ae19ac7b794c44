"""Type stub for the native write lane and record splitter (built from _writer.c)."""

import mmap
from collections.abc import Sequence
from typing import Any

RING: int
#: The native writer thread's name (``/proc/PID/task/TID/comm``, ``top -H``), on Linux.
THREAD_NAME: str

def split_records(buf: bytes | bytearray | memoryview, base: int, file_num: int,
                  min_size: int, max_size: int, max_records: int = -1,
                  positions: bool = True, /) -> tuple[list[Any], int, int | None]:
    """The record codec's ``split_py`` in C: (records, stop, bad_length); the records
    are (payload, file_num, end_offset), or the payloads alone without ``positions``."""

def swap_file(directory: bytes, spare: bytes, name: bytes, data: bytes, /) -> int:
    """Write ``data`` into the existing file ``spare``, fsync it, swap it with ``name``
    (``renameat2(RENAME_EXCHANGE)``) and fsync ``directory``, the GIL released once:
    0, or the errno of the step that failed."""

class Writer:
    """A native thread that appends framed batches to files without taking the GIL."""

    def __init__(self, spin_us: int, small_max: int) -> None:
        """Start the thread; after a write of at most ``small_max`` bytes it spins up to
        ``spin_us`` for the next job, after any other job it sleeps at once."""
    def submit_records(self, fd: int, payloads: Sequence[bytes], offset: int, sync: bool,
                       pub_fd: int = -1, pub: bytes = b"", /) -> int:
        """Queue ``payloads`` as records (pwritev, no copy); returns the bytes to write.
        With ``pub_fd``, then ``pub`` (at most 128 bytes) is written at offset 0 of it if
        every record was written (and fdatasynced, if asked); a failure of that write
        shows as a write errno with every byte written."""
    def submit_read(self, fd: int, buf: bytearray | mmap.mmap, offset: int, nbytes: int, /
                    ) -> None:
        """Queue a pread of ``nbytes`` at ``offset`` into ``buf``, filled once the job is
        reaped (its result's first item is the bytes read)."""
    def submit_swap(self, directory: bytes, spare: bytes, name: bytes, data: bytes, /) -> None:
        """Queue ``swap_file``'s steps (a meta store); the job's result is (0, 0, errno
        or 0)."""
    def write_records(self, fd: int, payloads: Sequence[bytes], offset: int,
                      /) -> tuple[int, int, int]:
        """Write ``payloads`` as records now, on the calling thread (GIL released), while
        no job is queued; returns (written, write errno, 0)."""
    def write_polled(self, fd: int, payloads: Sequence[bytes], offset: int, timeout_ns: int,
                     pub_fd: int = -1, pub: bytes = b"", /) -> tuple[int, int, int] | None:
        """``submit_records`` and ``poll`` in one call, while no job is queued: the job's
        (written, write errno, 0) if done within ``timeout_ns`` (reaped here), else None
        (still in flight; ``reap()`` gives it). A timeout of 0 or less does not wait.
        ``pub_fd`` and ``pub`` as for ``submit_records``."""
    def reap(self) -> list[tuple[int, int, int]]:
        """(written, write errno, fdatasync errno) of every finished job, in order."""
    def poll(self, timeout_ns: int, /) -> int:
        """Wait up to ``timeout_ns`` (GIL released) for the oldest job in flight: 1 if it
        is done, 0 if not, -1 if none is in flight."""
    def fileno(self) -> int:
        """The eventfd that becomes readable when jobs are done."""
    def inflight(self) -> int:
        """Jobs submitted and not yet reaped."""
    def close(self) -> None:
        """Finish the submitted jobs, stop the thread, close the eventfd."""
