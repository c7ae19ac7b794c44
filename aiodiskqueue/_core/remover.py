"""Removing consumed segments on a thread of their own, off the sync round's path.

The kernel frees a segment in time that grows with its size and with its pages in the
page cache: removing a 100 MiB segment that was just read took 65-95 ms on the project
machine (ext4 mounted with ``discard``). Done inside a sync round, that held the next
round, and with it a consumer that may take no more than ``sync_every`` messages past
a stored meta, for as long.

A removal is queued only once the meta that moved past the segment is durable, as
before, so a crash leaves at most consumed leftovers, which the next open removes.
Purge and close wait for the queued removals, and so does an explicit ``sync()``: when
it returns, the segments it moved past are gone.

Off the round's path is not the whole cure: a filesystem mounted with ``discard``
trims the freed blocks in the next journal commit, and the next round's ``fsync`` waits
for that commit: 20-80 ms for a 100 MiB segment on the project machine, with the
consumer held behind the round. So there, the segment is unlinked and then freed in
steps of :data:`STEP_BYTES`, each committed here (``ftruncate`` + ``fdatasync``): a
round waits for one step at most. The steps are taken only when nothing else can see
them: no other name (hard link) and no other open file refers to the segment. A write
lease (``F_SETLEASE``), which the kernel grants only to the one open file of an inode,
decides the second, and is held until the steps are done: an open that comes meanwhile
(through a name looked up just before the unlink) breaks it, waits for the step in
progress and stops the rest; it sees the file shorter by the steps taken. Elsewhere
(no ``discard``, no leases, more removals waiting, the segment held open), the segment
is only unlinked, as before.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import signal
import threading

log = logging.getLogger(__name__)

STEP_BYTES = 8 << 20
"""Bytes freed per committed step: a round's fsync meets at most one step's commit."""

STEP_BACKLOG = 2
"""Removals that may wait behind one freed in steps; with more, it is only unlinked."""

_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
_SETSIG = getattr(fcntl, "F_SETSIG", None)


def _alone(fd: int) -> bool:
    """Take a write lease on ``fd``: granted only while no other open file (in any
    process, this one included) holds the inode. False where refused or unsupported.

    An opener that comes while the lease is held breaks it, and the kernel tells the
    holder with a signal: SIGURG, ignored unless handled, instead of SIGIO, whose
    default is to end the process."""
    if _SETLEASE is None or _SETSIG is None:
        return False
    try:
        fcntl.fcntl(fd, _SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, _SETLEASE, fcntl.F_WRLCK)
    except OSError:  # EAGAIN: open elsewhere; EINVAL/EACCES/ENOLCK: no leases here
        return False
    return True


def _unlease(fd: int) -> None:
    assert _SETLEASE is not None
    try:
        fcntl.fcntl(fd, _SETLEASE, fcntl.F_UNLCK)
    except OSError:  # pragma: no cover - the lease was ours
        pass


def _still_alone(fd: int) -> bool:
    """Whether the lease on ``fd`` stands: an open of the inode elsewhere (through a name
    looked up before the unlink, or ``/proc``) starts to break it and waits for it."""
    assert _SETLEASE is not None
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_WRLCK)
    except OSError:  # pragma: no cover
        return False


def _free_in_steps(fd: int, path: str) -> None:
    """Free the blocks of the unlinked, leased file ``fd`` from its end, a committed step
    at a time, until done or until someone else opens it."""
    try:
        size = os.fstat(fd).st_size
        while size > 0 and _still_alone(fd):
            size = max(0, size - STEP_BYTES)
            os.ftruncate(fd, size)
            os.fdatasync(fd)
    except OSError as exc:
        # The file is unlinked: closing it frees whatever is left, in one commit. An
        # error here is reported to this file only, so say it.
        log.warning("%s: freeing the removed segment in steps stopped: %s", path, exc)


def mount_discards(mountinfo: str, dev: int) -> bool:
    """Whether ``/proc/self/mountinfo`` text shows the filesystem of device ``dev``
    mounted with ``discard`` (freed blocks trimmed in the journal commit), and not with
    ``discard=async`` (trimmed later, off the commit)."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 7 or fields[2] != want or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        options = fields[5].split(",")
        if len(fields) > sep + 3:
            options += fields[sep + 3].split(",")
        if "discard" in options:
            return True
    return False


