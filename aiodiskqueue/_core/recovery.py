"""Recovery on open: the state a queue starts from, worked out from its files.

Runs once, on the queue's I/O thread, with the queue's lock held: remove what a
crash left (meta temp files, consumed segments), check the meta file against the
segments, scan past its write position for records written after the last meta
sync (cutting a torn tail), and rebuild the meta from the segments when it is
missing or does not match them. Damaged segments are quarantined through the
store; in strict mode CorruptionError is raised and nothing is changed.

Zero-filled tails: a filesystem may persist a file's new size before its data (XFS,
ext4 ``data=writeback``), so after a power cut the bytes past a segment's last fsync
can read as zeros, and every 4 zero bytes as an empty record. The format has no
checksum; a marker file decides (``zero_filled_tail`` in ``_format/scan.py``, the
rule of every reader): a queue makes ``NAME.diskqueue.empty`` durable before it
accepts an empty message. Without it, a run of zero-length records that ends the last
segment past the meta's write position (every record when the meta is rebuilt) is cut
with a warning; with it they are messages. Records the meta's write position covers
are never questioned. (go-diskqueue reads zeros as empty messages; nsqd avoids it with
its minimum message size of 26 bytes. With ``min_msg_size >= 1`` a zero length is
invalid, and zeros to the end of the last segment are cut the same way.)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .._format.access import make_dirs, open_file
from .._format.layout import Layout, file_size, free_bad_name, fsync_dir
from .._format.meta import Meta, load_meta, position_problems, read_is_trusted, spare_path
from .._format.scan import (
    BAD_LENGTH,
    ZEROS,
    SegmentSummary,
    realign,
    scan_segment,
    zero_filled_tail,
)
from ..errors import CorruptionError

log = logging.getLogger(__name__)


class _Misaligned(Exception):
    """A position taken from the meta file lies inside a record."""

    def __init__(self, path: str, pos: int) -> None:
        super().__init__(path, pos)
        self.path = path
        self.pos = pos


@dataclass(slots=True)
class OpenState:
    """The state a queue starts from after recovery."""

    meta: Meta
    bad_files: int
    bytes_on_disk: int
    recovered: int  # records found past the meta's write position


class Recovery:
    """One open-time recovery of the queue at ``layout``, with its record size limits;
    ``strict``: raise CorruptionError at damage instead of quarantining it."""

    def __init__(self, layout: Layout, strict: bool, min_size: int, max_size: int) -> None:
        self.layout = layout
        self.strict = strict
        self.min_size = min_size
        self.max_size = max_size
        self.write_file = 0
        self.write_pos = 0
        self.marked = False  # the empty-message marker exists: zero-length records are messages

    def run(self) -> OpenState:
        """Recover the queue's state from its files; the store takes over its write position."""
        lay = self.layout
        make_dirs(lay.directory, lay.dir_mode)
        segs = lay.segments()
        self.marked = os.path.exists(lay.empty_marker_path)
        bad_before = len(lay.bad_files())
        for tmp in lay.meta_temp_files():
            if tmp == spare_path(lay.meta_path):
                continue  # kept: the next meta store writes into it, even on a full disk
            # Left by a process killed inside store_meta(); we hold the lock, so no live
            # process is writing it.
            log.info("%s: removing leftover temp file", tmp)
            os.remove(tmp)
        try:
            meta = load_meta(lay.meta_path)
        except ValueError as exc:
            if self.strict:
                raise CorruptionError(lay.meta_path, 0, str(exc)) from exc
            moved = free_bad_name(lay.meta_path)  # never over an older one
            log.warning("%s: unreadable meta file (%s); moved to %s, rebuilding from segments",
                        lay.meta_path, exc, moved)
            os.rename(lay.meta_path, moved)
            meta = None
        recovered = 0
        if meta is None:
            if segs:
                first = min(segs)
                log.warning("%s: no meta file; rebuilding state from %d segment(s)",
                            lay.meta_path, len(segs))
                meta, recovered = self._rebuild(first, 0, segs)
            else:
                meta = Meta(0, 0, 0, 0, 0)
        else:
            meta, recovered = self._from_meta(meta, segs)
        meta = self._past_file_end(meta)
        on_disk = sum(file_size(p) for p in lay.segments().values())
        return OpenState(meta, len(lay.bad_files()) - bad_before, on_disk, recovered)

    def _past_file_end(self, meta: Meta) -> Meta:
        """A read position at the end of a completed file (or in an empty or missing
        one) is the start of the next one."""
        rf, rp = meta.read
        for _ in range(len(self.layout.segments()) + 1):  # bounded by the files that exist
            if rf >= meta.write_file_num or rp < file_size(self.layout.segment_path(rf)):
                break
            rf, rp = rf + 1, 0
        return meta if (rf, rp) == meta.read else Meta(meta.depth, rf, rp, *meta.write)

    def _from_meta(self, meta: Meta, segs: dict[int, str]) -> tuple[Meta, int]:
        """The state from a parseable meta file, checked against the segments.

        Segments below the read file are deleted (consumed leftovers of a crash)
        only when every position of the meta fits the files: a meta that
        contradicts them never causes a deletion.
        """
        lay = self.layout
        sizes = {n: file_size(p) for n, p in segs.items()}
        problems = position_problems(meta, sizes)
        reason = "; ".join(problems)
        if not problems:
            for num in sorted(n for n in segs if n < meta.read_file_num):
                # Left behind by a crash between a meta sync and the deletion it allowed.
                log.info("%s: removing consumed segment left behind", segs[num])
                os.remove(segs.pop(num))
            try:
                recovered = self._recover_tail(meta, segs)
            except _Misaligned as exc:
                reason = f"write position {exc.pos} of {exc.path} is not a record boundary"
            else:
                if meta.depth >= 0:
                    tail = self.write_file, self.write_pos
                    depth = 0 if meta.read == tail else meta.depth + recovered
                    return Meta(depth, meta.read_file_num, meta.read_pos, *tail), recovered
                reason = f"negative depth {meta.depth}"
        if self.strict:
            raise CorruptionError(lay.meta_path, 0,
                                  f"meta {meta.encode()!r} does not match the segments: {reason}")
        rf, rp = meta.read
        if not read_is_trusted(meta, sizes):
            # The read position cannot be trusted, or files it would skip exist: count
            # from the first segment (records may be delivered again, none is lost).
            rf, rp = min(segs, default=0), 0
            log.warning("%s: meta %r does not match the segments (%s); recounting every "
                        "segment from the first, nothing deleted", lay.meta_path, meta, reason)
        else:
            log.warning("%s: meta %r does not match the segments (%s); recounting from the "
                        "read position", lay.meta_path, meta, reason)
        return self._rebuild(rf, rp, segs)

    def _recover_tail(self, meta: Meta, segs: dict[int, str]) -> int:
        """Scan past the meta's write position: records written after the last meta sync."""
        wf, wp = meta.write
        count = 0
        nums = [wf, *sorted(n for n in segs if n > wf)]
        self.write_file, self.write_pos = wf, wp
        for i, num in enumerate(nums):
            if num not in segs:
                continue
            start = wp if num == wf else 0
            s = scan_segment(segs[num], num, start, None, self.min_size, self.max_size,
                             empties=True)
            if (s.problem is not None and start > 0
                    and realign(segs[num], num, start, self.min_size, self.max_size) is not None):
                # Scanning from a position inside a record finds garbage: the meta is
                # wrong, and truncating or quarantining here would destroy good records.
                raise _Misaligned(segs[num], start)
            last = i == len(nums) - 1
            s = self._zero_tail(s, last)
            if s.problem is not None or s.end < s.size:
                self._cut_tail(segs[num], num, s.end, s.size, s.problem, damaged=not last)
            if num != wf and s.records:
                log.info("%s: recovered %d record(s) written after the last meta sync",
                         segs[num], s.records)
            count += s.records
            self.write_file, self.write_pos = num, s.end
        if count and wf == self.write_file:
            log.info("%s: recovered %d record(s) past the meta write position",
                     self.layout.meta_path, count)
        return count

    def _rebuild(self, read_file: int, read_pos: int,
                 segs: dict[int, str]) -> tuple[Meta, int]:
        """Count every record from ``(read_file, read_pos)`` through the last segment."""
        nums = sorted(n for n in segs if n >= read_file)
        depth = 0
        self.write_file, self.write_pos = read_file, read_pos
        for i, num in enumerate(nums):
            start = read_pos if num == read_file else 0
            s = scan_segment(segs[num], num, start, None, self.min_size, self.max_size,
                             empties=True)
            if s.problem is not None and start > 0:
                back = realign(segs[num], num, start, self.min_size, self.max_size)
                if back is not None:
                    # The read position is inside a record: start at the record holding
                    # it (delivered again rather than lost).
                    log.warning("%s: read position %d is not a record boundary; reading "
                                "from %d", segs[num], start, back)
                    read_pos = start = back
                    s = scan_segment(segs[num], num, start, None, self.min_size,
                                     self.max_size, empties=True)
            s = self._zero_tail(s, i == len(nums) - 1)
            if s.problem is not None or s.end < s.size:
                self._cut_tail(segs[num], num, s.end, s.size, s.problem,
                               damaged=i < len(nums) - 1)
            depth += s.records
            self.write_file, self.write_pos = num, s.end
        if read_file not in segs and nums:
            read_file, read_pos = nums[0], 0
        read_file, read_pos = min((read_file, read_pos), (self.write_file, self.write_pos))
        return Meta(depth, read_file, read_pos, self.write_file, self.write_pos), depth

    def _zero_tail(self, s: SegmentSummary, last: bool) -> SegmentSummary:
        """``s`` without a zero-filled tail if it is the last segment's."""
        return zero_filled_tail(s, self.marked, self.min_size) if last else s

    def _cut_tail(self, path: str, num: int, end: int, size: int, problem: str | None,
                  damaged: bool = False) -> None:
        """Truncate a segment to its last whole record at ``end``.

        A torn record at the end of the last segment is what a crash leaves: it is
        dropped. A bad length field, or any problem in a segment before the last
        (``damaged``), is damage, and good records may follow it: those bytes are
        first saved to a ``.bad`` file (in strict mode CorruptionError is raised
        instead). The whole records before ``end`` stay in the queue.
        """
        if problem == BAD_LENGTH or damaged:
            if self.strict:
                raise CorruptionError(path, end, "record length outside the allowed range"
                                      if problem == BAD_LENGTH else "truncated record")
            dst = self.layout.free_bad_path(num)
            out_fd = open_file(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.layout.file_mode)
            with open(path, "rb") as src, open(out_fd, "wb") as out:
                src.seek(end)
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            fsync_dir(self.layout.directory)
            log.warning("%s: %s at offset %d; %d byte(s) from there saved as %s and cut off",
                        path, "bad record length" if problem == BAD_LENGTH else "damage", end,
                        size - end, dst)
        elif problem == ZEROS:
            log.warning("%s: truncating %d byte(s) at offset %d that read as empty messages "
                        "never written (a zero-filled tail: the file's size reached the disk "
                        "before its data)", path, size - end, end)
        else:
            log.warning("%s: truncating %d byte(s) of torn tail at offset %d (%s)",
                        path, size - end, end, problem)
        os.truncate(path, end)
