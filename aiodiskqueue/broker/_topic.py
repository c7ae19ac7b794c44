"""Topics and channels: fan-out of published messages to durable channel stores."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from ..errors import DiskQueueError
from ._backend import Delivery, Store
from ._tasks import cancel_and_wait

log = logging.getLogger(__name__)

_PUMP_BATCH = 256
"""Messages moved from a topic's queue to its channels per batch."""


class Subscriber(Protocol):
    """What a channel needs to know about a subscribed connection."""

    def stats(self) -> dict[str, Any]:
        """nsqd's client stats object."""
        ...

    def take_in_flight(self) -> list[Delivery]:
        """Hand over (and forget) every message in flight to this client, without waking it."""
        ...

    def wake(self) -> None:
        """Something the delivery pump waits for changed (pause flag, in-flight count)."""
        ...

    def close(self) -> None:
        """Disconnect the client (its channel is being deleted)."""
        ...


class Channel:
    """One channel of a topic: an independent durable copy of the topic's stream."""

    def __init__(self, topic: Topic, name: str, store: Store) -> None:
        self.topic = topic
        self.name = name
        self.store = store
        self.clients: dict[int, Subscriber] = {}
        self.paused = False
        self._emptying = 0
        self.message_count = 0
        """Messages that reached the channel since the broker started (as nsqd's:
        a message delivered twice counts once)."""

    @property
    def held(self) -> bool:
        """Delivery to clients stops: the channel is paused or being emptied."""
        return self.paused or self._emptying > 0

    @property
    def ephemeral(self) -> bool:
        """A ``#ephemeral`` channel: not kept in the metadata, deleted with its last client."""
        return self.name.endswith("#ephemeral")

    @property
    def queue_name(self) -> str:
        """The store's name on disk: ``topic:channel``, as nsqd names its channel queues."""
        return f"{self.topic.name}:{self.name}"

    def stats(self) -> dict[str, Any]:
        """nsqd's channel stats object (``/stats?format=json``)."""
        s = self.store.stats()
        return {
            "channel_name": self.name,
            "depth": s.depth,
            "backend_depth": s.depth,
            "in_flight_count": s.in_flight,
            "deferred_count": s.deferred,
            "message_count": self.message_count,
            "requeue_count": s.requeued,
            "timeout_count": s.timed_out,
            "finish_count": s.finished,
            "dead_letter_count": s.dead_lettered,
            "client_count": len(self.clients),
            "clients": [c.stats() for _, c in sorted(self.clients.items())],
            "paused": self.paused,
            "e2e_processing_latency": {"count": 0, "percentiles": None},
        }

    async def empty(self) -> None:
        """Drop every message of the channel: in flight, ready and deferred (nsqd's channel empty).

        As in nsqd, the clients forget their in-flight messages (a later FIN,
        REQ or TOUCH of one gets ``E_*_FAILED``); they are finished in the
        store. Ready and deferred messages are purged from the store.
        Messages published after the call returns are kept.
        """
        # Clients take nothing new meanwhile, so what is ready now is purged
        # rather than delivered in place of what they lose.
        self._emptying += 1
        try:
            taken = [d for c in list(self.clients.values()) for d in c.take_in_flight()]
            if taken:
                results = await asyncio.gather(*(d.finish() for d in taken),
                                               return_exceptions=True)
                for r in results:
                    # One that timed out meanwhile is queued again: the purge drops it.
                    if isinstance(r, BaseException) and not isinstance(r, DiskQueueError):
                        raise r
            await self.store.empty()
        finally:
            self._emptying -= 1
            for c in list(self.clients.values()):
                c.wake()

    def set_paused(self, paused: bool) -> None:
        """Pause or resume delivery to this channel's clients."""
        self.paused = paused
        for c in self.clients.values():
            c.wake()


