"""The delivery side of a protocol V2 connection: the message pump.

:class:`DeliveryPump` is the base of :class:`~._server.Connection` that takes
messages from the subscribed channel's store while the client's in-flight count
is below its ``RDY``, records them in flight and queues their frames for one
write; ``FIN``, ``REQ``, ``RDY`` and the channel's pause wake it (:meth:`wake`).
Its state is set up by the connection.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from ._backend import Delivery
from ._identify import ClientConfig
from ._output import WRITE_HIGH_WATER, ReplyWriter
from ._output import wake_future as _wake
from ._protocol import message_frame, message_frame_head
from ._tasks import cancel_and_wait

if TYPE_CHECKING:
    from ._broker import Broker
    from ._topic import Channel

_rng = random.Random()
"""Decides IDENTIFY sample_rate drops (its own instance, so tests can fix it)."""


class DeliveryPump(ReplyWriter):
    """The message pump of one subscribed connection (see the module)."""

    broker: Broker
    config: ClientConfig
    channel: Channel | None
    rdy: int
    in_flight: dict[bytes, Delivery]
    msg_timeout: float | None
    message_count: int
    _pump: asyncio.Task[None] | None
    _waiter: asyncio.Future[None] | None
    _next_prune: float
    _getting: bool

    def _start_pump(self) -> None:
        if self._pump is None and self.channel is not None and not self._closed:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _stop_pump(self) -> None:
        t, self._pump = self._pump, None
        await cancel_and_wait(t)

    async def _run_pump(self) -> None:
        ch = self.channel
        assert ch is not None
        store = ch.store
        loop = asyncio.get_running_loop()
        msg_timeout = self.msg_timeout
        timeout = self.broker.options.msg_timeout if msg_timeout is None else msg_timeout
        sample = self.config.sample_rate
        in_flight = self.in_flight
        transport = self.writer.transport
        while True:
            while len(in_flight) >= self.rdy or ch.held:
                now = loop.time()
                if now >= self._next_prune:
                    self._prune(now, timeout)
                    if len(in_flight) < self.rdy and not ch.held:
                        break
                fut = self._waiter = loop.create_future()
                timer = loop.call_later(max(0.0, self._next_prune - now), _wake, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
                    self._waiter = None
            # No await between get() returning and the message being recorded and
            # written (but for a sampled-out one, finished at once), so cancelling
            # the pump never strands a delivery: a cancelled get() takes nothing.
            if not sample:
                # Everything ready that RDY allows, recorded and queued for one write.
                batch = store.get_ready(self.rdy - len(in_flight), msg_timeout)
                if batch:
                    self.message_count += len(batch)
                    self.send_parts(_record(batch, in_flight))
                    if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                        await self._drain_if_needed()
                    continue
                d = None
            else:
                d = store.get_nowait(msg_timeout)
            if d is None:
                self._getting = True
                try:
                    d = await store.get(msg_timeout)
                finally:
                    self._getting = False
            if sample and _rng.randrange(100) >= sample:
                # IDENTIFY sample_rate: like nsqd, a message sampled out is dropped.
                await d.finish()
                continue
            in_flight[d.id] = d
            self.message_count += 1
            self.send(message_frame(d.timestamp, d.attempts, d.id, d.body))
            if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await self._drain_if_needed()

    def _prune(self, now: float, timeout: float) -> None:
        """Forget deliveries the store took back after their deadline (timed out)."""
        self._next_prune = now + min(1.0, timeout / 4)
        _forget_stale(self.in_flight)

    # ------------------------------------------------------------------ Subscriber

    def wake(self) -> None:
        """Let the pump re-check the RDY count, the in-flight count and the pause flag.

        A pump waiting in the store for the next message while the channel is
        now held (paused, emptied) is restarted, so that it waits for the
        channel instead: nothing is delivered to an idle consumer of a paused
        channel, as in nsqd.
        """
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        ch = self.channel
        if self._getting and ch is not None and ch.held and self._pump is not None:
            self._getting = False
            self._pump.cancel()  # a cancelled store get() takes nothing
            self._pump = None
            self._start_pump()

    def take_in_flight(self) -> list[Delivery]:
        """Hand over (and forget) what is in flight here: the channel is being emptied.

        The pump is not woken: the channel wakes it once the empty is done.
        """
        out = list(self.in_flight.values())
        self.in_flight.clear()
        return out


def _record(batch: list[Delivery], in_flight: dict[bytes, Delivery]) -> list[bytes]:
    """Put ``batch`` in flight in ``in_flight``; return its message frames, for one write."""
    parts: list[bytes] = []
    for d in batch:
        in_flight[d.id] = d
        body = d.body
        parts.append(message_frame_head(d.timestamp, d.attempts, d.id, len(body)))
        parts.append(body)
    return parts


def _forget_stale(in_flight: dict[bytes, Delivery]) -> None:
    """Drop the deliveries the store took back after their deadline (timed out)."""
    for k in [k for k, d in in_flight.items() if not d.in_flight]:
        del in_flight[k]


__all__ = ["DeliveryPump"]
