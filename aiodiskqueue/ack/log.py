"""The ack log's files: synchronous I/O, run on the ack layer's own I/O thread.

Segments ``NAME.ack.%06d.log`` hold framed records (see :mod:`.codec`).
The log is append-only; space is reclaimed by deleting whole segments from the
oldest end once none of their entries is live, after copying the few live ones
forward (compaction, decided by :mod:`.journal`). Deleting only from the
oldest end keeps replay correct: a ``D`` or ``U`` record always comes after the
``E`` records of its key, so deleting a prefix can never drop a ``D`` and keep
the ``E`` it cancels.

Recovery on open reads every segment in order and replays it: the latest ``E``
of a key wins, ``U`` updates it, ``D`` removes it. A torn record at the end of
the last segment (a crash in the middle of a write) is cut off; a bad record
inside an older segment ends the reading of that segment, with a warning.

Full disk: the active segment keeps ``reserve_bytes`` of blocks allocated past
its end (:mod:`.._format.space`), topped up as records use them. Draining a
queue that filled its disk appends ``D`` and ``H`` records into that reserve,
so the commit that lets the data queue delete its consumed segments goes
through. While the disk stays full (the top-up fails), the second half of the
reserve is kept for commits: a hop without a head record that would reach into
it fails with ENOSPC, and the pump commits instead. A roll reserves the next
segment's blocks before the older segment gives its reserve back, so no other
writer can take them in between; on a full disk there is no roll, and the
active segment grows past the segment size into its reserve. A closed segment
keeps its reserve, so a queue reopened on a full disk can still be drained.
"""

from __future__ import annotations

import errno
import logging
import os
import zlib
from dataclasses import dataclass, field

from .._format import nsq
from .._format.access import open_file, read_fd
from .._format.layout import FILE_MODE, ack_log_files, ack_log_path
from .._format.space import reserve_past_end
from .codec import (
    ENTRY,
    FRAME,
    HEAD,
    KIND_DONE,
    KIND_ENTRY,
    KIND_HEAD,
    KIND_UPDATE,
    SEQ,
    UPDATE,
    frame,
    head_record,
    rewrite_entry,
)

log = logging.getLogger(__name__)

_MAX_RECORD = 2**31 - 1
_ATTEMPTS_AT = ENTRY.size + 8  # the nsqd message's attempts field inside an E payload

Loc = tuple[int, int, int]  # segment number, offset of the frame, frame size


def _intact_at(data: bytes, off: int) -> bool:
    """Whether an intact frame starts at ``off``."""
    if off + FRAME.size > len(data):
        return False
    n: int
    crc: int
    n, crc = FRAME.unpack_from(data, off)
    end = off + FRAME.size + n
    return n >= 1 and end <= len(data) and zlib.crc32(data[off + FRAME.size:end]) == crc


class _Damaged(Exception):
    """A record that should be there cannot be read back intact."""


@dataclass(slots=True)
class Stored:
    """A live entry found by recovery: where it is and its latest state."""

    seg: int
    off: int
    size: int
    fetch_seq: int
    due_ns: int
    attempts: int


@dataclass(slots=True)
class Recovered:
    """What :meth:`AckLog.open` found."""

    entries: dict[int, Stored]
    fetch_seq: int
    commit: tuple[int, int, int] | None  # fetch_seq, data read file, data read pos
    next_key: int
    sizes: dict[int, int]
    cut_bytes: int  # torn tail removed from the last segment


@dataclass(slots=True)
class LogJob:
    """One hop's work, done in this order: reads, appends, copies, fsync, deletes."""

    records: list[bytes] = field(default_factory=list)
    reads: list[Loc] = field(default_factory=list)
    copies: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)
    sync: bool = False


@dataclass(slots=True)
class LogResult:
    """Locations of the appended records and copies, bodies read, segment sizes."""

    locs: list[Loc]
    copy_locs: list[Loc | None]  # None: the record could not be read, it was not copied
    read_payloads: list[bytes | None]  # None: the record could not be read
    sizes: dict[int, int]