class Topic:
    """A topic: publishes go to every channel's store.

    While a topic has no channel, or is paused, published messages wait in the
    topic's own store (as nsqd keeps them in the topic); when a channel appears a
    pump moves them to every channel, finishing each one in the topic store
    only after all channel stores accepted it, so a crash in between
    duplicates at worst and never loses.
    """

    def __init__(self, name: str, backlog: Store) -> None:
        self.name = name
        self.backlog = backlog
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.message_count = 0
        self.message_bytes = 0
        self.deleting = False
        self._pump: asyncio.Task[None] | None = None

    @property
    def ephemeral(self) -> bool:
        """A ``#ephemeral`` topic: not kept in the metadata, deleted with its last channel."""
        return self.name.endswith("#ephemeral")

    async def publish(self, bodies: list[bytes], delay: float = 0.0) -> None:
        """Store ``bodies`` for every channel (or in the topic while it has none).

        Returns once every store accepted them (written to the OS, or fsynced
        with ``sync_every=1``).
        """
        chans = list(self.channels.values())
        if not chans or self.paused:
            await _put(self.backlog, bodies, delay)
        else:
            await _fan_out(chans, bodies, delay)
        self.message_count += len(bodies)
        self.message_bytes += sum(map(len, bodies))

    def add_channel(self, channel: Channel) -> None:
        """Register ``channel`` and start moving the topic's backlog to the channels."""
        self.channels[channel.name] = channel
        self.start_pump()

    def remove_channel(self, name: str) -> Channel | None:
        """Forget channel ``name``; stop the backlog pump when none is left."""
        ch = self.channels.pop(name, None)
        if not self.channels and self._pump is not None:
            self._pump.cancel()
            self._pump = None
        return ch

    def start_pump(self) -> None:
        """Start the backlog pump if there are channels and it is not running."""
        if self.channels and not self.paused and (self._pump is None or self._pump.done()):
            self._pump = asyncio.get_running_loop().create_task(
                self._run_pump(), name=f"topic-pump-{self.name}"
            )

    async def stop_pump(self) -> None:
        """Cancel the backlog pump and wait for it (a cancelled get loses nothing)."""
        t, self._pump = self._pump, None
        await cancel_and_wait(t)

    async def _run_pump(self) -> None:
        try:
            await self._pump_backlog()
        except DiskQueueError as exc:  # a store closed under us (shutdown) or an I/O error
            log.error("topic %s: moving queued messages to channels stopped: %s", self.name, exc)

    async def _pump_backlog(self) -> None:
        backlog = self.backlog
        while self.channels:
            batch = [await backlog.get()]
            batch += backlog.get_ready(_PUMP_BATCH - 1)
            try:
                chans = list(self.channels.values())
                if not chans:
                    for d in batch:
                        await d.requeue(0.0)
                    return
                await _fan_out(chans, [d.body for d in batch], 0.0)
            except BaseException:
                # Give them back now rather than at their deadline; if even that
                # fails the store redelivers them after msg_timeout or a restart.
                for d in batch:
                    with contextlib.suppress(DiskQueueError):
                        await asyncio.shield(d.requeue(0.0))
                raise
            for d in batch:
                await d.finish()

    def stats(self) -> dict[str, Any]:
        """nsqd's topic stats object."""
        s = self.backlog.stats()
        return {
            "topic_name": self.name,
            "channels": [self.channels[n].stats() for n in sorted(self.channels)],
            "depth": s.depth + s.deferred,
            "backend_depth": s.depth,
            "message_count": self.message_count,
            "message_bytes": self.message_bytes,
            "paused": self.paused,
            "e2e_processing_latency": {"count": 0, "percentiles": None},
        }


async def _fan_out(chans: list[Channel], bodies: list[bytes], delay: float) -> None:
    """Store ``bodies`` in every channel of ``chans``; count them as having reached it."""
    if len(chans) == 1:
        await _put(chans[0].store, bodies, delay)
    else:
        await asyncio.gather(*(_put(c.store, bodies, delay) for c in chans))
    for c in chans:
        c.message_count += len(bodies)


async def _put(store: Store, bodies: list[bytes], delay: float) -> None:
    if len(bodies) == 1:
        await store.put(bodies[0], delay)
    else:
        await store.put_many(bodies, delay)


__all__ = ["Channel", "Subscriber", "Topic"]
