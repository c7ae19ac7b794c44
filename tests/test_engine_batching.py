"""The write path's batching: pipelined hops, waiter bookkeeping, hand-over."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from conftest import MakeQueue
from helpers_format import records, seg_name, segment_numbers

from aiodiskqueue import DiskQueue


def on_disk(directory: Path, name: str) -> set[bytes]:
    """Every whole record in the segment files, read straight from the bytes."""
    found: set[bytes] = set()
    for num in segment_numbers(directory, name):
        found.update(records((directory / seg_name(name, num)).read_bytes()))
    return found


async def test_every_put_returns_only_after_its_own_records_are_written(
    tmp_path: Path, make_queue: MakeQueue
) -> None:
    # Mixed single puts, put_many of 1..40 items and put_nowait from 16 tasks land in
    # batches of every shape, some pipelined; each caller checks the bytes on disk
    # right after its await returns.
    q = await make_queue(tmp_path, max_bytes_per_file=4096)
    rng = random.Random(7)
    plans = [[rng.choice(["put", "many", "nowait"]) for _ in range(60)] for _ in range(16)]
    missing: list[bytes] = []

    async def producer(k: int) -> None:
        for i, how in enumerate(plans[k]):
            if how == "put":
                item = b"p%02d-%03d" % (k, i)
                await q.put(item)
                if item not in on_disk(tmp_path, "q"):
                    missing.append(item)
            elif how == "many":
                items = [b"m%02d-%03d-%02d" % (k, i, j) for j in range(rng.randrange(1, 40))]
                await q.put_many(items)
                disk = on_disk(tmp_path, "q")
                missing.extend(x for x in items if x not in disk)
            else:
                q.put_nowait(b"n%02d-%03d" % (k, i))
                await asyncio.sleep(0)

    await asyncio.gather(*(producer(k) for k in range(16)))
    assert missing == []
    await q.sync()
    got = [await q.get() for _ in range(q.qsize())]
    # FIFO per producer: each producer's messages come back in the order it put them.
    for k in range(16):
        mine = [m for m in got if m[1:3] == b"%02d" % k]
        assert mine == sorted(mine, key=lambda m: int(m[4:7]))
    assert len(got) == len(set(got))


async def test_many_producers_with_a_following_consumer_lose_and_reorder_nothing(
    make_queue: MakeQueue,
) -> None:
    q = await make_queue(max_bytes_per_file=10_000, read_buffer_bytes=8192)
    per, producers = 400, 16

    async def producer(k: int) -> None:
        for i in range(per):
            await q.put(b"%02d:%05d" % (k, i))

    async def consumer() -> list[bytes]:
        return [await q.get() for _ in range(per * producers)]

    taking = asyncio.create_task(consumer())
    await asyncio.gather(*(producer(k) for k in range(producers)))
    got = await taking
    assert len(got) == per * producers
    for k in range(producers):
        mine = [int(m[3:]) for m in got if m[:2] == b"%02d" % k]
        assert mine == list(range(per))
    assert q.qsize() == 0
    st = q.statistics()
    assert (st.puts, st.gets) == (per * producers, per * producers)


async def test_durable_puts_share_fsyncs(make_queue: MakeQueue) -> None:
    q = await make_queue(sync_every=1)
    before = q.statistics().syncs
    await asyncio.gather(*(q.put(b"%03d" % i) for i in range(64)))
    rounds = q.statistics().syncs - before
    # One sync round per hop, and 64 puts issued at once need far fewer than 64 hops.
    assert 1 <= rounds < 64
    assert q.qsize() == 64


async def test_close_with_hops_in_flight_writes_everything(tmp_path: Path) -> None:
    q = await DiskQueue.open(tmp_path, "q")
    for i in range(1000):
        q.put_nowait(b"%04d" % i)
    puts = [asyncio.ensure_future(q.put(b"x%03d" % i)) for i in range(50)]
    await asyncio.sleep(0)
    await q.aclose()
    await asyncio.gather(*puts)
    async with DiskQueue(tmp_path, "q") as q2:
        assert q2.qsize() == 1050
        got = [await q2.get() for _ in range(1050)]
    assert got[:1000] == [b"%04d" % i for i in range(1000)]
    assert sorted(got[1000:]) == sorted(b"x%03d" % i for i in range(50))
