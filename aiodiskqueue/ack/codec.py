"""Byte layouts of the reliable-delivery layer: nsqd's message and the ack log's records.

Pure functions on bytes, no I/O.

nsqd's message layout (:mod:`aiodiskqueue._format.nsq`) is the payload of a data
record with ``format="nsq"`` and sits inside every ack log entry.

Ack log records are framed as ``4-byte BE length | 4-byte BE crc32 | payload``;
the payload starts with one kind byte:

* ``E`` entry: key, fetch_seq, due_ns, then the nsqd message (its attempts field
  is the number of deliveries so far). ``due_ns == 0`` means "deliver at once".
* ``U`` update: key, due_ns, attempts (a requeue, or a delivery of a stored entry).
* ``D`` done: key, fetch_seq (finished or dead-lettered; ``fetch_seq`` is non-zero
  when the entry itself was never written, see :mod:`aiodiskqueue.ack.journal`).
* ``H`` head: highest fetch_seq, the last commit's fetch_seq and data queue read
  position, next key. Written at every commit and at the start of every segment.
"""

from __future__ import annotations

import struct
import time
import zlib

from .._format import nsq
from .._format.nsq import MAX_ATTEMPTS

FRAME = struct.Struct(">II")
ENTRY = struct.Struct(">cQQq")
UPDATE = struct.Struct(">cQqH")
DONE = struct.Struct(">cQQ")
HEAD = struct.Struct(">cQQQQQ")
SEQ = struct.Struct(">QQ")  # key, fetch_seq right after the kind byte of E and D

KIND_ENTRY = ord("E")
KIND_UPDATE = ord("U")
KIND_DONE = ord("D")
KIND_HEAD = ord("H")


def frame(payload: bytes) -> bytes:
    """Frame one ack log record: length, crc32, payload."""
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def entry_record(key: int, fetch_seq: int, due_ns: int, timestamp: int, attempts: int,
                 msg_id: bytes, body: bytes) -> bytes:
    """The payload of an ``E`` record."""
    return ENTRY.pack(b"E", key, fetch_seq, due_ns) + nsq.encode(timestamp, attempts, msg_id, body)


def update_record(key: int, due_ns: int, attempts: int) -> bytes:
    """The payload of a ``U`` record."""
    return UPDATE.pack(b"U", key, due_ns, min(attempts, MAX_ATTEMPTS))


def done_record(key: int, fetch_seq: int) -> bytes:
    """The payload of a ``D`` record."""
    return DONE.pack(b"D", key, fetch_seq)


def head_record(fetch_seq: int, commit_seq: int, commit_file: int, commit_pos: int,
                next_key: int) -> bytes:
    """The payload of an ``H`` record."""
    return HEAD.pack(b"H", fetch_seq, commit_seq, commit_file, commit_pos, next_key)


def rewrite_entry(payload: bytes, due_ns: int, attempts: int) -> bytes:
    """An ``E`` payload with a new due time and attempts count (for compaction)."""
    _, key, fetch_seq, _ = ENTRY.unpack_from(payload)
    ts, _, msg_id = nsq.HEADER.unpack_from(payload, ENTRY.size)
    return (ENTRY.pack(b"E", key, fetch_seq, due_ns)
            + nsq.encode(ts, attempts, msg_id, payload[ENTRY.size + nsq.HEADER_SIZE:]))


class IdGenerator:
    """Message ids: 16 lower-case hex characters, increasing, unique within a queue.

    The number is the wall-clock millisecond shifted left by 16 bits plus a
    counter, never lower than the previous id: 65,536 ids per millisecond before
    it runs ahead of the clock, so a reopened queue does not reuse ids.
    """

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> bytes:
        """Return a new id as 16 ASCII bytes."""
        n = self._last + 1
        ms = (time.time_ns() // 1_000_000) << 16
        if ms > n:
            n = ms
        self._last = n
        return b"%016x" % n
