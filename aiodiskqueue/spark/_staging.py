"""Staged writes: tasks write segment files aside, the driver links them into a queue,
and a streaming sink records the batch ids it appended."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

from .._format.access import make_dirs, open_file
from .._format.codec import HEADER
from .._format.layout import DIR_MODE, FILE_MODE, Layout, fsync_dir
from .._format.meta import Meta, store_meta
from ._consume import LOCK_WAIT, lock_queue
from ._files import view_queue

log = logging.getLogger(__name__)

STAGING_PREFIX = ".spark-staging"



@dataclass(frozen=True, slots=True)
class StagedFile:
    """A segment written by one task, waiting to be linked into a queue."""

    path: str
    size: int
    records: int


def staging_dir(layout: Layout, job: str) -> str:
    """Where the tasks of write job ``job`` put their files (inside the queue's directory,
    so linking them is a rename on the same filesystem)."""
    return os.path.join(layout.directory, STAGING_PREFIX, layout.name, job)


class StagedWriter:
    """Write records into staged files by go-diskqueue's roll rule.

    With an ``owner`` line (see :func:`owner_line`) the writer creates its
    directory when missing and names the driver in it; without one the
    directory must exist (its job's driver created it). Its files (the queue's
    segments once linked) get ``file_mode``, a directory it makes ``dir_mode``.
    """

    def __init__(self, directory: str, max_bytes_per_file: int,
                 owner: str | None = None, file_mode: int = FILE_MODE,
                 dir_mode: int = DIR_MODE) -> None:
        self.directory = directory
        self.owner = owner
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self._owned = False
        self.max_bytes = max_bytes_per_file
        self.files: list[StagedFile] = []
        self._prefix = uuid.uuid4().hex
        self._fd: int | None = None
        self._path = ""
        self._pos = 0
        self._records = 0
        self._parts: list[bytes] = []
        self._pending = 0

    def _open(self) -> None:
        if self.owner is not None and not self._owned:
            # A killed driver's stream left this directory with itself as the owner: a
            # sweep would take the files staged here for the restarted one.
            try:
                with open(os.path.join(self.directory, OWNER)) as f:
                    current = f.read()
            except FileNotFoundError:
                current = ""
            if current != self.owner:
                create_job_dir(self.directory, self.owner, self.file_mode, self.dir_mode)
            self._owned = True
        self._path = os.path.join(self.directory, f"{self._prefix}-{len(self.files):06d}.dat")
        self._fd = open_file(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode)
        self._pos = 0
        self._records = 0

    def _flush(self) -> None:
        if self._parts:
            assert self._fd is not None
            data = b"".join(self._parts)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self._parts, self._pending = [], 0

    def _close_file(self) -> None:
        if self._fd is None:
            return
        self._flush()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        self.files.append(StagedFile(self._path, self._pos, self._records))

    def write(self, payloads: list[bytes]) -> None:
        """Append ``payloads`` as records, rolling to a new file as go-diskqueue would."""
        pack = HEADER.pack
        maxb = self.max_bytes
        for p in payloads:
            n = len(p)
            if self._fd is None:
                self._open()
            elif self._pos > 0 and self._pos + 4 + n > maxb:
                self._close_file()
                self._open()
            self._parts.append(pack(n))
            self._parts.append(p)
            self._pos += 4 + n
            self._records += 1
            self._pending += 4 + n
            if self._pending >= 1 << 20:
                self._flush()

    def close(self) -> list[StagedFile]:
        """Flush and fsync the last file; return every file written."""
        self._close_file()
        return self.files

    def discard(self) -> None:
        """Remove every file written so far (the task failed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.files.append(StagedFile(self._path, self._pos, self._records))
        remove_staged(self.files)


def remove_staged(files: list[StagedFile]) -> None:
    """Delete staged files; missing ones are fine."""
    for f in files:
        try:
            os.remove(f.path)
        except FileNotFoundError:
            pass


def remove_staging_dir(path: str) -> None:
    """Delete a job's staging directory and whatever is in it.

    Tasks of the job never create the directory (see :func:`create_job_dir`):
    a task that opens a file here after the removal gets an error and drops its
    rows, and one that slipped a file in while this ran is caught by the retry.
    """
    for _ in range(100):
        try:
            entries = os.listdir(path)
        except FileNotFoundError:
            return
        for e in entries:
            try:
                os.remove(os.path.join(path, e))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue  # a task added a file meanwhile


OWNER = "owner"  # in a job's staging directory: which driver process runs the job


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (tells a live pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def driver_pid() -> int:
    """The Spark driver's JVM: the nearest ancestor named ``java``, else the parent.

    The driver's Python code runs in short-lived worker processes, so the JVM
    is what stays alive as long as the write job can still commit.
    """
    pid = os.getppid()
    probe = pid
    for _ in range(8):
        try:
            with open(f"/proc/{probe}/comm", "rb") as f:
                if f.read().strip() == b"java":
                    return probe
            with open(f"/proc/{probe}/stat", "rb") as f:
                probe = int(f.read().rsplit(b")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if probe <= 1:
            break
    return pid


def owner_line() -> str:
    """What a staging directory's owner file says: the driver's host, pid and start time
    (call it on the driver)."""
    pid = driver_pid()
    return f"{socket.gethostname()} {pid} {process_start_time(pid)}\n"


def create_job_dir(where: str, owner: str, file_mode: int = FILE_MODE,
                   dir_mode: int = DIR_MODE) -> None:
    """Create a write job's staging directory with ``owner`` (:func:`owner_line`) in it;
    the directories it makes get ``dir_mode``, the owner file ``file_mode``.

    The owner file is replaced atomically: tasks that create the directory at
    the same time write the same line, and a sweep never reads half of one.
    """
    make_dirs(where, dir_mode)
    tmp = os.path.join(where, f"{OWNER}.{uuid.uuid4().hex}.tmp")
    with open(open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode), "w") as f:
        f.write(owner)
    os.replace(tmp, os.path.join(where, OWNER))


def owner_alive(where: str) -> bool | None:
    """Whether the driver that created staging directory ``where`` still runs
    (None if unknown: no owner file, or another host)."""
    try:
        with open(os.path.join(where, OWNER)) as f:
            host, pid, start = f.read().split()
    except (OSError, ValueError):
        return None
    if host != socket.gethostname():
        return None
    return process_start_time(int(pid)) == start


STALE_SECONDS = 24 * 3600


def sweep_staging(layout: Layout, keep: str = "", now: float | None = None) -> None:
    """Remove what ended write jobs left: staging directories of drivers that are gone
    (checked on this host), and anything older than a day; ``keep`` is the caller's job."""
    parent = os.path.join(layout.directory, STAGING_PREFIX, layout.name)
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return
    limit = (time.time() if now is None else now) - STALE_SECONDS
    for entry in entries:
        path = os.path.join(parent, entry)
        if entry == keep:
            continue
        try:
            if not os.path.isdir(path):
                os.remove(path)  # end marks of earlier versions
                continue
            alive = owner_alive(path)
            if alive is False or (alive is None and os.stat(path).st_mtime < limit):
                log.info("%s: removing the staged files of a write job whose driver is gone",
                         path)
                remove_staging_dir(path)
        except FileNotFoundError:
            pass
    for path in (parent, os.path.dirname(parent)):
        try:
            os.rmdir(path)  # only when empty: another job may be staging beside us
        except OSError:
            break


def link(layout: Layout, files: list[StagedFile], min_size: int, max_size: int,
         batch: tuple[str, int] | None = None, *, lock_wait: float = LOCK_WAIT) -> Meta | None:
    """Append staged files to a queue as its next segments, under the queue's lock.

    The files are renamed to the segment numbers after the queue's last record
    (after the recovered tail, which is kept), then one new meta file adds
    their records to the depth. ``batch`` is ``(writer_id, batch_id)`` for a
    streaming sink: a batch id at or below the last one recorded for that
    writer is not appended again. Returns the new meta, or None if nothing was
    appended. On an error before the meta is stored, the renames are undone.

    Files and directories it creates get ``layout``'s modes.

    Raises QueueBusy if another process holds the queue's lock for more than
    ``lock_wait`` seconds.
    """
    files = [f for f in files if f.records]
    if not files and batch is None:
        return None  # an empty job leaves no trace, not even a lock file
    make_dirs(layout.directory, layout.dir_mode)
    lock = lock_queue(layout, "append to", lock_wait)
    try:
        if batch is not None and batch[1] <= committed_batch(layout, batch[0]):
            log.info("queue %r: batch %d of %r was already appended; skipping the replay",
                     layout.name, batch[1], batch[0])
            return None
        if not files:
            if batch is not None:
                record_batch(layout, *batch)
            return None
        view = view_queue(layout, min_size, max_size, owned=True)
        end_num, end_pos = view.end
        first = end_num if end_pos == 0 else end_num + 1
        if view.torn is not None and view.torn[0] < first:
            num, whole, size = view.torn
            # The same repair the core does on open: drop a torn record at the very end,
            # which no reader could ever deliver, before the file stops being the last one.
            log.warning("%s: truncating %d byte(s) of torn tail at offset %d",
                        layout.segment_path(num), size - whole, whole)
            # Durable before the renames: after a power cut the torn bytes would be back
            # in a segment that is no longer the last, read as damage there.
            fd = os.open(layout.segment_path(num), os.O_WRONLY)
            try:
                os.ftruncate(fd, whole)
                os.fsync(fd)
            finally:
                os.close(fd)
        done: list[tuple[str, str]] = []
        try:
            for i, f in enumerate(files):
                dst = layout.segment_path(first + i)
                os.rename(f.path, dst)
                done.append((dst, f.path))
            fsync_dir(layout.directory)
            if view.meta is not None:
                depth = view.meta.depth + view.tail_records
                read = view.meta.read
            else:
                depth = view.tail_records
                read = view.read if view.spans else (first, 0)
            depth += sum(f.records for f in files)
            meta = Meta(depth, *read, first + len(files) - 1, files[-1].size)
            store_meta(layout.meta_path, meta, mode=layout.file_mode)
        except BaseException:
            for dst, src in reversed(done):
                try:
                    os.rename(dst, src)
                except OSError:
                    log.exception("%s: could not move back to %s", dst, src)
            raise
        if batch is not None:
            record_batch(layout, *batch)
        return meta
    finally:
        lock.release()


# ---------------------------------------------------------------- streaming sink ids


def _sink_path(layout: Layout) -> str:
    # Not matched by the queue file patterns, so the core and queue_names ignore it.
    return os.path.join(layout.directory, f"{layout.name}.diskqueue.spark-sink.json")


def committed_batch(layout: Layout, writer: str) -> int:
    """The last streaming batch id appended by ``writer`` (-1 if none)."""
    try:
        with open(_sink_path(layout), "rb") as f:
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return -1
    value = data.get(writer, -1)
    return int(value) if isinstance(value, int) else -1


def record_batch(layout: Layout, writer: str, batch_id: int) -> None:
    """Durably record that ``writer`` appended batch ``batch_id`` (atomic replace)."""
    path = _sink_path(layout)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        data = {}
    data[writer] = batch_id
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, layout.file_mode)
    try:
        os.write(fd, json.dumps(data, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(layout.directory)
