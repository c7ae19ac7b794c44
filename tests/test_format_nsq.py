"""nsqd's message layout, the one codec the ack layer, the broker, Spark and the tools use."""

from __future__ import annotations

import pytest

from aiodiskqueue._format import nsq
from aiodiskqueue.broker._protocol import FRAME_MESSAGE, message_frame


def test_layout_matches_nsqd_write_to() -> None:
    rec = nsq.encode(0x0102030405060708, 0x090A, b"0123456789abcdef", b"body")
    # 8-byte BE timestamp, 2-byte BE attempts, 16-byte id, body.
    assert rec == bytes(range(1, 11)) + b"0123456789abcdef" + b"body"
    assert nsq.decode(rec) == (0x0102030405060708, 0x090A, b"0123456789abcdef", b"body")


def test_minimum_size_is_nsqds_min_valid_msg_length() -> None:
    assert nsq.HEADER_SIZE == 26
    assert nsq.decode(b"\0" * 26) == (0, 0, b"\0" * 16, b"")
    with pytest.raises(ValueError, match="at least 26 bytes, got 25"):
        nsq.decode(b"\0" * 25)


def test_attempts_saturate_at_uint16() -> None:
    assert nsq.decode(nsq.encode(1, 70_000, b"x" * 16, b"")).attempts == 0xFFFF


@pytest.mark.parametrize("msg_id", [b"", b"x" * 15, b"x" * 17], ids=["0", "15", "17"])
def test_id_must_be_16_bytes(msg_id: bytes) -> None:
    with pytest.raises(ValueError, match=f"must be 16 bytes, got {len(msg_id)}"):
        nsq.encode(0, 0, msg_id, b"")


def test_new_ids_are_16_hex_characters_and_differ() -> None:
    ids = {nsq.new_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


def test_protocol_message_frame_carries_the_same_layout() -> None:
    frame = message_frame(123, 4, b"0123456789abcdef", b"hi")
    size, ftype = int.from_bytes(frame[:4], "big"), int.from_bytes(frame[4:8], "big")
    assert (size, ftype) == (len(frame) - 4, FRAME_MESSAGE)
    assert frame[8:] == nsq.encode(123, 4, b"0123456789abcdef", b"hi")
