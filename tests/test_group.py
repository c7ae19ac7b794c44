"""Queue groups (aiodiskqueue/group/): producers that claim shards, consumers that read
the whole group fairly, divide its shards and take over, retention, bad input."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from helpers_format import read_meta, read_queue

from aiodiskqueue import (
    AckQueue,
    AckQueueGroup,
    DiskQueue,
    GroupFormatError,
    GroupNameConflict,
    GroupOptionConflict,
    QueueClosed,
    QueueEmpty,
    QueueGroup,
    RoleError,
    ShardDamaged,
)
from aiodiskqueue._format.group import group_layout
from aiodiskqueue.group._setup import GroupLock

WAIT = 20.0


async def _until(cond: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait (polling: the state is another object's, changed by its own task) until ``cond``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _gets(g: QueueGroup, n: int) -> list[bytes]:
    return [await asyncio.wait_for(g.get(), WAIT) for _ in range(n)]


def _tree(path: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under ``path``."""
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None
            for p in sorted(path.rglob("*"))}


# ---------------------------------------------------------------------- producers


async def test_each_producer_claims_a_shard_of_its_own(tmp_path: Path) -> None:
    a = await QueueGroup.open(tmp_path, "ev")
    b = await QueueGroup.open(tmp_path, "ev", "producer")
    assert (a.shard, b.shard) == ("000000", "000001")
    await a.put(b"a1")
    await b.put_many([b"b1", b"b2"])
    a.put_nowait(b"a2")
    await a.sync()
    await a.aclose()
    # A restarted worker claims a free shard again: the one a left.
    async with QueueGroup(tmp_path, "ev") as c:
        assert c.shard == "000000"
        await c.put(b"a3")
    await b.aclose()
    lay = group_layout(tmp_path, "ev")
    assert list(lay.shards()) == [0, 1]
    # Each shard is a plain queue NAME, readable alone.
    assert read_queue(Path(lay.shard_path(0)), "ev") == [b"a1", b"a2", b"a3"]
    assert read_queue(Path(lay.shard_path(1)), "ev") == [b"b1", b"b2"]
    async with DiskQueue(lay.shard_path(1), "ev") as q:
        assert [await q.get(), await q.get()] == [b"b1", b"b2"]


async def test_producers_racing_for_shards_never_share_one(tmp_path: Path) -> None:
    groups = await asyncio.gather(*(QueueGroup.open(tmp_path, "ev") for _ in range(6)))
    assert sorted(g.shard or "" for g in groups) == [f"{n:06d}" for n in range(6)]
    for g in groups:
        await g.aclose()


# ---------------------------------------------------------------------- one consumer


async def test_a_consumer_reads_every_shard_fairly_fifo_per_shard(tmp_path: Path) -> None:
    a = await QueueGroup.open(tmp_path, "ev")
    b = await QueueGroup.open(tmp_path, "ev")
    await a.put_many([b"a%d" % i for i in range(100)])
    await b.put_many([b"b%d" % i for i in range(3)])
    async with QueueGroup(tmp_path, "ev", "consumer") as c:
        assert c.shards == ["000000", "000001"]
        await _until(lambda: c.qsize() == 103, "the depth of both shards")
        reader = c._reader
        assert reader is not None
        await _until(lambda: all(o.q.statistics().ready >= 3 for o in reader.owned.values()),
                     "both shards read ahead")
        got = await _gets(c, 103)
        # Turns: one busy shard does not hold back the other.
        assert got[:6] == [b"a0", b"b0", b"a1", b"b1", b"a2", b"b2"]
        assert [m for m in got if m[:1] == b"a"] == [b"a%d" % i for i in range(100)]
        with pytest.raises(QueueEmpty):
            c.get_nowait()
        with pytest.raises(RoleError, match="put"):
            await c.put(b"x")
    with pytest.raises(RoleError, match="get"):
        await a.get()
    await a.aclose()
    await b.aclose()


