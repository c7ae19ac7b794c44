"""Type stub for the native write lane (built from _writer.c)."""

from collections.abc import Sequence

RING: int

class Writer:
    """A native thread that appends framed batches to files without taking the GIL."""

    def __init__(self, spin_us: int = 100) -> None: ...
    def submit_records(self, fd: int, payloads: Sequence[bytes], offset: int, sync: bool,
                       /) -> int:
        """Queue ``payloads`` as records (pwritev, no copy); returns the bytes to write."""
    def write_records(self, fd: int, payloads: Sequence[bytes], offset: int,
                      /) -> tuple[int, int, int]:
        """Write ``payloads`` as records now, on the calling thread (GIL released), while
        no job is queued; returns (written, write errno, 0)."""
    def reap(self) -> list[tuple[int, int, int]]:
        """(written, write errno, fdatasync errno) of every finished job, in order."""
    def fileno(self) -> int:
        """The eventfd that becomes readable when jobs are done."""
    def inflight(self) -> int:
        """Jobs submitted and not yet reaped."""
    def close(self) -> None:
        """Finish the submitted jobs, stop the thread, close the eventfd."""
