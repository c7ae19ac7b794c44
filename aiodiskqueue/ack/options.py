"""Validated options of an :class:`~aiodiskqueue.AckQueue`, and its statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .._core.options import Options, Statistics, as_bytes, integer, number
from .._format.nsq import HEADER_SIZE as NSQ_MIN_SIZE

__all__ = ["ACK_DEFAULTS", "AckDefaults", "AckOptions", "AckStatistics", "as_bytes", "integer",
           "number"]


@dataclass(frozen=True, slots=True)
class AckDefaults:
    """The reliable-delivery defaults: nsqd's (60 s message timeout, touch up to 15 min,
    requeue and deferred-publish delays up to 1 h)."""

    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_delay: float = 3600.0
    max_in_flight: int = 1000
    max_attempts: int = 0
    log_segment_bytes: int = 8 * 2**20


ACK_DEFAULTS: Final = AckDefaults()
"""Every reliable-delivery default: the one place AckQueue and the broker read them."""

@dataclass(frozen=True, slots=True)
class AckOptions:
    """The reliable-delivery options; the data queue's own are in ``core``."""

    msg_timeout: float
    max_msg_timeout: float
    max_delay: float
    max_in_flight: int
    max_attempts: int
    format: str
    log_segment_bytes: int
    core: Options

    @classmethod
    def check(cls, *, msg_timeout: object, max_msg_timeout: object, max_delay: object,
              max_in_flight: object, max_attempts: object, format: object,
              log_segment_bytes: object, **core: Any) -> AckOptions:
        """Validate every option at once.

        Raises TypeError or ValueError naming the bad value.
        """
        timeout = number("msg_timeout", msg_timeout, positive=True)
        max_timeout = number("max_msg_timeout", max_msg_timeout, positive=True)
        if max_timeout < timeout:
            raise ValueError(f"max_msg_timeout must be >= msg_timeout, got {max_msg_timeout} "
                             f"< {msg_timeout}")
        if format not in ("raw", "nsq"):
            raise ValueError(f"format must be 'raw' or 'nsq', got {format!r}")
        opts = Options(**core)
        if format == "nsq" and opts.max_msg_size < NSQ_MIN_SIZE:
            raise ValueError(f"max_msg_size must be >= {NSQ_MIN_SIZE} with format='nsq', "
                             f"got {opts.max_msg_size}")
        return cls(
            msg_timeout=timeout,
            max_msg_timeout=max_timeout,
            max_delay=number("max_delay", max_delay, positive=False),
            max_in_flight=integer("max_in_flight", max_in_flight, 1),
            max_attempts=integer("max_attempts", max_attempts, 0, 0xFFFF - 1),
            format=format,
            log_segment_bytes=integer("log_segment_bytes", log_segment_bytes, 4096),
            core=opts,
        )

    @property
    def nsq(self) -> bool:
        """True for ``format="nsq"``."""
        return self.format == "nsq"

    @property
    def log_reserve_bytes(self) -> int:
        """Blocks the ack log keeps allocated past its end, so that draining a full disk
        can append its records until the first consumed data segment is deleted: 1/32
        of a data segment (about the ``D`` records of a segment of 1 KiB messages), at
        least 64 KiB, at most 4 MiB, never more than a log segment."""
        share = self.core.max_bytes_per_file // 32
        return min(self.log_segment_bytes, max(64 * 1024, min(4 * 2**20, share)))

    @property
    def min_size(self) -> int:
        """Smallest payload: nsqd's 26-byte header at least with ``format="nsq"``."""
        m = self.core.min_msg_size
        return max(m, NSQ_MIN_SIZE) if self.nsq else m


@dataclass(frozen=True, slots=True)
class AckStatistics:
    """A snapshot of an :class:`AckQueue`: plain numbers, plus the data queue's figures."""

    depth: int
    """Messages ready to deliver: the data queue's depth plus due entries of the log."""
    in_flight: int
    deferred: int
    """Messages waiting for their due time (put with a delay, or requeued with one)."""
    finished: int
    """Successful ``finish()`` calls since open."""
    requeued: int
    """Explicit ``requeue()`` calls since open."""
    timed_out: int
    """Automatic requeues of messages whose deadline passed."""
    dead_lettered: int
    delivered: int
    commits: int
    """Commits: log written and fsynced, then the data queue's position stored."""
    log_syncs: int
    """fsyncs of the ack log (every commit has one)."""
    log_bytes: int
    log_segments: int
    queue: Statistics
    """The data queue's own statistics."""
