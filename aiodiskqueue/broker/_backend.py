"""The storage behind topics and channels: the library's :class:`AckQueue`.

This is the only module of the broker that knows which queue class stores the
messages. The rest of the broker sees :class:`Store` and :class:`Delivery`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from ._options import BrokerOptions


class Delivery(Protocol):
    """One message handed out by a :class:`Store`, in flight until settled."""

    @property
    def id(self) -> bytes:
        """The 16-byte ASCII id sent on the wire."""
        ...

    @property
    def body(self) -> bytes: ...

    @property
    def attempts(self) -> int:
        """Deliveries so far, this one included."""
        ...

    @property
    def timestamp(self) -> int:
        """Publication time, nanoseconds since the epoch."""
        ...

    async def finish(self) -> None:
        """Done: never delivered again. Raises StoreError if no longer in flight."""
        ...

    async def requeue(self, delay: float = 0.0) -> None:
        """Deliver again after ``delay`` seconds. Raises StoreError if no longer in flight."""
        ...

    async def touch(self) -> None:
        """Push the deadline back by the timeout. Raises StoreError if no longer in flight."""
        ...


@dataclass(frozen=True, slots=True)
class StoreStats:
    """The figures the broker reports for one store."""

    depth: int
    in_flight: int
    deferred: int
    finished: int
    requeued: int
    timed_out: int
    dead_lettered: int


class Store(Protocol):
    """A durable at-least-once queue of message bodies."""

    async def put(self, body: bytes, delay: float = 0.0) -> None:
        """Store ``body``, deliverable after ``delay`` seconds."""
        ...

    async def put_many(self, bodies: list[bytes]) -> None:
        """Store ``bodies`` in order, deliverable now."""
        ...

    async def get(self, msg_timeout: float | None = None) -> Delivery:
        """Wait for the next due message and put it in flight."""
        ...

    async def empty(self) -> None:
        """Drop every message not in flight (nsqd's channel/topic empty)."""
        ...

    def stats(self) -> StoreStats:
        """Current figures."""
        ...

    async def aclose(self) -> None:
        """Sync and close; in-flight messages are delivered again after the next open."""
        ...


class StoreError(Exception):
    """A finish, requeue or touch of a message that is no longer in flight."""


async def open_store(directory: str | os.PathLike[str], name: str, opts: BrokerOptions) -> Store:
    """Open (creating) the store ``name`` in ``directory``."""
    raise NotImplementedError("the AckQueue adapter is not wired yet")


__all__ = ["Delivery", "Store", "StoreError", "StoreStats", "open_store"]
