"""Validated options of an :class:`~aiodiskqueue.AckQueue`, and its statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from .._core.options import (
    DEFAULTS,
    Options,
    Statistics,
    as_bytes,
    integer,
    number,
)
from .._format.nsq import HEADER_SIZE as NSQ_MIN_SIZE

__all__ = ["ACK_DEFAULTS", "AckDefaults", "AckOptions", "AckStatistics", "as_bytes", "integer",
           "number"]


@dataclass(frozen=True, slots=True)
class AckDefaults:
    """The reliable-delivery options and their defaults: nsqd's (60 s message timeout,
    touch up to 15 min, requeue and deferred-publish delays up to 1 h). The one
    definition of each: :class:`AckOptions` checks them, the AckQueue's keyword
    parameters are its fields, the broker reads :data:`ACK_DEFAULTS`."""

    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_delay: float = 3600.0
    max_in_flight: int = 1000
    max_attempts: int = 0
    log_segment_bytes: int = 8 * 2**20


ACK_DEFAULTS: Final = AckDefaults()
"""Every reliable-delivery default: the one place AckQueue and the broker read them."""


@dataclass(frozen=True, slots=True)
class AckOptions(AckDefaults):
    """The reliable-delivery options, checked when made; the data queue's own are in
    ``core``.

    Raises TypeError or ValueError naming a bad value.
    """

    format: Literal["raw", "nsq"] = "raw"
    core: Options = DEFAULTS
    NAMES: ClassVar[frozenset[str]]
    """Every option name: these fields but ``core``, and the fields of :class:`Options`."""

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the checked values replace the given ones
        timeout = number("msg_timeout", self.msg_timeout, positive=True)
        max_timeout = number("max_msg_timeout", self.max_msg_timeout, positive=True)
        if max_timeout < timeout:
            raise ValueError(f"max_msg_timeout must be >= msg_timeout, got "
                             f"{self.max_msg_timeout} < {self.msg_timeout}")
        if self.format not in ("raw", "nsq"):
            raise ValueError(f"format must be 'raw' or 'nsq', got {self.format!r}")
        if self.format == "nsq" and self.core.max_msg_size < NSQ_MIN_SIZE:
            raise ValueError(f"max_msg_size must be >= {NSQ_MIN_SIZE} with format='nsq', "
                             f"got {self.core.max_msg_size}")
        put(self, "msg_timeout", timeout)
        put(self, "max_msg_timeout", max_timeout)
        put(self, "max_delay", number("max_delay", self.max_delay, positive=False))
        integer("max_in_flight", self.max_in_flight, 1)
        integer("max_attempts", self.max_attempts, 0, 0xFFFF - 1)
        integer("log_segment_bytes", self.log_segment_bytes, 4096)

    @classmethod
    def from_keywords(cls, owner: str, options: Mapping[str, object]) -> AckOptions:
        """The options given as keywords to ``owner``: the reliable-delivery ones here,
        the rest for the data queue (:meth:`Options.from_keywords`).

        Raises TypeError for a name that is no option, TypeError or ValueError naming
        a bad value.
        """
        ack = {k: v for k, v in options.items() if k in _ACK_NAMES}
        core = Options.from_keywords(owner, {k: v for k, v in options.items()
                                             if k not in _ACK_NAMES})
        return cls(**ack, core=core)  # type: ignore[arg-type]  # each value checked

    def keywords(self) -> dict[str, Any]:
        """Every option as keywords for an AckQueue (``AckQueue(d, n, **kw)``): a layer
        that checks its settings by making an AckOptions opens its queues with these."""
        own = {name: getattr(self, name) for name in sorted(_ACK_NAMES)}
        return {**own, **self.core.keywords()}

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

    def data_options(self, **changes: object) -> Options:
        """The options of the data or dead-letter queue: ``core`` with the payload's
        minimum size for the format, and ``changes``."""
        return dataclasses.replace(self.core, min_msg_size=self.min_size,
                                   **changes)  # type: ignore[arg-type]


_ACK_NAMES: Final = frozenset(f.name for f in dataclasses.fields(AckOptions)) - {"core"}
AckOptions.NAMES = _ACK_NAMES | Options.NAMES


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
