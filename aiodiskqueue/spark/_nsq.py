"""nsqd's message layout as the Spark source's columns (the layout itself is
:mod:`aiodiskqueue._format.nsq`)."""

from __future__ import annotations

import time

from .._format import nsq

NsqFields = tuple[str | None, int | None, int | None, bytes | None]


def decode(payload: bytes) -> NsqFields:
    """``(id, timestamp_ns, attempts, body)``; all None if ``payload`` is too short."""
    if len(payload) < nsq.HEADER_SIZE:
        return (None, None, None, None)
    ts, attempts, mid, body = nsq.decode(payload)
    return (mid.decode("ascii", "replace"), ts, attempts, body)


def encode(body: bytes, msg_id: bytes | None = None, timestamp: int | None = None,
           attempts: int = 0) -> bytes:
    """Frame ``body`` as an nsqd message (a fresh id and the current time by default).

    Raises ValueError if ``msg_id`` is not 16 bytes.
    """
    return nsq.encode(time.time_ns() if timestamp is None else timestamp, attempts,
                      nsq.new_id() if msg_id is None else msg_id, body)
