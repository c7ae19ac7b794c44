"""Type stub for the native write lane (built from _writer.c)."""

from collections.abc import Sequence

from _typeshed import ReadableBuffer

RING: int

class Writer:
    """A native thread that appends framed batches to files without taking the GIL."""

    def __init__(self, spin_us: int = 100) -> None: ...
    def submit(self, fd: int, data: ReadableBuffer, offset: int, sync: bool, /) -> None:
        """Queue one pwrite of ``data`` at ``offset`` (then fdatasync if ``sync``)."""
    def submit_records(self, fd: int, payloads: Sequence[bytes], offset: int, sync: bool,
                       /) -> int:
        """Queue ``payloads`` as records (pwritev, no copy); returns the bytes to write."""
    def reap(self) -> list[tuple[int, int, int]]:
        """(written, write errno, fdatasync errno) of every finished job, in order."""
    def fileno(self) -> int:
        """The eventfd that becomes readable when jobs are done."""
    def inflight(self) -> int:
        """Jobs submitted and not yet reaped."""
    def close(self) -> None:
        """Finish the submitted jobs, stop the thread, close the eventfd."""