_DISCARDS: dict[int, bool] = {}  # st_dev -> mount_discards, read once per device


def frees_in_steps(path: str) -> bool:
    """Whether consumed segments at ``path``'s filesystem are worth freeing in steps:
    Linux leases exist and the filesystem trims freed blocks in its commit."""
    if _SETLEASE is None or _SETSIG is None:
        return False
    try:
        dev = os.stat(os.path.dirname(path) or ".").st_dev
        known = _DISCARDS.get(dev)
        if known is None:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                known = _DISCARDS[dev] = mount_discards(f.read(), dev)
    except OSError:
        return False
    return known


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # Consumed data only: the next open removes the leftover.
        log.warning("%s: could not remove the consumed segment: %s", path, exc)


def _remove(path: str, steps: bool) -> None:
    """Remove the consumed segment ``path``; with ``steps``, free it in committed steps
    where nothing else can see them (see the module's doc)."""
    if not steps:
        _unlink(path)
        return
    try:
        # O_NONBLOCK: where another holder's lease (a file server's) would make the open
        # wait until it is broken, the open fails at once instead.
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        _unlink(path)
        return
    alone = _alone(fd)
    try:
        _unlink(path)
        # Unlinked (a failed unlink leaves the name), with no other name left (a hard
        # link keeps its bytes), and no other open file held it when the lease was
        # granted; the lease stays until the steps are done, so whoever opens it
        # meanwhile waits for the step in progress and stops the rest.
        if alone and os.fstat(fd).st_nlink == 0:
            _free_in_steps(fd, path)
    finally:
        if alone:
            _unlease(fd)
        os.close(fd)


class SegmentRemover:
    """One queue's consumed segments, removed in order on a daemon thread made on first
    use. :meth:`remove` never raises: where no thread can be started (none left, or the
    interpreter is shutting down), it removes the file itself."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._paths: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._queued = 0  # queued and not yet removed; guarded by _done

    def remove(self, path: str) -> None:
        """Queue the removal of ``path`` (a consumed segment, already closed)."""
        if self._thread is None:
            thread = threading.Thread(target=self._main, daemon=True,
                                      name=f"aiodiskqueue-rm-{self._name}")
            try:
                thread.start()
            except RuntimeError:
                _remove(path, False)  # on the caller's thread: no steps
                return
            self._thread = thread
        with self._done:
            self._queued += 1
        self._paths.put(path)

    def _in_steps(self, path: str) -> bool:
        """Free ``path`` in steps only where that helps and at most
        :data:`STEP_BACKLOG` removals wait behind it: a purge, or a drain that consumes
        segments faster than the steps free them, goes at the unlink's pace."""
        with self._done:
            backlog = self._queued - 1 > STEP_BACKLOG
        return not backlog and frees_in_steps(path)

    def _main(self) -> None:
        paths = self._paths
        while True:
            path = paths.get()
            if path is None:
                return
            try:
                _remove(path, self._in_steps(path))
            except Exception:  # never leave wait_idle() waiting for a dead thread
                log.exception("%s: removing the consumed segment failed", path)
            finally:
                with self._done:
                    self._queued -= 1
                    self._done.notify_all()

    def wait_idle(self) -> None:
        """Wait until every queued removal is done."""
        with self._done:
            self._done.wait_for(lambda: not self._queued)

    def close(self) -> None:
        """Wait for the queued removals and end the thread."""
        self.wait_idle()
        if self._thread is not None:
            self._paths.put(None)
            self._thread.join()
            self._thread = None
