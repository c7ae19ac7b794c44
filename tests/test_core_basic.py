"""Basic API of DiskQueue: put/get and friends, sizes, maxsize, statistics, repr."""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import MakeQueue
from helpers_format import layout, read_meta, read_queue, seg_name

from aiodiskqueue import DiskQueue, QueueClosed, QueueEmpty, QueueFull, Statistics


async def test_put_get_roundtrip(make_queue: MakeQueue) -> None:
    q = await make_queue()
    assert q.empty() and q.qsize() == 0 and len(q) == 0
    await q.put(b"hello")
    await q.put(bytearray(b"world"))
    await q.put(memoryview(b"!!"))
    assert q.qsize() == 3 and len(q) == 3 and not q.empty()
    assert [await q.get() for _ in range(3)] == [b"hello", b"world", b"!!"]
    assert q.empty()


async def test_get_returns_bytes_and_bytearray_is_copied(make_queue: MakeQueue) -> None:
    q = await make_queue()
    buf = bytearray(b"abc")
    q.put_nowait(buf)
    buf[0] = ord("z")  # changing the caller's buffer after the put must not matter
    got = await q.get()
    assert type(got) is bytes and got == b"abc"


async def test_put_many_get_many(make_queue: MakeQueue) -> None:
    q = await make_queue()
    msgs = [b"m%d" % i for i in range(10)]
    await q.put_many(msgs)
    assert q.qsize() == 10
    first = await q.get_many(4)
    assert first == msgs[: len(first)] and 1 <= len(first) <= 4
    rest: list[bytes] = []
    while len(first) + len(rest) < 10:
        rest += await q.get_many(100)
    assert first + rest == msgs
    await q.put_many([])  # nothing to do, returns at once
    assert q.qsize() == 0


async def test_get_many_rejects_bad_count(make_queue: MakeQueue) -> None:
    q = await make_queue()
    with pytest.raises(ValueError, match="max_items must be >= 1, got 0"):
        await q.get_many(0)


async def test_nowait_variants(make_queue: MakeQueue) -> None:
    q = await make_queue()
    with pytest.raises(QueueEmpty):
        q.get_nowait()
    q.put_nowait(b"a")
    q.put_nowait(b"b")
    assert q.qsize() == 2
    # get() waits for the batch to be written and read back.
    assert await q.get() == b"a"
    assert q.get_nowait() == b"b"
    with pytest.raises(QueueEmpty):
        q.get_nowait()
    # asyncio's own exception types catch ours.
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()


