"""One delivery of an :class:`~aiodiskqueue.AckQueue` message: :class:`Message`."""

from __future__ import annotations

import enum
import logging
from types import TracebackType
from typing import Protocol, final

from ..errors import MessageNotInFlight
from .journal import Entry

log = logging.getLogger(__name__)


class DeliveryState(enum.Enum):
    """Where one delivery stands; only ``IN_FLIGHT`` accepts finish, requeue or touch."""

    IN_FLIGHT = "in flight"
    FINISHED = "already finished"
    REQUEUED = "already requeued"
    TIMED_OUT = "timed out and requeued"
    DEAD = "dead-lettered"


# The members as module constants, for the per-message paths (here and in the modules
# that import them): a member looked up through its class costs ~0.1 us on Python 3.11.
DELIVERY_IN_FLIGHT, DELIVERY_FINISHED = DeliveryState.IN_FLIGHT, DeliveryState.FINISHED


class DeliveryOwner(Protocol):
    """What a :class:`Message` needs of the queue that delivered it: ending the delivery
    (finish, requeue), moving its deadline (touch), and waiting for durability.

    Each of :meth:`finish`, :meth:`requeue` and :meth:`touch` is called only for a
    message in flight, and raises (QueueClosed, or ValueError for a bad delay) before it
    changes anything.
    """

    @property
    def waits_for_log_sync(self) -> bool:
        """True if a finish or requeue returns only once the ack log is fsynced."""

    def finish(self, m: Message, e: Entry) -> None:
        """End the delivery of ``m`` (entry ``e``): the message is done."""

    def requeue(self, m: Message, e: Entry, delay: float) -> None:
        """End the delivery of ``m`` (entry ``e``): deliver it again after ``delay``."""

    def touch(self, m: Message) -> None:
        """Push the deadline of ``m`` out (through :meth:`Message._move_deadline`)."""

    def is_open(self) -> bool:
        """True while the queue is open."""

    def backoff(self, attempts: int) -> float:
        """The requeue delay after a failed attempt."""

    async def wait_log_sync(self) -> None:
        """Wait until the ack log is fsynced with everything appended so far."""


