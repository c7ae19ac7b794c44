"""Clocks for the reliable-delivery layer: the event loop's, and a manual one for tests.

Deadlines and due times are kept in the clock's monotonic seconds; due times
are stored on disk as wall-clock nanoseconds so that they survive a restart.
One timer at a time is armed through :meth:`Clock.call_at`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    """What :meth:`Clock.call_at` returns."""

    def cancel(self) -> None:
        """Stop the callback from running."""


class Clock(Protocol):
    """Time source and timer used by :class:`~aiodiskqueue.AckQueue`."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""

    def time_ns(self) -> int:
        """Wall-clock time in nanoseconds since the epoch."""

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` once ``monotonic() >= when``."""


class LoopClock:
    """The running event loop's clock and timers (the default)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        """The loop's ``time()``."""
        return self._loop.time()

    def time_ns(self) -> int:
        """``time.time_ns()``."""
        return time.time_ns()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """``loop.call_at``."""
        return self._loop.call_at(when, callback)


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to; timers fire inside :meth:`advance`.

    For tests: ``clock.advance(30.0)`` runs every callback that became due, in
    order, before it returns.
    """

    def __init__(self, start: float = 1000.0, wall_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start
        self._wall0 = wall_ns - int(start * 1e9)
        self._timers: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        """The manual time in seconds."""
        return self._now

    def time_ns(self) -> int:
        """Wall-clock nanoseconds that move with the manual time."""
        return self._wall0 + int(self._now * 1e9)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Remember ``callback`` until :meth:`advance` reaches ``when``."""
        h = _ManualHandle()
        heapq.heappush(self._timers, (when, next(self._seq), h, callback))
        return h

    def advance(self, seconds: float) -> None:
        """Move time forward and run the callbacks that became due.

        Raises ValueError if ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.advance_to(self._now + seconds)

    def advance_to(self, when: float) -> None:
        """Set the time to ``when`` (never backwards) and run the callbacks that became due."""
        self._now = max(self._now, when)
        while self._timers and self._timers[0][0] <= self._now:
            _, _, h, cb = heapq.heappop(self._timers)
            if not h.cancelled:
                cb()

    def next_timer(self) -> float | None:
        """When the earliest armed timer fires, or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None