async def test_a_consumer_picks_up_shards_made_while_it_runs(tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev", "consumer") as c:
        assert c.shards == []
        waiting = asyncio.ensure_future(c.get())
        async with QueueGroup(tmp_path, "ev") as p:
            await p.put(b"first")
            assert await asyncio.wait_for(waiting, WAIT) == b"first"
            async with QueueGroup(tmp_path, "ev") as p2:
                await p2.put(b"second")
                assert await _gets(c, 1) == [b"second"]
        assert c.shards == ["000000", "000001"]


async def test_get_waits_and_close_wakes_it(tmp_path: Path) -> None:
    c = await QueueGroup.open(tmp_path, "ev", "consumer")
    waiting = asyncio.ensure_future(c.get())
    await asyncio.sleep(0.05)
    await c.aclose()
    with pytest.raises(QueueClosed):
        await asyncio.wait_for(waiting, WAIT)
    with pytest.raises(QueueClosed):
        c.get_nowait()
    assert [m async for m in c] == []


async def test_a_cancelled_get_takes_nothing(tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev") as p, QueueGroup(tmp_path, "ev", "consumer") as c:
        for _ in range(20):
            t = asyncio.ensure_future(c.get())
            await asyncio.sleep(0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
        await p.put(b"one")
        assert await _gets(c, 1) == [b"one"]


# ---------------------------------------------------------------------- several consumers


async def _producers(tmp_path: Path, n: int, per: int) -> None:
    groups = [await QueueGroup.open(tmp_path, "ev") for _ in range(n)]
    for i, g in enumerate(groups):
        await g.put_many([b"%d-%d" % (i, k) for k in range(per)])
    for g in groups:
        await g.aclose()


async def test_two_consumers_divide_the_shards(tmp_path: Path) -> None:
    await _producers(tmp_path, 4, 50)
    c1 = await QueueGroup.open(tmp_path, "ev", "consumer")
    assert len(c1.shards) == 4
    c2 = await QueueGroup.open(tmp_path, "ev", "consumer")
    # The newcomer gets a share without the first one stopping.
    await _until(lambda: len(c1.shards) == 2 and len(c2.shards) == 2, "a share each")
    assert not set(c1.shards) & set(c2.shards)
    got: list[bytes] = []
    for c in (c1, c2):
        while True:
            try:
                got.append(await asyncio.wait_for(c.get(), 0.5))
            except TimeoutError:
                break
    assert sorted(got) == sorted(b"%d-%d" % (i, k) for i in range(4) for k in range(50))
    await c1.aclose()
    # The other one takes over the shards of a consumer that left.
    await _until(lambda: len(c2.shards) == 4, "the take-over")
    await c2.aclose()


async def test_a_handed_over_shard_resumes_where_the_first_consumer_stopped(
        tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put_many([b"%d" % i for i in range(10)])
    c1 = await QueueGroup.open(tmp_path, "ev", "consumer")
    assert await _gets(c1, 4) == [b"0", b"1", b"2", b"3"]
    await c1.aclose()
    async with QueueGroup(tmp_path, "ev", "consumer") as c2:
        assert await _gets(c2, 6) == [b"%d" % i for i in range(4, 10)]


# ---------------------------------------------------------------------- retention


async def test_retention_removes_drained_shards_without_a_producer(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "ev")
    live = await QueueGroup.open(tmp_path, "ev")  # shard 0: its producer stays
    await _producers(tmp_path, 2, 3)  # shards 1 and 2: producers gone
    await live.put(b"live")
    async with QueueGroup(tmp_path, "ev", "consumer", retention=0.0) as c:
        assert sorted(await _gets(c, 7)) == sorted(
            [b"live", *(b"%d-%d" % (i, k) for i in range(2) for k in range(3))])
        # Shard 2 is drained too, but the highest number stays (none is used twice).
        await _until(lambda: list(lay.shards()) == [0, 2], "the drained shard's removal")
        await _until(lambda: lay.removing() == [], "the renamed shards deleted")
        await live.put(b"still")
        assert await _gets(c, 1) == [b"still"]
    await live.aclose()
    async with QueueGroup(tmp_path, "ev") as p0, QueueGroup(tmp_path, "ev") as p1, \
            QueueGroup(tmp_path, "ev") as p3:
        assert (p0.shard, p1.shard, p3.shard) == ("000000", "000002", "000003")


async def test_retention_keeps_unread_shards_and_waits_its_time(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "ev")
    await _producers(tmp_path, 2, 3)
    async with QueueGroup(tmp_path, "ev", "consumer", retention=0.0) as c:
        await asyncio.sleep(1.5)  # more than one look at the group: unread, so kept
        assert list(lay.shards()) == [0, 1]
    async with QueueGroup(tmp_path, "ev", "consumer", retention=3600.0) as c:
        assert len(await _gets(c, 6)) == 6
        await asyncio.sleep(1.5)  # drained, but not for an hour
        assert list(lay.shards()) == [0, 1]
    async with QueueGroup(tmp_path, "ev", "consumer", retention=0.0) as c:
        await _until(lambda: list(lay.shards()) == [1], "the drained shard's removal")
        assert c.shards == ["000001"]
    async with QueueGroup(tmp_path, "ev") as p:
        assert p.shard == "000001" and p.qsize() == 0


async def test_removal_waits_for_the_group_lock_producers_claim_under(tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "ev")
    await _producers(tmp_path, 2, 1)
    lock = GroupLock(lay.lock_path, 0o600)
    async with QueueGroup(tmp_path, "ev", "consumer", retention=0.0) as c:
        assert sorted(await _gets(c, 2)) == [b"0-0", b"1-0"]
        async with lock.held():  # as a producer claiming a shard holds it
            await asyncio.sleep(1.5)
            assert list(lay.shards()) == [0, 1]
        await _until(lambda: list(lay.shards()) == [1], "the removal once the lock is free")


# ---------------------------------------------------------------------- AckQueueGroup


async def test_ack_group_redelivers_what_a_closed_consumer_had_in_flight(
        tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put_many([b"m%d" % i for i in range(5)])
    c1 = await AckQueueGroup.open(tmp_path, "ev", "consumer", sync_every=1)
    m0 = await asyncio.wait_for(c1.get(), WAIT)
    m1 = await asyncio.wait_for(c1.get(), WAIT)
    assert (m0.body, m1.body) == (b"m0", b"m1")
    await m0.finish()
    await c1.aclose()  # m1 still in flight
    async with AckQueueGroup(tmp_path, "ev", "consumer", sync_every=1) as c2:
        bodies = []
        for _ in range(4):
            m = await asyncio.wait_for(c2.get(), WAIT)
            bodies.append(m.body)
            await m.finish()
        assert sorted(bodies) == [b"m1", b"m2", b"m3", b"m4"]


async def test_ack_group_hands_over_after_in_flight_settles(tmp_path: Path) -> None:
    async with AckQueueGroup(tmp_path, "ev") as p1, AckQueueGroup(tmp_path, "ev") as p2:
        await p1.put(b"x")
        await p2.put(b"y")
    c1 = await AckQueueGroup.open(tmp_path, "ev", "consumer", settle_timeout=WAIT,
                                  sync_every=1)
    await _until(lambda: c1.qsize() == 2, "both messages ready")
    x = await asyncio.wait_for(c1.get(), WAIT)
    y = await asyncio.wait_for(c1.get(), WAIT)
    assert (x.body, y.body) == (b"x", b"y")  # shards take turns: y is shard 000001's
    await x.finish()
    c2 = await AckQueueGroup.open(tmp_path, "ev", "consumer", sync_every=1)
    # c1 hands shard 000001 over: no more takes from it at once, but the role stays
    # c1's while y is in flight.
    await _until(lambda: c1.shards == ["000000"], "shard 000001 leaving c1's turns")
    await asyncio.sleep(0.5)
    assert c2.shards == []
    await y.finish()
    await _until(lambda: c2.shards == ["000001"], "the hand-over after y settled")
    assert c2.qsize() == 0
    with pytest.raises(QueueEmpty):
        c2.get_nowait()  # y was finished: not delivered again
    await c1.aclose()
    await c2.aclose()


# ---------------------------------------------------------------------- bad input


async def test_a_group_and_a_plain_queue_of_one_name_conflict(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "plain") as q:
        await q.put(b"x")
    before = _tree(tmp_path)
    for role in ("producer", "consumer"):
        with pytest.raises(GroupNameConflict, match="plain queue"):
            await QueueGroup.open(tmp_path, "plain", role)
    assert _tree(tmp_path) == before and not (tmp_path / "plain.group").exists()
    async with QueueGroup(tmp_path, "grp") as p:
        await p.put(b"y")
    before = _tree(tmp_path)
    for role in ("both", "producer", "consumer"):
        with pytest.raises(GroupNameConflict, match="queue group"):
            await DiskQueue.open(tmp_path, "grp", role=role)
    with pytest.raises(GroupNameConflict):
        async with DiskQueue(tmp_path, "grp"):
            pass
    for role in ("both", "producer", "consumer"):
        with pytest.raises(GroupNameConflict):
            await AckQueue.open(tmp_path, "grp", role=role)
    assert _tree(tmp_path) == before



async def test_group_meta_of_another_version_or_options(tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev", max_bytes_per_file=4096) as p:
        await p.put(b"x")
    lay = group_layout(tmp_path, "ev")
    before = _tree(tmp_path)
    with pytest.raises(GroupOptionConflict, match="max_bytes_per_file=8192 contradicts "
                                                  "max_bytes_per_file=4096"):
        await QueueGroup.open(tmp_path, "ev", "consumer", max_bytes_per_file=8192)
    assert _tree(tmp_path) == before
    meta = Path(lay.meta_path)
    meta.write_bytes(meta.read_bytes().replace(b'"version": 1', b'"version": 9'))
    before = _tree(tmp_path)
    for role in ("producer", "consumer"):
        with pytest.raises(GroupFormatError, match="format version 9"):
            await QueueGroup.open(tmp_path, "ev", role, max_bytes_per_file=4096)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("run", range(3))  # a consumer starts at a shard chosen at random
async def test_a_shard_replaced_by_a_file_is_shard_damaged(tmp_path: Path, run: int) -> None:
    await _producers(tmp_path, 2, 1)
    lay = group_layout(tmp_path, "ev")
    shard0 = Path(lay.shard_path(0))
    for f in shard0.iterdir():
        f.unlink()
    shard0.rmdir()
    shard0.write_bytes(b"not a shard")
    before = _tree(tmp_path)
    with pytest.raises(ShardDamaged, match="not a directory"):
        await QueueGroup.open(tmp_path, "ev")
    with pytest.raises(ShardDamaged, match="not a directory"):
        await QueueGroup.open(tmp_path, "ev", "consumer")
    assert _tree(tmp_path) == before
    assert lay.members() == {}


async def test_a_shard_removed_by_hand_while_held_is_dropped(tmp_path: Path) -> None:
    await _producers(tmp_path, 2, 1)
    lay = group_layout(tmp_path, "ev")
    async with QueueGroup(tmp_path, "ev", "consumer") as c:
        assert len(c.shards) == 2
        os.rename(lay.shard_path(1), os.path.join(tmp_path, "moved-away"))
        await _until(lambda: c.shards == ["000000"], "the removed shard dropped")
        assert await _gets(c, 1) == [b"0-0"]


@pytest.mark.parametrize(("call", "error"), [
    (lambda d: QueueGroup(d, "ev", "both"), ValueError),
    (lambda d: QueueGroup(d, "ev", "nobody"), ValueError),
    (lambda d: QueueGroup(d, "ev", retention=-1), ValueError),
    (lambda d: QueueGroup(d, "ev", max_bytes_per_file=0), ValueError),
    (lambda d: QueueGroup(d, "ev", no_such_option=1), TypeError),
    (lambda d: QueueGroup(d, "a/b"), ValueError),
    (lambda d: AckQueueGroup(d, "ev", msg_timeout=0), ValueError),
], ids=["both", "unknown-role", "retention", "option", "unknown-option", "name", "ack"])
def test_bad_arguments(tmp_path: Path, call: Callable[[Path], object],
                       error: type[Exception]) -> None:
    with pytest.raises(error):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []


async def test_a_group_opened_twice_refuses(tmp_path: Path) -> None:
    g = QueueGroup(tmp_path, "ev")
    async with g:
        with pytest.raises(RuntimeError, match="opened already"):
            await g._start()
    opened: Awaitable[QueueGroup] = QueueGroup.open(tmp_path, "ev")
    await (await opened).aclose()


async def test_without_inotify_a_consumer_polls_for_new_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import aiodiskqueue._core.notify as notify
    monkeypatch.setattr(notify, "_libc", lambda: None)  # as on a platform without inotify
    async with QueueGroup(tmp_path, "ev", "consumer") as c:
        reader = c._reader
        assert reader is not None and reader._watch is not None
        assert not reader._watch.inotify
        async with QueueGroup(tmp_path, "ev") as p:
            await p.put(b"polled")
            assert await _gets(c, 1) == [b"polled"]


async def test_a_claim_cancelled_while_waiting_for_the_group_lock_lets_it_go(
        tmp_path: Path) -> None:
    lay = group_layout(tmp_path, "ev")
    async with QueueGroup(tmp_path, "ev"):
        pass
    lock = GroupLock(lay.lock_path, 0o600)
    async with lock.held():
        waiting = asyncio.ensure_future(QueueGroup.open(tmp_path, "ev"))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    # The cancelled claim's thread got the lock after we let go, and dropped it.
    p = await asyncio.wait_for(QueueGroup.open(tmp_path, "ev"), WAIT)
    assert p.shard == "000000"
    await p.aclose()


async def test_ack_group_get_takes_a_msg_timeout(tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put_many([b"a", b"b"])
    async with AckQueueGroup(tmp_path, "ev", "consumer", max_msg_timeout=60.0) as c:
        with pytest.raises(ValueError, match=r"max_msg_timeout=60\.0"):
            await c.get(msg_timeout=61.0)
        with pytest.raises(ValueError, match="msg_timeout"):
            c.get_nowait(msg_timeout=0)
        m = await asyncio.wait_for(c.get(msg_timeout=0.2), WAIT)
        assert m.body == b"a"
        # Not finished in time: it times out and comes again.
        again = await asyncio.wait_for(c.get(msg_timeout=30.0), WAIT)
        if again.body == b"b":
            again = await asyncio.wait_for(c.get(), WAIT)
        assert again.body == b"a" and again.attempts == 2


async def test_full_and_maxsize_as_a_diskqueue_s(tmp_path: Path) -> None:
    # qsize(), empty() and full() as asyncio.Queue and DiskQueue have them: a producer's
    # shard is bounded by maxsize; a consumer puts nothing, so it is never full.
    async with QueueGroup(tmp_path, "ev", maxsize=2) as p, \
            QueueGroup(tmp_path, "ev", "consumer", maxsize=2) as c:
        assert (p.maxsize, p.full(), p.empty()) == (2, False, True)
        await p.put_many([b"1", b"2"])
        assert (p.qsize(), p.full(), p.empty()) == (2, True, False)
        await _until(lambda: c.qsize() == 2, "the consumer seeing both")
        assert (c.maxsize, c.full(), c.empty()) == (0, False, False)


async def test_a_consumer_s_sync_stores_its_read_positions(tmp_path: Path) -> None:
    await _producers(tmp_path, 2, 2)
    lay = group_layout(tmp_path, "ev")
    c = await QueueGroup.open(tmp_path, "ev", "consumer", sync_every=1000, sync_interval=3600)
    assert len(await _gets(c, 3)) == 3
    await c.sync()
    depths = [read_meta(Path(lay.shard_path(n)), "ev").depth for n in (0, 1)]
    assert sorted(depths) == [0, 1]
    await c.aclose()
    with pytest.raises(QueueClosed):
        await c.sync()
