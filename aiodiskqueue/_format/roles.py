"""The files that let a producer process and a consumer process share one queue.

Beside go-diskqueue's files (which it never reads: its names end in ``.dat``), a queue
held by roles has:

- ``NAME.diskqueue.producer`` and ``NAME.diskqueue.consumer``: each role's lock
  (``flock(LOCK_EX)`` while a process holds the role) and its published state, one
  fixed-size record written in place with ``pwrite`` (pid, options, position, sequence
  number). The producer rewrites its record after each write batch.
- ``NAME.diskqueue.roles``: the lock that serializes meta writers (a short
  ``flock(LOCK_EX)``) and the sequence numbers of the stored meta's positions, so
  that either role can compute the depth the meta file must hold.

A sequence number counts records: the record at the consumer's position has number
``seq_r``, the producer's next one ``seq_w``; ``seq_w - seq_r`` is the depth.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .access import open_file, read_fd
from .layout import FILE_MODE
from .meta import Meta, load_meta, store_meta
from .probe import held_exclusively

ROLES = ("producer", "consumer", "both")

_REC = struct.Struct("<8sqQqqqqqqq")  # magic pid session file pos seq maxb min max live
_REC_MAGIC = b"ADQROLE1"
_CRC = struct.Struct("<I")
REC_SIZE = _REC.size + _CRC.size
_REC_CRC = struct.Struct(_REC.format + "I")  # the record and its CRC in one unpack

_SEQ_ENTRY = struct.Struct("<qqqqqqq")  # depth rf rp wf wp seq_r seq_w
_SEQ_MAGIC = b"ADQSEQS1"
SEQS_SIZE = len(_SEQ_MAGIC) + 2 * _SEQ_ENTRY.size + 2 + _CRC.size
_READ_TRIES = 100


def _crc(data: bytes) -> bytes:
    return _CRC.pack(zlib.crc32(data))


def check_role(role: object) -> str:
    """``role`` if it is ``"producer"``, ``"consumer"`` or ``"both"``.

    Raises TypeError or ValueError naming the bad value.
    """
    if not isinstance(role, str):
        raise TypeError(f"role must be a str, got {type(role).__name__}")
    if role not in ROLES:
        raise ValueError(f"role must be 'producer', 'consumer' or 'both', got {role!r}")
    return role


@dataclass(frozen=True, slots=True)
class RoleRecord:
    """What a role publishes in its file: who holds it, with which size options, and
    (producer) where its next record goes and that record's sequence number, or
    (consumer) its last stored position and sequence number."""

    pid: int
    session: int  # random per open: a record of an earlier holder is told apart
    file_num: int
    pos: int
    seq: int
    max_bytes_per_file: int
    min_msg_size: int
    max_msg_size: int
    live: bool  # written after the role's setup under the meta lock; cleared on close

    @property
    def at(self) -> tuple[int, int]:
        """``(file_num, pos)``."""
        return (self.file_num, self.pos)

    def encode(self) -> bytes:
        """The record's fixed-size bytes, with a CRC (a reader may catch a pwrite half done)."""
        return encode_record(self.pid, self.session, self.file_num, self.pos, self.seq,
                             self.max_bytes_per_file, self.min_msg_size, self.max_msg_size,
                             self.live)

    @classmethod
    def decode(cls, data: bytes) -> RoleRecord | None:
        """The record in ``data``; None if empty or not (yet) a whole record."""
        if len(data) < REC_SIZE:
            return None
        body = data[:_REC.size]
        if data[_REC.size:REC_SIZE] != _crc(body):
            return None
        magic, pid, session, fnum, pos, seq, maxb, lo, hi, live = _REC.unpack(body)
        if magic != _REC_MAGIC:
            return None
        return cls(pid, session, fnum, pos, seq, maxb, lo, hi, bool(live))


def encode_record(pid: int, session: int, file_num: int, pos: int, seq: int,
                  max_bytes_per_file: int, min_msg_size: int, max_msg_size: int,
                  live: bool) -> bytes:
    """A role record's bytes from its fields (:class:`RoleRecord` in that order), without
    making the object: a producer encodes one per batch."""
    body = _REC.pack(_REC_MAGIC, pid, session, file_num, pos, seq, max_bytes_per_file,
                     min_msg_size, max_msg_size, int(live))
    return body + _CRC.pack(zlib.crc32(body))


def decode_position(data: bytes) -> tuple[int, int, int, int] | None:
    """``(session, file_num, pos, seq)`` of the record in ``data``, checked as
    :meth:`RoleRecord.decode` checks it; None where that gives None. For a reader that
    follows a producer's position (it needs no record object for that)."""
    if len(data) != REC_SIZE:
        if len(data) < REC_SIZE:
            return None
        data = data[:REC_SIZE]
    f = _REC_CRC.unpack(data)
    if f[0] != _REC_MAGIC or f[10] != zlib.crc32(memoryview(data)[:_REC.size]):
        return None
    return f[2], f[3], f[4], f[5]


def read_record(fd: int) -> RoleRecord | None:
    """The record in the role file open at ``fd`` (retried while a write is half done)."""
    for _ in range(_READ_TRIES):
        data = os.pread(fd, REC_SIZE, 0)
        if not data:
            return None
        rec = RoleRecord.decode(data)
        if rec is not None:
            return rec
    return None