async def test_put_nowait_is_written_by_sync(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue()
    for i in range(5):
        q.put_nowait(b"n%d" % i)
    await q.sync()
    assert read_queue(tmp_path, "q") == [b"n%d" % i for i in range(5)]


async def test_async_for_drains_then_ends_on_close(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.put_many([b"x", b"y", b"z"])
    got: list[bytes] = []

    async def consume() -> None:
        async for m in q:
            got.append(m)
            if len(got) == 3:
                asyncio.get_running_loop().call_soon(
                    lambda: asyncio.ensure_future(q.aclose()))

    await asyncio.wait_for(consume(), 10)
    assert got == [b"x", b"y", b"z"]


async def test_maxsize_full_and_blocking(make_queue: MakeQueue) -> None:
    q = await make_queue(maxsize=2)
    assert q.maxsize == 2 and not q.full()
    await q.put(b"1")
    await q.put(b"2")
    assert q.full()
    with pytest.raises(QueueFull):
        q.put_nowait(b"3")
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait(b"3")
    blocked = asyncio.create_task(q.put(b"3"))
    for _ in range(20):  # let the loop run: the put must stay blocked
        await asyncio.sleep(0)
    assert not blocked.done() and q.qsize() == 2
    assert await q.get() == b"1"
    await asyncio.wait_for(blocked, 10)
    assert q.qsize() == 2 and q.full()
    assert [await q.get(), await q.get()] == [b"2", b"3"]
    assert not q.full()


async def test_unbounded_queue_is_never_full(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.put_many([b"a"] * 100)
    assert q.maxsize == 0 and not q.full()


async def test_statistics_fields(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(max_bytes_per_file=100)
    msgs = [bytes([i]) * 30 for i in range(7)]  # 34-byte records: two per 100-byte file
    for m in msgs:
        await q.put(m)
    assert await q.get() == msgs[0]
    st = q.statistics()
    assert isinstance(st, Statistics)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.depth = 5  # type: ignore[misc]
    files, (wf, wp) = layout(msgs, 100)
    assert (st.write_file_num, st.write_pos) == (wf, wp) == (3, 34)
    assert (st.read_file_num, st.read_pos) == (0, 34)
    assert st.depth == 6 == q.qsize()
    assert st.puts == 7 and st.gets == 1
    assert st.bad_files == 0
    assert st.bytes_on_disk == sum(len(b) for b in files.values())
    assert st.bytes_on_disk == sum((tmp_path / seg_name("q", n)).stat().st_size for n in files)
    before = st.syncs
    await q.sync()
    assert q.statistics().syncs == before + 1
    meta = read_meta(tmp_path, "q")
    assert (meta.depth, meta.read_file, meta.read_pos, meta.write_file, meta.write_pos) == \
        (6, 0, 34, 3, 34)


async def test_repr_shows_depth_and_positions(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue()
    await q.put(b"abcd")
    r = repr(q)
    assert "'q'" in r and "depth=1" in r and "read=0,0" in r and "write=0,8" in r
    await q.aclose()
    assert "closed" in repr(q)


async def test_name_and_directory(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue(name="events")
    assert q.name == "events" and q.directory == str(tmp_path)


async def test_context_manager_creates_directory_and_closes(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    async with DiskQueue(d, "q") as q:
        await q.put(b"kept")
    assert read_queue(d, "q") == [b"kept"]
    async with DiskQueue(d, "q") as q2:
        assert q2.qsize() == 1 and await q2.get() == b"kept"
    assert read_queue(d, "q") == []


async def test_empty_payload(make_queue: MakeQueue, tmp_path: Path) -> None:
    q = await make_queue()
    await q.put(b"")
    await q.put(b"after")
    assert await q.get() == b""
    await q.sync()
    assert (tmp_path / seg_name("q", 0)).read_bytes() == b"\0\0\0\0" + b"\0\0\0\x05after"


async def test_put_nowait_write_buffer_full(make_queue: MakeQueue) -> None:
    q = await make_queue(write_buffer_bytes=4096)
    accepted = 0

    def fill() -> None:
        nonlocal accepted
        for _ in range(100):  # no await: the buffer cannot drain meanwhile
            q.put_nowait(b"b" * 1000)
            accepted += 1

    with pytest.raises(QueueFull, match="write buffer is full"):
        fill()
    assert 4 <= accepted <= 5  # 1004 bytes per record against 4096
    await q.sync()  # written: room again
    q.put_nowait(b"more")
    got = [await q.get() for _ in range(accepted + 1)]
    assert got == [b"b" * 1000] * accepted + [b"more"]


@pytest.mark.parametrize("use_many", [False, True], ids=["put", "put-and-put_many"])
async def test_bounded_many_producers_and_consumers(make_queue: MakeQueue,
                                                    use_many: bool) -> None:
    q = await make_queue(maxsize=16, max_bytes_per_file=2048)
    n_prod, per = 8, 300
    seen: dict[int, list[int]] = {p: [] for p in range(n_prod)}
    high = 0

    async def producer(p: int) -> None:
        nonlocal high
        i = 0
        while i < per:
            if use_many and i % 7 == 3:
                await q.put_many([b"%d:%d" % (p, i), b"%d:%d" % (p, i + 1)])
                i += 2
            else:
                await q.put(b"%d:%d" % (p, i))
                i += 1
            high = max(high, q.qsize())

    async def consumer() -> None:
        while True:
            try:
                batch = await q.get_many(5) if len(seen) % 2 else [await q.get()]
            except QueueClosed:
                return
            for m in batch:
                p, i = m.split(b":")
                seen[int(p)].append(int(i))

    consumers = [asyncio.create_task(consumer()) for _ in range(6)]
    await asyncio.wait_for(asyncio.gather(*(producer(p) for p in range(n_prod))), 60)
    await poll_until(lambda: q.qsize() == 0)
    q.shutdown()
    await asyncio.wait_for(asyncio.gather(*consumers), 10)
    for p in range(n_prod):
        assert sorted(seen[p]) == list(range(per))  # none lost, none twice
    # put() respects maxsize; put_many() does not wait for room (documented), so each
    # producer's batch of 2 may overshoot it.
    assert high <= 16 + (2 * n_prod if use_many else 0), high


async def poll_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until ``predicate()`` holds, checking every millisecond."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("size_mib", [5, 20], ids=lambda s: f"{s}MiB")
async def test_messages_larger_than_buffers_and_files(make_queue: MakeQueue, tmp_path: Path,
                                                      size_mib: int) -> None:
    # Larger than the 4 MiB read buffer, the file size and (20 MiB) the write buffer.
    big = bytes(range(256)) * (size_mib * 4096)
    q = await make_queue(max_bytes_per_file=1 << 20, max_msg_size=32 << 20)
    await q.put(b"small")
    await q.put(big)
    await q.put(b"tail")
    st = q.statistics()
    assert (st.write_file_num, st.write_pos) == (2, 8)  # the big record sits alone in file 1
    assert (tmp_path / seg_name("q", 1)).stat().st_size == 4 + len(big)
    await q.aclose()
    q = await make_queue(max_bytes_per_file=1 << 20, max_msg_size=32 << 20)
    assert [await q.get() for _ in range(3)] == [b"small", big, b"tail"]


async def test_unclosed_queue_warns(make_queue: MakeQueue) -> None:
    q = await make_queue()
    with pytest.warns(ResourceWarning, match="unclosed"):
        q.__del__()  # what garbage collection would run on a queue never closed
    await q.aclose()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q.__del__()  # closed: silent
