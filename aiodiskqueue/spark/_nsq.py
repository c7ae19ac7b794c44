"""nsqd's on-disk message layout, the payload of a queue written by nsqd.

``timestamp`` int64 big-endian (nanoseconds since the epoch), ``attempts``
uint16 big-endian, a 16-byte ASCII ``id``, then the body.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Final

NSQ_HEADER: Final = struct.Struct(">qH16s")
NSQ_HEADER_SIZE: Final = NSQ_HEADER.size  # 26

NsqFields = tuple[str | None, int | None, int | None, bytes | None]


def decode(payload: bytes) -> NsqFields:
    """``(id, timestamp_ns, attempts, body)``; all None if ``payload`` is too short."""
    if len(payload) < NSQ_HEADER_SIZE:
        return (None, None, None, None)
    ts, attempts, mid = NSQ_HEADER.unpack_from(payload, 0)
    return (mid.decode("ascii", "replace"), ts, attempts, payload[NSQ_HEADER_SIZE:])


def new_id() -> bytes:
    """A fresh 16-character hex message id, as nsqd's ids look."""
    return os.urandom(8).hex().encode()


def encode(body: bytes, msg_id: bytes | None = None, timestamp: int | None = None,
           attempts: int = 0) -> bytes:
    """Frame ``body`` as an nsqd message.

    Raises ValueError if ``msg_id`` is not 16 bytes.
    """
    mid = new_id() if msg_id is None else msg_id
    if len(mid) != 16:
        raise ValueError(f"nsq message id must be 16 bytes, got {len(mid)}")
    ts = time.time_ns() if timestamp is None else timestamp
    return NSQ_HEADER.pack(ts, attempts, mid) + body
