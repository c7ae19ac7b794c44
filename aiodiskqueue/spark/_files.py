"""Queue files as the Spark source and sink see them: pure Python, no Spark.

Positions are ``(file_num, pos)`` pairs, always on record boundaries. They stay
valid while a queue is consumed and appended to, which is what makes them
usable as streaming offsets.

Reading never changes a file. Only :func:`release` (consume mode) and
:func:`link` (the sink's driver-side commit) change a queue, and both do it
under the queue's :class:`~aiodiskqueue._lock.QueueLock`, the same lock a
:class:`~aiodiskqueue.DiskQueue` holds while it is open.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .._format.codec import HEADER
from .._format.layout import Layout, fsync_dir, queue_names
from .._format.lock import QueueLock, lock_holder
from .._format.meta import Meta, load_meta, store_meta
from .._format.scan import BAD_LENGTH, Record, iter_spans, scan_segment
from ..errors import CorruptionError, DiskQueueError, QueueLocked

log = logging.getLogger("aiodiskqueue.spark")

Pos = tuple[int, int]

READ_CHUNK = 4 << 20  # bytes per pread when reading records on an executor
STAGING_PREFIX = ".spark-staging"


@dataclass(frozen=True, slots=True)
class FileSpan:
    """Whole records of segment ``num`` from byte ``start`` to byte ``stop``."""

    num: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Bytes in the span."""
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a reader may read of one queue right now, without changing anything.

    ``spans`` run from the read position to ``end``. When a live process holds
    the queue's lock, ``end`` is the write position of the meta file, which the
    holder stores only after an fsync, so everything below it is whole and
    stable. When nobody holds the lock, ``end`` also covers the tail that the
    core's recovery would find on open: whole records past the meta's write
    position in the write segment and in later segments.
    """

    layout: Layout
    meta: Meta | None
    read: Pos
    end: Pos
    spans: list[FileSpan]
    holder: int | None
    tail_records: int = 0
    torn: tuple[int, int, int] | None = None  # (num, whole-record end, size) of a torn last file
    sizes: dict[int, int] = field(default_factory=dict)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def view_queue(layout: Layout, min_size: int, max_size: int, *, owned: bool = False) -> QueueView:
    """Describe the unread records of one queue.

    ``owned`` says the caller holds the queue's lock itself (so nobody else
    writes). Raises DiskQueueError if the meta file cannot be parsed.
    """
    segs = layout.segments()
    try:
        meta = load_meta(layout.meta_path)
    except ValueError as exc:
        raise DiskQueueError(
            f"{layout.meta_path}: unreadable meta file ({exc}); open the queue once with "
            "DiskQueue to rebuild it"
        ) from None
    holder = None if owned else lock_holder(layout.lock_path)
    if meta is not None:
        read = meta.read
        wf, wp = meta.write
    else:
        read = (min(segs), 0) if segs else (0, 0)
        wf, wp = read
    sizes = {n: _size(p) for n, p in segs.items()}
    spans: list[FileSpan] = []
    rf, rp = read
    for num in sorted(n for n in segs if rf <= n < wf):
        start = rp if num == rf else 0
        if sizes[num] > start:
            spans.append(FileSpan(num, start, sizes[num]))
    end: Pos = (wf, wp)
    if holder is not None:
        start = rp if wf == rf else 0
        if wf in segs and wp > start:
            spans.append(FileSpan(wf, start, wp))
        return QueueView(layout, meta, read, end, spans, holder, sizes=sizes)
    tail = 0
    torn = None
    for num in sorted(n for n in segs if n >= wf):
        scan_from = wp if num == wf else 0
        s = scan_segment(segs[num], num, scan_from, None, min_size, max_size)
        tail += s.records
        start = rp if num == rf else 0
        if s.end > start:
            spans.append(FileSpan(num, start, s.end))
        if s.end < s.size:
            torn = (num, s.end, s.size)
            if s.problem is not None:
                log.warning("%s: %s at byte %d; reading stops there", segs[num], s.problem, s.end)
        end = (num, s.end)
    if torn is not None and torn[0] != end[0]:
        torn = None  # the core quarantines a damaged file that is not the last one
    return QueueView(layout, meta, read, end, spans, None, tail, torn, sizes)


def select_queues(directory: str, accept: Callable[[str], bool]) -> list[str]:
    """Queue names in ``directory`` accepted by ``accept``, sorted (none if it is missing)."""
    if not os.path.isdir(directory):
        return []
    return [n for n in queue_names(directory) if accept(n)]


def spans_between(view: QueueView, start: Pos, end: Pos) -> list[FileSpan]:
    """The file spans holding the records between positions ``start`` and ``end``.

    Raises DiskQueueError if a segment the range needs is gone (consumed or
    removed by someone else since the range was planned).
    """
    out: list[FileSpan] = []
    if start >= end:
        return out
    (sf, sp), (ef, ep) = start, end
    stops = {s.num: s.stop for s in view.spans}
    for num in range(sf, ef + 1):
        lo = sp if num == sf else 0
        hi = ep if num == ef else stops.get(num, view.sizes.get(num, -1))
        if view.sizes.get(num, -1) < 0:
            if hi <= lo and num == ef:
                continue
            raise DiskQueueError(
                f"{view.layout.segment_path(num)} is gone, but records between {list(start)} "
                f"and {list(end)} of queue {view.layout.name!r} were still to be read: "
                "another process consumed or removed them"
            )
        if hi > lo:
            out.append(FileSpan(num, lo, hi))
    return out


def advance(
    view: QueueView,
    spans: list[FileSpan],
    max_rows: int | None,
    max_bytes: int | None,
    min_size: int,
    max_size: int,
) -> tuple[Pos | None, int, int]:
    """Walk records through ``spans`` until a limit is reached.

    Returns ``(position, rows, bytes)``: the position just past the last
    record admitted (``None`` if ``spans`` is empty), and what was admitted.
    At least one record is admitted when there is one, so a stream always
    makes progress. A position at the end of a span that has a successor is
    moved to the successor's start, so the finished file can be released.
    """
    rows = 0
    nbytes = 0
    pos: Pos | None = None
    full = False
    for i, span in enumerate(spans):
        path = view.layout.segment_path(span.num)
        for chunk in iter_spans(path, span.num, span.start, span.stop, min_size, max_size):
            for payload, num, rec_end in chunk.records:
                size = HEADER.size + len(payload)
                if rows and (
                    (max_rows is not None and rows >= max_rows)
                    or (max_bytes is not None and nbytes + size > max_bytes)
                ):
                    full = True
                    break
                rows += 1
                nbytes += size
                pos = (num, rec_end)
            if full:
                break
            if chunk.problem is not None:
                pos = (span.num, span.stop)  # the rest of a damaged file is never delivered
        if pos is None and not full:
            pos = (span.num, span.stop)
        if pos == (span.num, span.stop) and i + 1 < len(spans):
            pos = (spans[i + 1].num, spans[i + 1].start)
        if full:
            break
    return pos, rows, nbytes


def iter_records(
    layout: Layout, spans: list[FileSpan], min_size: int, max_size: int
) -> Iterator[list[Record]]:
    """Yield the records of ``spans`` in order, one list per read chunk.

    A truncated record ends its file's span with a warning (the core
    quarantines that file when it reaches it). Raises CorruptionError at a
    length outside ``[min_size, max_size]``, DiskQueueError if a segment is gone.
    """
    for span in spans:
        path = layout.segment_path(span.num)
        try:
            chunks = iter_spans(path, span.num, span.start, span.stop, min_size, max_size,
                                READ_CHUNK)
            for chunk in chunks:
                if chunk.records:
                    yield chunk.records
                if chunk.problem == BAD_LENGTH:
                    # Most often a queue written with a larger max_msg_size: failing says
                    # so, where skipping the rest of the file would lose it quietly.
                    raise CorruptionError(
                        path, chunk.end,
                        f"record length {chunk.bad_length} is outside [{min_size}, {max_size}]"
                        " (options minMsgSize, maxMsgSize): if the queue's messages may be "
                        "that large, set maxMsgSize; otherwise open the queue once with "
                        "DiskQueue, which quarantines the damaged file",
                    )
                if chunk.problem is not None:
                    log.warning("%s: %s at byte %d; skipping the rest of this file",
                                path, chunk.problem, chunk.end)
        except FileNotFoundError:
            raise DiskQueueError(
                f"{path} is gone before its records were read: another process consumed or "
                f"removed queue {layout.name!r} under this job"
            ) from None


# ---------------------------------------------------------------- consume


class QueueBusy(QueueLocked):
    """The Spark source or sink needs a queue's lock, and a live process holds it."""

    def __init__(self, layout: Layout, pid: int | None, what: str) -> None:
        holder = f"process {pid}" if pid else "another process"
        DiskQueueError.__init__(
            self,
            f"cannot {what} queue {layout.name!r} in {layout.directory}: it is open in {holder} "
            f"(which holds {layout.lock_path}: a live DiskQueue, or a Spark commit that did "
            "not finish in time); close the queue there, or let producers write to new "
            "queue names and read them with a glob",
        )
        self.path = layout.lock_path
        self.pid = pid