class AckLog:
    """Owner of the ack log's segment files (one thread at a time)."""

    def __init__(self, directory: str, name: str, segment_bytes: int,
                 reserve_bytes: int = 0, mode: int = FILE_MODE) -> None:
        self.directory = directory
        self.mode = mode  # of the segments it creates
        self.name = name
        self.segment_bytes = segment_bytes
        self.reserve_bytes = reserve_bytes
        self._reserved_end = 0  # blocks of the active segment are allocated up to here
        self._starved = False  # the last top-up found the disk full
        self._need_head = False  # the active segment lacks its head record (a failed roll)
        self.active = 0
        self.size = 0
        self.sizes: dict[int, int] = {}
        self._fd: int | None = None
        self._seg_start = 0  # bytes of the active segment before its first record
        self._dir_dirty = False
        self.fetch_seq = 0
        self.commit = (0, 0, 0)
        self.next_key = 1

    def path(self, num: int) -> str:
        """The file name of segment ``num``."""
        return ack_log_path(self.directory, self.name, num)

    # ------------------------------------------------------------------ open / recovery

    def open(self) -> Recovered:
        """Read and replay every segment; open the last one for appending.

        Raises OSError if the files cannot be read or created.
        """
        nums = sorted(ack_log_files(self.directory, self.name))
        entries: dict[int, Stored] = {}
        commit: tuple[int, int, int] | None = None
        cut = 0
        for i, num in enumerate(nums):
            with open(read_fd(self.path(num)), "rb") as f:
                data = f.read()
            end, commit = self._replay(num, data, entries, commit)
            if end < len(data):
                if i == len(nums) - 1:
                    cut = len(data) - end
                    log.info("%s: cut a torn tail of %d byte(s) at offset %d",
                             self.path(num), cut, end)
                    with open(self.path(num), "r+b") as fw:
                        fw.truncate(end)
                        os.fsync(fw.fileno())
                    data = data[:end]
                else:
                    log.warning("%s: bad record at offset %d; the %d byte(s) after it are "
                                "ignored", self.path(num), end, len(data) - end)
            self.sizes[num] = len(data)
        if commit is not None:
            self.commit = commit
        if len(nums) > 1 and self.sizes[nums[-1]] == 0:
            # Left by a roll that did not get to its head record (a crash): no records.
            empty = nums.pop()
            os.remove(self.path(empty))
            del self.sizes[empty]
        if nums:
            self.active = nums[-1]
            self._fd = open_file(self.path(self.active), os.O_RDWR | os.O_CREAT, self.mode)
            self.size = self.sizes[self.active]
            self._reserved_end = self.size
            self._top_up()
            if self.size == 0:  # a new log's first segment, created just before a crash
                self._flush_head()
        else:
            self._new_segment(0)
            self._flush_head()
        return Recovered(entries, self.fetch_seq, commit, self.next_key, dict(self.sizes), cut)

    def _replay(self, num: int, data: bytes, entries: dict[int, Stored],
                commit: tuple[int, int, int] | None) -> tuple[int, tuple[int, int, int] | None]:
        """Apply one segment's records; return where its intact records end, and the commit.

        A damaged record followed by an intact one (a flipped bit, not a torn
        write) is skipped with an error: losing one entry beats losing the rest.
        """
        off = 0
        n_data = len(data)
        while off + FRAME.size <= n_data:
            n, crc = FRAME.unpack_from(data, off)
            end = off + FRAME.size + n
            if n < 1 or end > n_data:
                break
            p = data[off + FRAME.size:end]
            applied = zlib.crc32(p) == crc and self._apply(num, off, p, entries)
            if applied is False:
                if not _intact_at(data, end):
                    break  # nothing intact follows: a torn tail
                log.error("%s: damaged record at offset %d skipped", self.path(num), off)
            elif applied is not True:
                commit = applied
            off = end
        return off, commit

    def _apply(self, num: int, off: int, p: bytes,
               entries: dict[int, Stored]) -> bool | tuple[int, int, int]:
        """Apply one intact record: True, a commit (for ``H``), or False if malformed."""
        kind, n = p[0], len(p)
        if kind == KIND_ENTRY and n >= ENTRY.size + nsq.HEADER_SIZE:
            _, key, seq, due = ENTRY.unpack_from(p)
            attempts = int.from_bytes(p[_ATTEMPTS_AT:_ATTEMPTS_AT + 2], "big")
            entries[key] = Stored(num, off, FRAME.size + n, seq, due, attempts)
            self._track(key, seq)
        elif kind == KIND_UPDATE and n == UPDATE.size:
            _, key, due, attempts = UPDATE.unpack(p)
            st = entries.get(key)
            if st is not None:
                st.due_ns, st.attempts = due, attempts
        elif kind == KIND_DONE and n == SEQ.size + 1:
            key, seq = SEQ.unpack_from(p, 1)
            entries.pop(key, None)
            self._track(key, seq)
        elif kind == KIND_HEAD and n == HEAD.size:
            _, seq, cseq, cfile, cpos, nkey = HEAD.unpack(p)
            self.fetch_seq = max(self.fetch_seq, seq)
            self.next_key = max(self.next_key, nkey)
            return (cseq, cfile, cpos)
        else:
            return False
        return True

    def _track(self, key: int, seq: int) -> None:
        self.fetch_seq = max(self.fetch_seq, seq)
        if key >= self.next_key:
            self.next_key = key + 1

    # ------------------------------------------------------------------ one hop

    def run(self, job: LogJob) -> LogResult:
        """Do one hop's work.

        Raises OSError if a read, write or fsync fails; appended bytes of the
        failed job are cut off again when possible.
        """
        reads: list[bytes | None] = []
        for loc in job.reads:
            p = self._read_or_none(loc)
            reads.append(None if p is None else p[ENTRY.size:])
        locs = self._append(job.records) if job.records else []
        copy_locs: list[Loc | None] = []
        if job.copies and self._starved:
            # Compaction waits while the disk is full: the copies would need the room kept
            # for the commit. The entries stay where they are, and so does their segment.
            copy_locs = [(seg, off, size) for seg, off, size, _, _ in job.copies]
            kept = {seg for seg, _, _, _, _ in job.copies}
            job.delete = [num for num in job.delete if num not in kept]
        elif job.copies:
            payloads: list[bytes] = []
            for seg, off, size, due, attempts in job.copies:
                p = self._read_or_none((seg, off, size))
                copy_locs.append(None if p is None else (0, 0, 0))
                if p is not None:
                    payloads.append(rewrite_entry(p, due, attempts))
            new = iter(self._append(payloads))
            copy_locs = [None if c is None else next(new) for c in copy_locs]
        if job.sync or job.copies or job.delete:
            self._sync()
        for num in job.delete:
            if num != self.active:
                try:
                    os.remove(self.path(num))
                except FileNotFoundError:
                    pass
                self.sizes.pop(num, None)
                self._dir_dirty = True
        if job.delete:
            self._sync_dir()
        return LogResult(locs, copy_locs, reads, dict(self.sizes))

    def _read_or_none(self, loc: Loc) -> bytes | None:
        """An ``E`` payload, or None (logged) if it is damaged: one bad record must not
        stop the log. A failing disk still raises (OSError from the read itself)."""
        try:
            return self._read(loc)
        except _Damaged as exc:
            log.error("%s", exc)
            return None

    def _read(self, loc: Loc) -> bytes:
        seg, off, size = loc
        if seg == self.active and self._fd is not None:
            data = os.pread(self._fd, size, off)
        else:
            with open(self.path(seg), "rb") as f:
                f.seek(off)
                data = f.read(size)
        if len(data) != size:
            raise _Damaged(f"{self.path(seg)}: short read at offset {off}")
        n, crc = FRAME.unpack_from(data)
        p = data[FRAME.size:]
        if n != len(p) or zlib.crc32(p) != crc or p[0] != KIND_ENTRY:
            raise _Damaged(f"{self.path(seg)}: bad entry record at offset {off}")
        return p

    def _check_room(self, payloads: list[bytes], pending: int = 0, *,
                    commit: bool = False) -> None:
        """On a full disk, keep the last half of the reserve for a commit's records.

        Raises OSError(ENOSPC) for records (plus ``pending`` bytes framed but not
        written yet) that would reach into it, unless they include a head record
        (``commit`` says an earlier part of the same hop did).
        """
        need = pending + sum(len(p) for p in payloads) + FRAME.size * len(payloads)
        if self.size + need <= self._reserved_end - self.reserve_bytes // 2:
            return
        if commit or any(p[0] == KIND_HEAD for p in payloads):
            return
        raise OSError(errno.ENOSPC, "no space left for the ack log; its reserve is kept "
                      "for the next commit")

    def _append(self, payloads: list[bytes]) -> list[Loc]:
        if self._starved:
            self._check_room(payloads)
        if self._need_head:
            self._flush_head()  # a roll failed after creating the segment
            self._need_head = False
        locs: list[Loc] = []
        buf = bytearray()
        start = self.size
        start_seg = self.active
        limit = self.segment_bytes
        commit = False
        try:
            for i, p in enumerate(payloads):
                fr = frame(p)
                used = self.size + len(buf)
                if used > self._seg_start and used + len(fr) > limit and not self._starved:
                    nxt = self._reserve_next()
                    if nxt is None:
                        # Full disk, no roll: the rest goes into this segment's reserve,
                        # as far as records that are not a commit's may use it.
                        self._check_room(payloads[i:], len(buf), commit=commit)
                    else:
                        self._roll(*nxt, buf)
                        buf = bytearray()
                        start = self.size
                locs.append((self.active, self.size + len(buf), len(fr)))
                buf += fr
                kind = p[0]
                if kind in (KIND_ENTRY, KIND_DONE):
                    key, seq = SEQ.unpack_from(p, 1)
                    self._track(key, seq)
                elif kind == KIND_HEAD:
                    commit = True
                    _, seq, cseq, cfile, cpos, nkey = HEAD.unpack(p)
                    self.commit = (cseq, cfile, cpos)
                    self.fetch_seq = max(self.fetch_seq, seq)
                    self.next_key = max(self.next_key, nkey)
            self._write(buf)
        except OSError:
            if self.active == start_seg:
                if self.size != start:  # a truncate would also free the reserve past the end
                    self._cut(start)
            else:
                # A roll happened: what went into the older segment stays (a retry writes
                # those records again, which replay takes as the same state); the new
                # segment is emptied and gets its head before the next records.
                self._cut(0)
                self._need_head = True
            raise
        return locs

    def _write(self, buf: bytearray | bytes) -> None:
        assert self._fd is not None
        view = memoryview(buf)
        while view:
            n = os.pwrite(self._fd, view, self.size)
            self.size += n
            view = view[n:]
        self.sizes[self.active] = self.size
        if self._reserved_end - self.size < self.reserve_bytes * 3 // 4:
            self._top_up()  # early: a full disk is noticed before the commit half is used

    def _top_up(self) -> None:
        """Allocate ``reserve_bytes`` past the end of the active segment, where possible.

        On a full disk what is still reserved stays and the next write tries again;
        where the filesystem cannot reserve, the log stops trying.
        """
        if self._fd is None or self.reserve_bytes <= 0:
            return
        got = reserve_past_end(self._fd, self.size, self.reserve_bytes)
        self._starved = got is False
        if got:
            self._reserved_end = self.size + self.reserve_bytes
        elif got is None:
            log.debug("%s: no space reserve (the filesystem cannot allocate past the end)",
                      self.path(self.active))
            self.reserve_bytes = 0

    def _cut(self, size: int) -> None:
        try:
            if self._fd is not None:
                os.ftruncate(self._fd, size)  # also frees the blocks reserved past it
                self.size = size
                self.sizes[self.active] = size
                self._reserved_end = size
                self._top_up()
        except OSError:
            log.exception("%s: cannot cut a failed write", self.path(self.active))

    def _reserve_next(self) -> tuple[int, int, int] | None:
        """Create the next segment with its reserve: ``(number, fd, bytes reserved)``, or
        None if the disk is full (the file is removed again).

        The next segment gets its reserve before the active one gives its own back
        (:meth:`_roll`), so no other writer on the disk can take those blocks in
        between. Without one, the active segment stays, and grows past the segment
        size into its reserve until a top-up finds room again.
        """
        num = self.active + 1
        fd = self._create(num)
        try:
            got = reserve_past_end(fd, 0, self.reserve_bytes) if self.reserve_bytes > 0 else None
        except OSError:
            self._drop(num, fd)
            raise
        if got is False:
            self._drop(num, fd)
            self._starved = True
            return None
        return num, fd, self.reserve_bytes if got else 0

    def _roll(self, num: int, fd: int, reserved: int, rest: bytearray) -> None:
        """Write ``rest`` to the active segment, then make segment ``num`` (from
        :meth:`_reserve_next`) the active one."""
        assert self._fd is not None
        try:
            self._write(rest)
            os.fsync(self._fd)  # the older segment is complete and durable before the next
            os.ftruncate(self._fd, self.size)  # its reserve back, the next one has its own
        except OSError:
            self._drop(num, fd)
            raise
        self._activate(num, fd, reserved)
        self._flush_head()

    def _new_segment(self, num: int) -> None:
        """Create segment ``num`` and make it the active one. If it cannot be created, the
        active segment stays as it was (still open)."""
        self._activate(num, self._create(num), 0)
        self._top_up()

    def _create(self, num: int) -> int:
        return open_file(self.path(num), os.O_RDWR | os.O_CREAT | os.O_TRUNC, self.mode)

    def _drop(self, num: int, fd: int) -> None:
        """Close and remove segment ``num``, created but never made active."""
        os.close(fd)
        os.remove(self.path(num))

    def _activate(self, num: int, fd: int, reserved: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self.active = num
        self.size = 0
        self.sizes[num] = 0
        self._dir_dirty = True
        self._reserved_end = reserved
        self._starved = False

    def _flush_head(self) -> None:
        # Every segment starts with the head, so deleting older segments never
        # loses the highest fetch_seq or the last commit.
        cseq, cfile, cpos = self.commit
        self._write(frame(head_record(self.fetch_seq, cseq, cfile, cpos, self.next_key)))
        self._seg_start = self.size

    def _sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
        if self._dir_dirty:
            self._sync_dir()

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dir_dirty = False

    def close(self) -> None:
        """fsync and close the active segment; idempotent."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None
