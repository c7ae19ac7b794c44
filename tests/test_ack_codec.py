"""The ack layer's byte layouts: nsqd's message, log records, ids."""

from __future__ import annotations

import struct

import pytest

from aiodiskqueue.ack.codec import (
    ENTRY,
    FRAME,
    IdGenerator,
    decode_nsq,
    encode_nsq,
    entry_record,
    frame,
    rewrite_entry,
)


def test_nsq_layout_matches_nsqd_write_to() -> None:
    rec = encode_nsq(0x0102030405060708, 0x090A, b"0123456789abcdef", b"body")
    # 8-byte BE timestamp, 2-byte BE attempts, 16-byte id, body.
    assert rec == bytes(range(1, 11)) + b"0123456789abcdef" + b"body"
    assert decode_nsq(rec) == (0x0102030405060708, 0x090A, b"0123456789abcdef", b"body")


def test_nsq_minimum_size() -> None:
    assert decode_nsq(b"\0" * 26) == (0, 0, b"\0" * 16, b"")
    with pytest.raises(ValueError, match="at least 26 bytes, got 25"):
        decode_nsq(b"\0" * 25)


def test_attempts_saturate_at_uint16() -> None:
    _, attempts, _, _ = decode_nsq(encode_nsq(1, 70_000, b"x" * 16, b""))
    assert attempts == 0xFFFF


def test_entry_rewrite_keeps_everything_but_due_and_attempts() -> None:
    p = entry_record(7, 3, 123, 456, 2, b"fedcba9876543210", b"payload")
    q = rewrite_entry(p, 999, 5)
    assert ENTRY.unpack_from(q) == (b"E", 7, 3, 999)
    assert decode_nsq(q[ENTRY.size:]) == (456, 5, b"fedcba9876543210", b"payload")


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
