"""Deadlines of an :class:`~aiodiskqueue.AckQueue`: messages in flight, deferred entries,
and the one timer that fires for the earliest of them.

Both heaps are lazy (:class:`~aiodiskqueue.ack.heap.LazyHeap`): a touch or a requeue
pushes a new item and the old one is dropped when it surfaces or when more than half
of a heap is stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from .clock import Clock, TimerHandle
from .heap import LazyHeap
from .journal import ENTRY_DEFERRED, Entry, EntryState
from .message import DELIVERY_IN_FLIGHT, Message


@final
class InFlight:
    """The in-flight messages by key, the deadline and due-time heaps, and the timer.

    ``on_timeout(entry)`` is called for the entry of each message whose deadline passed
    (the message is already out of :attr:`messages` and marked timed out),
    ``on_due(entry)`` for each deferred entry whose time has come; both only while
    ``is_open()``.
    """

    def __init__(self, clock: Clock, *, on_timeout: Callable[[Entry], None],
                 on_due: Callable[[Entry], None], is_open: Callable[[], bool]) -> None:
        self.messages: dict[int, Message] = {}
        self.n_deferred = 0
        self._clock = clock
        self._on_timeout = on_timeout
        self._on_due = on_due
        self._is_open = is_open
        self._deadlines: LazyHeap[Message] = LazyHeap(
            lambda m, gen: m._state is DELIVERY_IN_FLIGHT and m._gen == gen)
        self._dues: LazyHeap[Entry] = LazyHeap(
            lambda e, ver: e.state is ENTRY_DEFERRED and e.ver == ver)
        self._timer: TimerHandle | None = None
        self._timer_when: float | None = None
        self._stopped = False

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, m: Message) -> None:
        """A new delivery: in flight until its deadline."""
        self.messages[m._entry.key] = m
        self._deadlines.push(m._deadline, m, 0)
        if self._timer_when is None or m._deadline < self._timer_when:
            self.arm()

    def add_batch(self, ms: list[Message], deadline: float) -> None:
        """New deliveries that share one ``deadline``: :meth:`add` for each, one timer check."""
        if not ms:
            return
        messages, push = self.messages, self._deadlines.push
        for m in ms:
            messages[m._entry.key] = m
            push(deadline, m, 0)
        if self._timer_when is None or deadline < self._timer_when:
            self.arm()

    def remove(self, m: Message) -> None:
        """A delivery that ended (finished, requeued, dead-lettered)."""
        del self.messages[m._entry.key]
        self._deadlines.trim(len(self.messages))

    def touch(self, m: Message, now: float, max_msg_timeout: float) -> None:
        """Move ``m``'s deadline to now + its timeout, capped at delivery + ``max_msg_timeout``."""
        gen = m._move_deadline(now, max_msg_timeout)
        if gen is not None:
            deadline = m.deadline
            self._deadlines.push(deadline, m, gen)
            self._deadlines.trim(len(self.messages))
            if self._timer_when is None or deadline < self._timer_when:
                self.arm()

    def defer(self, e: Entry, when: float) -> None:
        """``e`` waits until ``when`` on the clock's monotonic time (call :meth:`arm` after)."""
        e.state = EntryState.DEFERRED
        e.ver += 1
        self.n_deferred += 1
        self._dues.push(when, e, e.ver)

    def undefer(self, e: Entry) -> None:
        """A deferred entry that left without coming due (its log record was lost)."""
        self.n_deferred -= 1

    def clear_deferred(self) -> None:
        """Forget every deferred entry (a purge)."""
        self._dues.clear()
        self.n_deferred = 0
        self.arm()

    def arm(self) -> None:
        """Arm the one timer for the earliest deadline or due time."""
        when = self._deadlines.first()
        due = self._dues.first()
        if due is not None and (when is None or due < when):
            when = due
        if when == self._timer_when:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_when = when
        if when is not None and not self._stopped:
            self._timer = self._clock.call_at(when, self._fire)

    def stop(self) -> None:
        """Cancel the timer for good (the queue is closing)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self._timer_when = None
        if not self._is_open():
            return
        now = self._clock.monotonic()
        for m in self._deadlines.pop_due(now):
            m._time_out()
            e = m._entry
            del self.messages[e.key]
            self._on_timeout(e)
        for e in self._dues.pop_due(now):
            self.n_deferred -= 1
            self._on_due(e)
        self._dues.trim(self.n_deferred)
        self.arm()
