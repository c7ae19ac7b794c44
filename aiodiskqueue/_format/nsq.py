"""nsqd's message layout (``Message.WriteTo`` in nsqd/message.go).

The payload of every record in a queue that nsqd writes, of an AckQueue with
``format="nsq"`` and of its ack log entries, and the data of the NSQ protocol's
MESSAGE frame::

    8-byte big-endian timestamp (ns) | 2-byte big-endian attempts | 16-byte ASCII id | body

This module is the one owner of that layout; everything else calls it.
"""

from __future__ import annotations

import os
import struct
from typing import Final, NamedTuple

FIELDS: Final = "qH16s"
"""The header's struct fields without byte order, for callers that prefix a frame."""
HEADER: Final = struct.Struct(">" + FIELDS)
HEADER_SIZE: Final = HEADER.size
"""26 bytes: nsqd's ``minValidMsgLength``, the smallest valid message."""
ID_SIZE: Final = 16
MAX_ATTEMPTS: Final = 0xFFFF
"""The attempts field is a uint16; larger counts saturate."""


class NsqMessage(NamedTuple):
    """The fields of one message in nsqd's layout."""

    timestamp: int
    """Nanoseconds since the epoch."""
    attempts: int
    id: bytes
    """16 ASCII bytes (nsqd writes hex)."""
    body: bytes


def encode(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """One message in nsqd's layout; ``attempts`` saturates at 65535.

    Raises ValueError if ``msg_id`` is not 16 bytes (the struct would pad or cut it).
    """
    if len(msg_id) != ID_SIZE:
        raise ValueError(f"an nsqd message id must be {ID_SIZE} bytes, got {len(msg_id)}")
    return HEADER.pack(timestamp, min(attempts, MAX_ATTEMPTS), msg_id) + body


def decode(payload: bytes) -> NsqMessage:
    """Split a payload in nsqd's layout into its fields.

    Raises ValueError if the payload is shorter than 26 bytes.
    """
    if len(payload) < HEADER_SIZE:
        raise ValueError(f"an nsqd message needs at least {HEADER_SIZE} bytes, "
                         f"got {len(payload)}")
    ts, attempts, msg_id = HEADER.unpack_from(payload)
    return NsqMessage(ts, attempts, msg_id, payload[HEADER_SIZE:])


def new_id() -> bytes:
    """A fresh random 16-character hex message id, as nsqd's ids look."""
    return os.urandom(8).hex().encode()