@final
class Message:
    """One delivery of a message: finish it, requeue it or touch it while it is in flight.

    ``id`` (16 hex characters), ``body``, ``attempts`` (deliveries so far,
    including this one) and ``timestamp`` (ns since the epoch) are plain
    attributes. The timestamp is the put's with ``format="nsq"`` and for a
    deferred put; a raw data record carries none, so its id and timestamp are
    given when it is first taken out of the data queue (and kept from then on,
    once the ack log holds it).

    ``async with msg:`` finishes the message when the block succeeds. When the
    block raises an ``Exception`` the message is requeued with a backoff delay
    (:meth:`AckQueue.backoff`), the failure is logged, and the exception
    propagates: a handler's bug is never hidden. A worker loop that should go on
    after a failed message catches it around the block (see the README).
    Cancellation and other ``BaseException`` requeue at once, without delay,
    and propagate too.
    """

    __slots__ = (
        "_deadline",
        "_delivered_at",
        "_entry",
        "_gen",
        "_owner",
        "_state",
        "_timeout",
        "attempts",
        "body",
        "id",
        "timestamp",
    )

    def __init__(self, owner: DeliveryOwner, entry: Entry, now: float, timeout: float) -> None:
        self.id: str = entry.msg_id.decode("latin-1")
        self.body: bytes = entry.body or b""
        self.attempts: int = entry.attempts
        self.timestamp: int = entry.timestamp
        self._owner = owner
        self._entry = entry
        self._state = DELIVERY_IN_FLIGHT
        self._delivered_at = now
        self._timeout = timeout
        self._deadline = now + timeout
        self._gen = 0

    @property
    def in_flight(self) -> bool:
        """True until the message is finished, requeued or timed out."""
        return self._state is DELIVERY_IN_FLIGHT

    @property
    def deadline(self) -> float:
        """When the message times out, on the queue's clock (``Clock.monotonic``)."""
        return self._deadline

    async def finish(self) -> None:
        """NSQ FIN: the message is done and never delivered again.

        With ``sync_every=1`` returns once this is durable; otherwise it is
        durable at the next commit (and written to the OS by a hop within a few
        milliseconds: see :data:`aiodiskqueue.ack.pump.LINGER`).

        Raises MessageNotInFlight if the message is not in flight any more,
        QueueClosed if the queue was closed, DiskQueueError if the commit fails.
        """
        self._end(DELIVERY_FINISHED, None)
        owner = self._owner
        if owner.waits_for_log_sync:
            await owner.wait_log_sync()

    async def requeue(self, delay: float = 0.0) -> None:
        """NSQ REQ: put the message back, to be delivered again after ``delay`` seconds.

        Attempts are kept. With ``sync_every=1`` returns once this is durable.

        Raises ValueError if ``delay`` is negative or above ``max_delay``,
        MessageNotInFlight if the message is not in flight any more, QueueClosed
        if the queue was closed.
        """
        self._end(DeliveryState.REQUEUED, delay)
        owner = self._owner
        if owner.waits_for_log_sync:
            await owner.wait_log_sync()

    async def touch(self) -> None:
        """NSQ TOUCH: push the deadline out by the delivery's ``msg_timeout``.

        The new deadline is now + ``msg_timeout``, capped at the delivery time +
        ``max_msg_timeout``, as in nsqd.

        Raises MessageNotInFlight if the message is not in flight any more,
        QueueClosed if the queue was closed.
        """
        if self._state is not DELIVERY_IN_FLIGHT:
            raise MessageNotInFlight(self.id, self._state.value)
        self._owner.touch(self)

    def _end(self, state: DeliveryState, delay: float | None) -> None:
        """Finish (``delay`` None) or requeue the delivery: the state moves first, so the
        owner's bookkeeping sees it ended, and back if the owner refuses."""
        if self._state is not DELIVERY_IN_FLIGHT:
            raise MessageNotInFlight(self.id, self._state.value)
        self._state = state
        try:
            if delay is None:
                self._owner.finish(self, self._entry)
            else:
                self._owner.requeue(self, self._entry, delay)
        except BaseException:
            self._state = DELIVERY_IN_FLIGHT
            raise

    # ------------------------------------------------------------------ for the ack layer
    # The delivery's own state changes, called by the owner's deadline bookkeeping
    # (:class:`~aiodiskqueue.ack.inflight.InFlight`).

    def _time_out(self) -> None:
        """The deadline passed: the delivery ends (the owner requeues the message)."""
        self._state = DeliveryState.TIMED_OUT

    def _move_deadline(self, now: float, max_msg_timeout: float) -> int | None:
        """Move the deadline to now + the delivery's timeout, capped at the delivery time +
        ``max_msg_timeout``; return the deadline's new generation, or None if unchanged."""
        deadline = min(now + self._timeout, self._delivered_at + max_msg_timeout)
        if deadline == self._deadline:
            return None
        self._deadline = deadline
        self._gen += 1
        return self._gen

    async def __aenter__(self) -> Message:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        failed = exc_type is not None and issubclass(exc_type, Exception)
        if failed:
            log.warning("message %s (attempt %d) failed; requeued", self.id, self.attempts,
                        exc_info=(exc_type, exc, tb))  # type: ignore[arg-type]
        if self._state is not DELIVERY_IN_FLIGHT or not self._owner.is_open():
            if self._state is DeliveryState.TIMED_OUT:
                log.warning("message %s timed out before its handler ended; it was "
                            "requeued and may be delivered again", self.id)
            return
        if exc_type is None:
            await self.finish()
        elif failed:
            await self.requeue(self._owner.backoff(self.attempts))
        else:  # cancelled or interrupted: not the message's fault, no delay, no await
            self._end(DeliveryState.REQUEUED, 0.0)

    def __repr__(self) -> str:
        return (f"<Message {self.id} attempts={self.attempts} {self._state.value} "
                f"body={len(self.body)} bytes>")
