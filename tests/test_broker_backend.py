"""The broker's storage layer: per-client timeouts, batches, empty, and deleting a store's files."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aiodiskqueue.broker import BrokerOptions
from aiodiskqueue.broker._backend import (
    Delivery,
    Store,
    StoreStats,
    open_store,
    remove_store,
    store_files,
)

OpenStore = Callable[..., Awaitable[Store]]

WAIT = 20.0
"""Upper bound for any single wait, so that every test stops by itself."""


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Open stores in ``tmp_path`` (closing one twice is harmless); all closed at the end."""
    opened: list[Store] = []

    async def open_(name: str, **options: object) -> Store:
        s = await open_store(tmp_path, name, BrokerOptions(**options))  # type: ignore[arg-type]
        opened.append(s)
        return s

    try:
        yield open_
    finally:
        for s in opened:
            await s.aclose()


async def _use(store: Store, n: int) -> None:
    """Write and read enough to create every kind of file: segments, log, dead letters."""
    # 2n messages, n - 1 finished: several segments stay unread.
    await store.put_many([b"m%04d" % i + b"x" * 40 for i in range(2 * n)])
    await store.put(b"later", 3600.0)
    d = await asyncio.wait_for(store.get(), WAIT)
    await d.requeue(0.0)  # with max_attempts=1 its next delivery is dead-lettered
    for _ in range(n - 1):  # every other message; the requeued one is dead-lettered instead
        d = await asyncio.wait_for(store.get(), WAIT)
        await d.finish()
    await _poll(lambda: store.stats().dead_lettered == 1)


async def _poll(predicate: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not predicate():
        assert loop.time() < deadline, "condition did not hold in time"
        await asyncio.sleep(0.01)


async def test_store_files_names_every_file_an_ack_queue_writes(
    tmp_path: Path, stores: OpenStore
) -> None:
    """Fails if AckQueue starts writing a file that remove_store would leave behind."""
    opts = {"max_attempts": 1, "max_bytes_per_file": 256, "max_msg_size": 64}
    # Names that share a prefix with t:a, t:a.dead among them (a valid channel name).
    neighbours = ["t:a.b", "t:a.ack", "t:ab", "t:a.dead"]
    for name in neighbours:
        s = await stores(name, **opts)
        await _use(s, 10)
        await s.aclose()
    before = _tree(tmp_path)
    s = await stores("t:a", **opts)
    await _use(s, 10)
    await s.aclose()
    written = _tree(tmp_path) - before
    # The test really made every kind: several segments, the ack log, dead letters, meta, lock.
    assert sum(f.startswith("t:a.diskqueue.0") for f in written) > 1
    assert any(f.startswith("t:a.ack.") for f in written)
    assert any(f.startswith("t:a.dead-letters/t:a.diskqueue.") for f in written)
    assert {"t:a.diskqueue.meta.dat", "t:a.diskqueue.lock"} <= written
    listed = {os.path.relpath(p, tmp_path) for p in store_files(str(tmp_path), "t:a")}
    assert listed == written
    # No neighbour's file is claimed.
    for name in neighbours:
        assert not set(store_files(str(tmp_path), name)) & set(store_files(str(tmp_path), "t:a"))


def _tree(root: Path) -> set[str]:
    """Every file under ``root``, relative to it."""
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


async def test_remove_store_leaves_no_file_and_keeps_neighbours(
    tmp_path: Path, stores: OpenStore
) -> None:
    for name in ("t:a.b", "t:a.dead"):
        other = await stores(name)
        await other.put(b"kept " + name.encode())
        await other.aclose()
    before = set(os.listdir(tmp_path))
    s = await stores("t:a", max_attempts=1, max_bytes_per_file=256, max_msg_size=64)
    await _use(s, 10)
    assert os.path.isdir(tmp_path / "t:a.dead-letters")
    await remove_store(s, tmp_path, "t:a")
    assert store_files(str(tmp_path), "t:a") == []
    assert set(os.listdir(tmp_path)) == before
    for name in ("t:a.b", "t:a.dead"):
        other = await stores(name)
        d = await asyncio.wait_for(other.get(), WAIT)
        assert d.body == b"kept " + name.encode()
    # Opening the removed name again starts empty.
    again = await stores("t:a")
    assert again.stats() == StoreStats(0, 0, 0, 0, 0, 0, 0)


async def test_put_many_is_one_batch_all_or_nothing(stores: OpenStore) -> None:
    s = await stores("t:batch", max_msg_size=8)
    with pytest.raises(ValueError, match="size"):
        await s.put_many([b"ok", b"far too long for the limit"])
    assert s.stats().depth == 0
    await s.put_many([b"1", b"2", b"3"])
    await s.put_many([b"d1", b"d2"], 3600.0)
    st = s.stats()
    assert (st.depth, st.deferred) == (3, 2)
    got = [(await asyncio.wait_for(s.get(), WAIT)).body for _ in range(3)]
    assert got == [b"1", b"2", b"3"]


async def test_get_with_msg_timeout_takes_the_message_back(stores: OpenStore) -> None:
    """A delivery's own timeout applies, not the store's (60 s here)."""
    s = await stores("t:timeout")
    await s.put(b"job")
    d = await asyncio.wait_for(s.get(msg_timeout=0.2), WAIT)
    assert d.in_flight
    again = await asyncio.wait_for(s.get(), WAIT)  # back after 0.2 s, well within WAIT
    assert (again.body, again.id, again.attempts) == (b"job", d.id, 2)
    assert not d.in_flight
    assert s.stats().timed_out == 1


async def test_empty_drops_ready_and_deferred_keeps_in_flight(stores: OpenStore) -> None:
    s = await stores("t:empty")
    await s.put_many([b"1", b"2", b"3"])
    await s.put(b"later", 3600.0)
    d = await asyncio.wait_for(s.get(), WAIT)
    await s.empty()
    st = s.stats()
    assert (st.depth, st.deferred, st.in_flight) == (0, 0, 1)
    await d.finish()  # the caller settles in-flight ones (the channel finishes them)
    await s.put(b"after")
    assert (await asyncio.wait_for(s.get(), WAIT)).body == b"after"


async def test_get_ready_takes_up_to_limit_in_order_without_waiting(stores: OpenStore) -> None:
    s = await stores("t:ready")
    assert s.get_ready(10) == []  # nothing ready: no wait, nothing taken
    await s.put_many([b"%d" % i for i in range(5)])
    await _poll(lambda: s.stats().depth == 5)
    got: list[Delivery] = []
    while len(got) < 3:  # what is read ahead into memory may come in parts
        got += s.get_ready(3 - len(got))
        await asyncio.sleep(0.01)
    assert [d.body for d in got] == [b"0", b"1", b"2"]
    assert s.stats().in_flight == 3
    rest: list[Delivery] = []
    while len(rest) < 2:
        rest += s.get_ready(10)
        await asyncio.sleep(0.01)
    assert [d.body for d in rest] == [b"3", b"4"]
    assert s.get_ready(10) == []
    for d in got + rest:
        await d.finish()
    await _poll(lambda: s.stats().finished == 5)