LOCK_WAIT = 10.0  # seconds to wait for a queue's lock held by someone else


def _lock(layout: Layout, what: str, wait: float) -> QueueLock:
    """Take the queue's lock, retrying for ``wait`` seconds: another Spark commit holds
    it only for a moment, while a DiskQueue holds it as long as it is open."""
    deadline = time.monotonic() + wait
    while True:
        lock = QueueLock(layout.lock_path)
        try:
            lock.acquire()
            return lock
        except QueueLocked as exc:
            if time.monotonic() >= deadline:
                raise QueueBusy(layout, exc.pid, what) from None
        time.sleep(0.05)


def release(layout: Layout, end: Pos, min_size: int, max_size: int, *,
            lock_wait: float = LOCK_WAIT) -> bool:
    """Consume queue ``layout`` up to ``end``: store the new read position, then
    delete the segments wholly before it.

    Idempotent: a position at or before the stored read position changes
    nothing. Returns whether the meta file was changed. Raises QueueBusy if
    another process holds the queue's lock for more than ``lock_wait`` seconds.
    """
    try:
        current = load_meta(layout.meta_path)
    except ValueError:
        current = None
    if current is not None and end <= current.read:
        return False  # already released: no lock needed, so an open DiskQueue is no obstacle
    lock = _lock(layout, "consume", lock_wait)
    try:
        segs = layout.segments()
        view_meta = load_meta(layout.meta_path)
        if view_meta is None:
            first = min(segs) if segs else end[0]
            view_meta = Meta(0, first, 0, first, 0)
            depth_known = False
        else:
            depth_known = True
        if end <= view_meta.read:
            return False
        if end >= view_meta.write:
            # Everything the meta counted is consumed; records past ``end`` (a tail
            # written after the last meta sync) are found again by the core's recovery.
            meta = Meta(0, *end, *end)
        else:
            consumed = 0
            rf, rp = view_meta.read
            for num in range(rf, end[0] + 1):
                if num not in segs:
                    continue
                stop = end[1] if num == end[0] else None
                consumed += scan_segment(segs[num], num, rp if num == rf else 0, stop,
                                         min_size, max_size).records
            depth = view_meta.depth - consumed if depth_known else 0
            meta = Meta(max(depth, 0), *end, *view_meta.write)
        store_meta(layout.meta_path, meta)
        # Deleting only after the meta that moved past a file is durable: a crash in
        # between leaves consumed files, which the next open removes.
        for num in sorted(segs):
            if num < end[0]:
                os.remove(segs[num])
        return True
    finally:
        lock.release()


