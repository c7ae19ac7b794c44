"""LazyHeap: stale items skipped, trimmed in bulk, ties in insertion order."""

from __future__ import annotations

from aiodiskqueue.ack.heap import LazyHeap


class Item:
    def __init__(self, name: str) -> None:
        self.name = name
        self.gen = 0


def make() -> LazyHeap[Item]:
    return LazyHeap(lambda item, tag: item.gen == tag)


def test_earliest_valid_first_and_stale_skipped() -> None:
    h = make()
    a, b, c = Item("a"), Item("b"), Item("c")
    h.push(3.0, a, 0)
    h.push(1.0, b, 0)
    h.push(2.0, c, 0)
    b.gen += 1  # b moved on: its item is stale
    assert h.first() == 2.0
    assert [i.name for i in h.pop_due(2.5)] == ["c"]
    h.push(2.0, b, b.gen)
    assert [i.name for i in h.pop_due(10.0)] == ["b", "a"]
    assert h.first() is None and len(h) == 0


def test_ties_keep_insertion_order() -> None:
    h = make()
    items = [Item(str(i)) for i in range(5)]
    for it in items:
        h.push(1.0, it, 0)
    assert [i.name for i in h.pop_due(1.0)] == ["0", "1", "2", "3", "4"]


def test_trim_drops_stale_items_once_they_dominate() -> None:
    h = make()
    it = Item("x")
    for _ in range(3000):
        it.gen += 1
        h.push(float(it.gen), it, it.gen)
    assert len(h) == 3000
    h.trim(live=1)
    assert len(h) == 1
    assert h.first() == 3000.0
    h.trim(live=1)  # nothing stale: nothing dropped
    assert len(h) == 1
