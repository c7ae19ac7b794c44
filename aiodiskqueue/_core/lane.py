"""The write lane: one native thread per queue that writes, reads and stores the meta
without the GIL.

The native writer (``_writer``, built from ``_writer.c`` where a C compiler is present)
appends batches as records (``pwritev``, then ``fdatasync`` if asked), reads into a
buffer (``pread``) or stores a meta file, in order, polls briefly for its next job
before it sleeps, and reports completions through an eventfd the loop watches.

Why a native thread, and why the loop polls for a small job (:meth:`WriteLane.poll`)
rather than be woken by the eventfd: docs/design.md, "Why wake-ups decide the design".
Which job goes here and what its result means is :mod:`.schedule`'s to decide.

Set ``AIODISKQUEUE_PURE_PYTHON=1`` to write and read through the I/O thread only.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from collections import deque

from . import pure_python
from .flight import LaneResult
from .iothread import Hop

try:
    from . import _writer
    Writer: type[_writer.Writer] | None = _writer.Writer
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    Writer = None

log = logging.getLogger(__name__)

#: A small batch (records, headers included): the loop writes one of at most this many
#: bytes itself or polls for it (see inline), and the writer thread spins for the next
#: job only after one; after a larger one (put_many's) its producer is busy far longer.
SMALL_MAX = 128 * 1024

#: The longest the loop waits for a job of the writer thread (ns, see WriteLane.poll):
#: a batch of 16 KiB takes it 7-20 us on the reference VM, 128 KiB 40-80 us.
POLL_WAIT_NS = 50_000
#: After this many polls in a row that missed, the next POLL_REST jobs are not polled for.
POLL_MISSES = 4
POLL_REST = 256

#: The most a read on the I/O thread takes ahead while this thread will read what follows
#: (a segment's first read, or the meta's read position, checked there): the consumer gets
#: its first messages after parsing this much, not the whole read-ahead (4 MiB by
#: default: 12-16 ms on the reference VM, the GIL held while the records are made).
OPENING_READ_BYTES = 256 * 1024


def available() -> bool:
    """True if the native writer is built and not switched off by the environment."""
    return Writer is not None and not pure_python()


class WriteLane:
    """One native writer thread per queue, its results delivered as futures on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, spin_us: int) -> None:
        assert Writer is not None
        self._loop = loop
        self._w = Writer(spin_us, SMALL_MAX)
        self._futs: deque[Hop[LaneResult]] = deque()
        self._fd = self._w.fileno()
        # write_polled's window (ns): none if the writer never spins (it sleeps at once,
        # and its wake-up alone takes longer than a poll should).
        self._poll_ns = POLL_WAIT_NS if spin_us > 0 else 0
        self._poll_misses = 0
        self._poll_rest = 0
        self._spare: Hop[LaneResult] | None = None  # see write_polled
        loop.add_reader(self._fd, self._on_ready)

    def submit(self, fd: int, payloads: list[bytes], offset: int, sync: bool,
               pub_fd: int = -1, pub: bytes = b"") -> Hop[LaneResult]:
        """Write ``payloads`` as records at ``offset`` of ``fd`` (then fdatasync if
        ``sync``), after the batches submitted before; the future cannot be cancelled.

        The records are framed in C and written with ``pwritev`` straight from the
        payload objects: no copy on the loop. With ``pub_fd``, ``pub`` (a role record)
        is then written at offset 0 of it, if every record was written (and synced); a
        failure of that write is a write errno with every byte written.
        """
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        if pub_fd >= 0:
            self._w.submit_records(fd, payloads, offset, sync, pub_fd, pub)
        else:
            self._w.submit_records(fd, payloads, offset, sync)
        self._futs.append(fut)
        return fut

    def write_polled(self, fd: int, payloads: list[bytes], offset: int,
                     pub_fd: int = -1, pub: bytes = b"") -> LaneResult | Hop[LaneResult]:
        """Write ``payloads`` as records at ``offset`` of ``fd`` on the writer thread and
        wait for it as :meth:`poll` does: its result if the writer finished it meanwhile,
        else the future of the job in flight. ``pub_fd`` and ``pub`` as for
        :meth:`submit`.

        With nothing else queued (a batch written from the loop), the submit, the wait and
        the reap are one C call, and a job done in time needs no future: the one made
        beforehand (so that a job never lacks one) is kept for the next miss.
        """
        fut = self._spare
        if fut is None:
            fut = self._spare = Hop(loop=self._loop)
        if self._futs:  # queued behind other jobs: not polled for
            self._submit_only(fd, payloads, offset, pub_fd, pub)
        else:
            wait = self._poll_ns
            if self._poll_rest:
                self._poll_rest -= 1
                wait = 0
            done = (self._w.write_polled(fd, payloads, offset, wait, pub_fd, pub)
                    if pub_fd >= 0 else self._w.write_polled(fd, payloads, offset, wait))
            if done is not None:
                self._poll_misses = 0
                return done
            if wait:
                self._missed()
        self._spare = None
        self._futs.append(fut)
        return fut

    def _submit_only(self, fd: int, payloads: list[bytes], offset: int,
                            pub_fd: int = -1, pub: bytes = b"") -> None:
        """Queue a record job without its future (the caller appends one)."""
        if pub_fd >= 0:
            self._w.submit_records(fd, payloads, offset, False, pub_fd, pub)
        else:
            self._w.submit_records(fd, payloads, offset, False)

    def poll(self) -> None:
        """Wait briefly on the calling thread (the loop) for the oldest job in flight, and
        resolve its future, and those of the jobs done with it, if it is done.

        A small write takes the writer a few microseconds, less than the wake-up through
        the eventfd it saves (see the module's header). The wait is bounded
        (:data:`POLL_WAIT_NS`, the GIL released): a job that takes longer completes
        through the eventfd.
        After :data:`POLL_MISSES` misses in a row (a slow disk, large batches), the next
        :data:`POLL_REST` jobs are not polled for.
        """
        if not self._poll_ns:
            return
        if self._poll_rest:
            self._poll_rest -= 1
            return
        hit = self._w.poll(self._poll_ns)
        if hit > 0:
            self._poll_misses = 0
            self._on_ready()
        elif hit == 0:
            self._missed()

    def _missed(self) -> None:
        """Count a poll that gave up; see :meth:`poll`."""
        self._poll_misses += 1
        if self._poll_misses >= POLL_MISSES:
            self._poll_misses, self._poll_rest = 0, POLL_REST

    def submit_read(self, fd: int, buf: mmap.mmap, offset: int, nbytes: int
                    ) -> Hop[LaneResult]:
        """Read ``nbytes`` at ``offset`` of ``fd`` into ``buf`` after the jobs submitted
        before; the future gives (bytes read, errno, 0). Do not look at ``buf`` before
        the future is done."""
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        self._w.submit_read(fd, buf, offset, nbytes)
        self._futs.append(fut)
        return fut

    def submit_swap(self, args: tuple[bytes, bytes, bytes, bytes]) -> Hop[LaneResult]:
        """Store a meta file (``swap_file``'s steps, ``args`` as it takes them) after the
        jobs submitted before; the future gives (0, 0, errno or 0)."""
        fut: Hop[LaneResult] = Hop(loop=self._loop)  # first: no job without its future
        self._w.submit_swap(*args)
        self._futs.append(fut)
        return fut

    def write_now(self, fd: int, payloads: list[bytes], offset: int) -> LaneResult:
        """Write ``payloads`` as records at ``offset`` of ``fd`` now, on the calling
        thread (the GIL is released during ``pwritev``); only while no batch is queued.

        For a small batch whose producers wait for it anyway, this costs less than a
        hand-off to the writer thread and back: no thread wake-up, no eventfd.
        """
        return self._w.write_records(fd, payloads, offset)

    def _on_ready(self) -> None:
        futs = self._futs
        for res in self._w.reap():
            fut = futs.popleft()
            if not fut.done():
                fut.set_result(res)

    def close(self) -> None:
        """Stop the thread once the submitted batches are done.

        The engine awaits every submitted batch first, so this does not wait on disk.
        """
        try:
            self._loop.remove_reader(self._fd)
        except (RuntimeError, ValueError):  # loop already closed
            pass
        self._on_ready()
        self._w.close()
