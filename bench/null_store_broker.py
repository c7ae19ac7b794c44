"""The broker with a store that does nothing durable: the floor of ``bench_broker.py``'s rows.

``python bench/null_store_broker.py ARGS`` runs ``python -m aiodiskqueue.broker ARGS``
with every topic and channel kept by :class:`NullStore`: an in-memory count of
messages, no files, no ack log, no I/O thread. Whatever CPU the broker spends per
message then is its protocol, its event loop and the sockets: what no work on the
queue can take away. ``bench_broker.py --null-store`` adds its pynsq rows.

A benchmark device, not a store: it keeps no bodies (it hands out the last body
put, as many times as messages were put), delivery never times out, and a requeue
only counts the message again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from typing import Any

from aiodiskqueue.broker import __main__ as broker_main
from aiodiskqueue.broker import _broker
from aiodiskqueue.broker._backend import Delivery, StoreStats
from aiodiskqueue.broker._options import BrokerOptions

_ids = itertools.count(1)


class NullDelivery:
    """A delivery that is in flight until finished or requeued."""

    __slots__ = ("_store", "attempts", "body", "id", "in_flight", "timestamp")

    def __init__(self, store: NullStore, body: bytes) -> None:
        self._store = store
        self.id = b"%016x" % next(_ids)
        self.body = body
        self.attempts = 1
        self.timestamp = time.time_ns()
        self.in_flight = True

    async def finish(self) -> None:
        """Done."""
        self.in_flight = False
        self._store.finished += 1

    async def requeue(self, delay: float = 0.0) -> None:
        """Counted as ready again (``delay`` is ignored)."""
        self.in_flight = False
        self._store.add(1, self.body)

    async def touch(self) -> None:
        """Nothing to push back: deliveries never time out here."""


class NullStore:
    """The broker's Store protocol over a count of ready messages."""

    def __init__(self) -> None:
        self.ready = 0
        self.finished = 0
        self._body = b""
        self._event = asyncio.Event()

    def add(self, n: int, body: bytes) -> None:
        """``n`` more messages ready, all with ``body``."""
        self.ready += n
        self._body = body
        self._event.set()

    async def put(self, body: bytes, delay: float = 0.0) -> None:
        """Count one message."""
        self.add(1, body)

    async def put_many(self, bodies: list[bytes], delay: float = 0.0) -> None:
        """Count ``len(bodies)`` messages."""
        if bodies:
            self.add(len(bodies), bodies[-1])

    async def get(self, msg_timeout: float | None = None) -> Delivery:
        """Wait for a message."""
        while not self.ready:
            self._event.clear()
            await self._event.wait()
        return self._take(1)[0]

    def get_nowait(self, msg_timeout: float | None = None) -> Delivery | None:
        """A message if one is counted."""
        return self._take(1)[0] if self.ready else None

    def get_ready(self, limit: int, msg_timeout: float | None = None) -> list[Delivery]:
        """Up to ``limit`` messages."""
        return self._take(max(0, min(limit, self.ready)))

    def _take(self, n: int) -> list[Delivery]:
        self.ready -= n
        return [NullDelivery(self, self._body) for _ in range(n)]

    async def empty(self) -> None:
        """Forget what is ready."""
        self.ready = 0

    def stats(self) -> StoreStats:
        """The counts."""
        return StoreStats(depth=self.ready, in_flight=0, deferred=0, finished=self.finished,
                          requeued=0, timed_out=0, dead_lettered=0)

    async def aclose(self) -> None:
        """Nothing to close."""


async def open_null_store(directory: str | os.PathLike[str], name: str, opts: BrokerOptions,
                          **_: Any) -> NullStore:
    """Stands in for the broker's ``open_store``."""
    return NullStore()


def main() -> int:
    """Run the broker's command line with null stores."""
    setattr(_broker, "open_store", open_null_store)  # noqa: B010 - the one store opener
    return broker_main.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