def read_record_at(path: str) -> RoleRecord | None:
    """The record in the role file at ``path``, None if there is none."""
    try:
        fd = read_fd(path)
    except FileNotFoundError:
        return None
    try:
        return read_record(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Seqs:
    """A stored meta and the sequence numbers of its read and write positions."""

    meta: Meta
    seq_r: int
    seq_w: int


def _pack_entry(s: Seqs | None) -> bytes:
    if s is None:
        return b"\0" + bytes(_SEQ_ENTRY.size)
    m = s.meta
    return b"\1" + _SEQ_ENTRY.pack(m.depth, *m.read, *m.write, s.seq_r, s.seq_w)


def _unpack_entry(data: bytes) -> Seqs | None:
    if data[0] != 1:
        return None
    d, rf, rp, wf, wp, sr, sw = _SEQ_ENTRY.unpack(data[1:])
    return Seqs(Meta(d, rf, rp, wf, wp), sr, sw)


def encode_seqs(prev: Seqs | None, cur: Seqs) -> bytes:
    """The bytes of the roles file: the meta stored before and the one being stored."""
    body = _SEQ_MAGIC + _pack_entry(prev) + _pack_entry(cur)
    return body + _crc(body)


def decode_seqs(data: bytes) -> tuple[Seqs | None, Seqs | None]:
    """``(prev, cur)`` from the roles file's bytes; Nones where nothing valid is stored."""
    if len(data) < SEQS_SIZE or not data.startswith(_SEQ_MAGIC):
        return None, None
    body = data[:SEQS_SIZE - _CRC.size]
    if data[SEQS_SIZE - _CRC.size:SEQS_SIZE] != _crc(body):
        return None, None
    n = 1 + _SEQ_ENTRY.size
    at = len(_SEQ_MAGIC)
    return _unpack_entry(body[at:at + n]), _unpack_entry(body[at + n:at + 2 * n])


def seqs_for(meta: Meta, stored: tuple[Seqs | None, Seqs | None]) -> Seqs:
    """The sequence numbers of ``meta``'s positions: from the roles file if it stored this
    meta (a meta store interrupted after the roles file was written leaves the previous
    meta in place: ``prev`` matches it), else a new count that starts at 0 at the read
    position (the meta was written by something that keeps no sequence numbers)."""
    for s in stored:
        if s is not None and s.meta == meta:
            return s
    return Seqs(meta, 0, meta.depth)


def read_seqs(fd: int) -> tuple[Seqs | None, Seqs | None]:
    """``(prev, cur)`` of the roles file open at ``fd``."""
    return decode_seqs(os.pread(fd, SEQS_SIZE, 0))


def store_role_meta(meta_path: str, fd: int, read: tuple[int, int] | None, seq_r: int,
                    write: tuple[int, int] | None, seq_w: int, *, mode: int = FILE_MODE) -> Seqs:
    """Store the meta at ``meta_path`` with the meta writers' lock held (``fd``: the roles
    file, see :func:`meta_lock`). A half given as None is taken from the meta stored last
    (the other role's); so is a write half older than the stored one. The roles file is
    written first and keeps the previous meta's numbers, so a store cut short leaves
    numbers that match the meta on disk.

    Raises FileNotFoundError if a half is to come from a meta file that is not there,
    OSError if the files cannot be written.
    """
    on_disk = load_meta(meta_path)
    last = seqs_for(on_disk, read_seqs(fd)) if on_disk is not None else None
    if last is None and (read is None or write is None):
        raise FileNotFoundError(errno.ENOENT, "meta file missing", meta_path)
    if read is None:
        assert last is not None
        read, seq_r = last.meta.read, last.seq_r
    if write is None or (last is not None and last.seq_w > seq_w):
        assert last is not None
        write, seq_w = last.meta.write, last.seq_w
    cur = Seqs(Meta(max(0, seq_w - seq_r), *read, *write), seq_r, seq_w)
    os.pwrite(fd, encode_seqs(last, cur), 0)
    store_meta(meta_path, cur.meta, mode=mode)
    return cur


def holder_pid(path: str) -> int | None:
    """Pid of the live process holding the role file or lock file at ``path`` with
    flock, else None. Creates nothing; -1 if held but no pid is known."""
    if not held_exclusively(path):
        return None
    try:
        fd = read_fd(path)
    except FileNotFoundError:  # released and removed since the probe
        return None
    try:
        rec = read_record(fd)
    finally:
        os.close(fd)
    return rec.pid if rec is not None and rec.pid else -1


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def live_record(path: str) -> RoleRecord | None:
    """The record of the role file at ``path`` if its writer holds the role now: the
    role's flock is held, the record says live, and its process runs (a record left by
    a killed holder says live too, while a new holder may not have written its own yet)."""
    if holder_pid(path) is None:
        return None
    rec = read_record_at(path)
    if rec is None or not rec.live or not _pid_alive(rec.pid):
        return None
    return rec


def published_record(path: str) -> RoleRecord | None:
    """:func:`live_record` for tools that read beside live roles: the record first, and
    the flock probe only when the record says live and its process runs. A held role
    fails the probe (nobody else can take it then); a free role whose record says dead
    is never probed, so a role being opened is not made to fail in that case. (A role
    closed by a process that still runs leaves ``live`` set: the probe tells, briefly.)"""
    rec = read_record_at(path)
    if rec is None or not rec.live or not _pid_alive(rec.pid):
        return None
    if holder_pid(path) is None:
        return None
    return rec


@contextmanager
def meta_lock(path: str, mode: int = FILE_MODE) -> Iterator[int]:
    """Hold the meta writers' lock (``NAME.diskqueue.roles``, created with ``mode``);
    yields its descriptor, whose bytes are the roles file (see :func:`decode_seqs`)."""
    fd = open_file(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # drops the flock