# ---------------------------------------------------------------- staged writes


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
    """Write records into staged files by go-diskqueue's roll rule."""

    def __init__(self, directory: str, max_bytes_per_file: int) -> None:
        self.directory = directory
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
        os.makedirs(self.directory, exist_ok=True)
        self._path = os.path.join(self.directory, f"{self._prefix}-{len(self.files):06d}.dat")
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
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
    """Delete a job's staging directory and whatever is left in it."""
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
    except OSError:
        pass


def end_mark(where: str) -> str:
    """The file that says the write job staging into ``where`` has ended."""
    return where + ".ended"


def mark_end(where: str) -> None:
    """Create the end mark of the job staging into ``where``."""
    os.makedirs(os.path.dirname(where), exist_ok=True)
    with open(end_mark(where), "wb"):
        pass


STALE_SECONDS = 24 * 3600


def sweep_staging(layout: Layout, now: float | None = None) -> None:
    """Remove end marks, and staging directories left by crashed drivers, older than a day."""
    parent = os.path.join(layout.directory, STAGING_PREFIX, layout.name)
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return
    limit = (time.time() if now is None else now) - STALE_SECONDS
    for entry in entries:
        path = os.path.join(parent, entry)
        try:
            if os.stat(path).st_mtime >= limit:
                continue
            if os.path.isdir(path):
                remove_staging_dir(path)
            else:
                os.remove(path)
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

    Raises QueueBusy if another process holds the queue's lock for more than
    ``lock_wait`` seconds.
    """
    files = [f for f in files if f.records]
    if not files and batch is None:
        return None  # an empty job leaves no trace, not even a lock file
    os.makedirs(layout.directory, exist_ok=True)
    lock = _lock(layout, "append to", lock_wait)
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
            os.truncate(layout.segment_path(num), whole)
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
            store_meta(layout.meta_path, meta)
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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(data, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(layout.directory)
