"""A min-heap of timed items that go stale: the in-flight deadlines and the due times.

Removing an item from the middle of a heap costs O(n); instead an item carries
a tag (a generation number) and is *stale* once its owner moved on (finished,
touched, requeued). Stale items are skipped when they reach the top, and
dropped all at once when they outnumber the live ones, so the heap stays
O(live) in size and every operation O(log n) amortised.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_SLACK = 1024


class LazyHeap(Generic[T]):
    """Items ordered by ``when``; ``valid(item, tag)`` tells whether one still counts."""

    def __init__(self, valid: Callable[[T, int], bool]) -> None:
        self._valid = valid
        self._heap: list[tuple[float, int, T, int]] = []
        self._order = itertools.count()  # ties keep insertion order, never compare items

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, when: float, item: T, tag: int) -> None:
        """Add ``item``, due at ``when``, valid while its tag is ``tag``."""
        heapq.heappush(self._heap, (when, next(self._order), item, tag))

    def first(self) -> float | None:
        """When the earliest valid item is due, or None (stale tops are dropped)."""
        h = self._heap
        while h and not self._valid(h[0][2], h[0][3]):
            heapq.heappop(h)
        return h[0][0] if h else None

    def pop_due(self, now: float) -> list[T]:
        """Remove and return the valid items due at ``now`` or earlier, earliest first."""
        h, valid, out = self._heap, self._valid, []
        while h and h[0][0] <= now:
            _, _, item, tag = heapq.heappop(h)
            if valid(item, tag):
                out.append(item)
        return out

    def trim(self, live: int) -> None:
        """Drop every stale item once there are more than twice ``live`` items (plus slack)."""
        if len(self._heap) > 2 * live + _SLACK:
            self._heap = [x for x in self._heap if self._valid(x[2], x[3])]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        """Forget every item."""
        self._heap.clear()
