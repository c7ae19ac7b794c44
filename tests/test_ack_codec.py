"""The ack layer's byte layouts: log records and ids (nsqd's message: test_format_nsq)."""

from __future__ import annotations

import struct

from aiodiskqueue._format import nsq
from aiodiskqueue.ack.codec import (
    ENTRY,
    FRAME,
    IdGenerator,
    entry_record,
    frame,
    rewrite_entry,
)


def test_entry_rewrite_keeps_everything_but_due_and_attempts() -> None:
    p = entry_record(7, 3, 123, 456, 2, b"fedcba9876543210", b"payload")
    q = rewrite_entry(p, 999, 5)
    assert ENTRY.unpack_from(q) == (b"E", 7, 3, 999)
    assert nsq.decode(q[ENTRY.size:]) == (456, 5, b"fedcba9876543210", b"payload")


def test_frame_has_length_and_crc() -> None:
    f = frame(b"abc")
    n, crc = FRAME.unpack_from(f)
    assert (n, f[8:]) == (3, b"abc")
    assert crc == struct.unpack(">I", bytes.fromhex("352441c2"))[0]  # crc32(b"abc")


def test_ids_increase_and_are_hex() -> None:
    gen = IdGenerator()
    ids = [gen.next() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(len(i) == 16 for i in ids[:100])
    int(ids[0], 16)
