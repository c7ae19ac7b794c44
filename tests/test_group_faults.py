"""Queue groups under faults and races: durability of a new shard's directory entries, a
shard that fails in a consumer's hands, a hand-over under a finish, a cancelled close, the
shares of several consumers, damaged shards, many claims at once in one process."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_group import WAIT, _until

from aiodiskqueue import (
    AckQueueGroup,
    CorruptionError,
    Message,
    QueueEmpty,
    QueueGroup,
    ShardDamaged,
)
from aiodiskqueue._format.group import group_layout
from aiodiskqueue.group import _reader


async def test_a_put_into_a_new_shard_is_durable_with_its_directory_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With sync_every=1 a put returns once fsynced: that must include the directory
    # entries leading to the segment, or a power cut loses the whole shard (ext4
    # without a directory fsync may drop a new directory's entry).
    synced: list[tuple[str, set[str]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((path, set(os.listdir(path)) if os.path.isdir(path) else set()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    lay = group_layout(tmp_path, "ev")
    async with QueueGroup(tmp_path, "ev", sync_every=1) as p:
        await p.put(b"x")
        # The group directory's entry in DIRECTORY, and the shard's in the group directory.
        assert any(path == str(tmp_path) and "ev.group" in names for path, names in synced)
        assert any(path == lay.path and "000000" in names for path, names in synced)


async def test_one_failing_shard_does_not_stop_the_consumer(tmp_path: Path) -> None:
    a = await QueueGroup.open(tmp_path, "ev")
    b = await QueueGroup.open(tmp_path, "ev")
    await a.put_many([b"a%02d" % i for i in range(10)])
    await b.put_many([b"b%02d" % i for i in range(10)])
    await a.aclose()
    await b.aclose()
    lay = group_layout(tmp_path, "ev")
    seg = Path(lay.shard_layout(0).segment_path(0))
    data = bytearray(seg.read_bytes())
    # Records of 4 + 3 bytes: the length of record 5 (byte 35) made larger than the file.
    data[35:39] = (1 << 20).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
    async with QueueGroup(tmp_path, "ev", "consumer", strict=True) as c:
        got: list[bytes] = []
        errors: list[ShardDamaged] = []
        while len(got) < 15 or not errors:
            try:
                got.append(await asyncio.wait_for(c.get(), WAIT))
            except ShardDamaged as exc:
                errors.append(exc)
        # Shard 000000 failed once, with the shard's path and the cause; shard 000001
        # goes on.
        assert [e.path for e in errors] == [lay.shard_path(0)]
        assert isinstance(errors[0].__cause__, CorruptionError)
        assert sorted(got) == sorted([b"a%02d" % i for i in range(5)]
                                     + [b"b%02d" % i for i in range(10)])
        assert c.shards == ["000001"]
        with pytest.raises(QueueEmpty):
            c.get_nowait()


async def test_a_finish_that_ends_the_settling_of_a_hand_over_succeeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with QueueGroup(tmp_path, "ev") as p1, QueueGroup(tmp_path, "ev") as p2:
        await p1.put(b"x")
        await p2.put(b"y")
    c1 = await AckQueueGroup.open(tmp_path, "ev", "consumer", settle_timeout=WAIT,
                                  sync_every=1)
    try:
        got: dict[bytes, Message] = {}
        while len(got) < 2:
            m = await asyncio.wait_for(c1.get(), WAIT)
            got[m.body] = m
        # The hand-over looks at the count of deliveries out at every turn of the loop:
        # it sees the finish below before the finish's commit is written.
        monkeypatch.setattr(_reader, "_SETTLE_POLL", 0.0)
        c2 = await AckQueueGroup.open(tmp_path, "ev", "consumer", sync_every=1)
        try:
            await _until(lambda: len(c1.shards) == 1, "one shard leaving c1's turns")
            settling = got[b"y"] if c1.shards == ["000000"] else got[b"x"]
            # The finish settles the last delivery out: the hand-over must wait for its
            # commit, not close the shard under it.
            await settling.finish()
            await _until(lambda: len(c2.shards) == 1, "the hand-over")
            with pytest.raises(QueueEmpty):
                c2.get_nowait()  # finished: not delivered again
        finally:
            await c2.aclose()
    finally:
        await c1.aclose()


async def test_a_cancelled_close_is_finished_by_the_next_one(tmp_path: Path) -> None:
    # As DiskQueue.aclose(): the close runs to completion even if its caller is
    # cancelled, and a second aclose() waits for it.
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put(b"x")
    lay = group_layout(tmp_path, "ev")
    c = await QueueGroup.open(tmp_path, "ev", "consumer")
    assert c.shards == ["000000"]
    closing = asyncio.ensure_future(c.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.wait_for(c.aclose(), WAIT)
    assert lay.members() == {}  # left the group
    # Its shard is free again, with nothing taken.
    async with QueueGroup(tmp_path, "ev", "consumer") as c2:
        assert c2.shards == ["000000"]
        assert await asyncio.wait_for(c2.get(), WAIT) == b"x"


async def test_three_consumers_of_four_shards_each_get_a_share(tmp_path: Path) -> None:
    ps = [await QueueGroup.open(tmp_path, "ev") for _ in range(4)]
    for p in ps:
        await p.aclose()
    cs = [await QueueGroup.open(tmp_path, "ev", "consumer") for _ in range(3)]
    try:
        # 2, 1 and 1: a newcomer is not left without a shard while another holds two
        # more than it.
        await _until(lambda: sorted(len(c.shards) for c in cs) == [1, 1, 2], "a share each")
        held = [s for c in cs for s in c.shards]
        assert sorted(held) == ["000000", "000001", "000002", "000003"]
    finally:
        for c in cs:
            await c.aclose()


async def test_a_shard_damaged_while_the_consumer_runs_is_logged_once_a_while(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import aiodiskqueue._core.notify as notify
    monkeypatch.setattr(notify, "_libc", lambda: None)  # polling: many looks at the group
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put(b"x")
    lay = group_layout(tmp_path, "ev")
    async with QueueGroup(tmp_path, "ev", "consumer") as c:
        assert await asyncio.wait_for(c.get(), WAIT) == b"x"
        Path(lay.shard_path(1)).write_bytes(b"not a shard")
        reader = c._reader
        assert reader is not None
        looks = 0
        real = reader.rebalance

        async def counted(strict: bool = False) -> None:
            nonlocal looks
            looks += 1
            await real(strict)

        monkeypatch.setattr(reader, "rebalance", counted)
        await _until(lambda: looks >= 4, "four looks at the group")
    damaged = [r.getMessage() for r in caplog.records if lay.shard_path(1) in r.getMessage()]
    assert len(damaged) == 1, damaged
    assert "not a directory" in damaged[0]
    # Each look went on past it (a failed look would skip the shards after it).
    assert not [r for r in caplog.records if "rebalancing" in r.getMessage()]


async def test_a_shard_that_cannot_be_opened_is_shard_damaged_for_either_role(
        tmp_path: Path) -> None:
    async with QueueGroup(tmp_path, "ev") as p:
        await p.put(b"x")
    lay = group_layout(tmp_path, "ev")
    meta = lay.shard_layout(0).meta_path
    os.unlink(meta)
    os.mkdir(meta)  # a directory where the shard's meta file belongs
    for role in ("producer", "consumer"):
        with pytest.raises(ShardDamaged, match="cannot be opened") as caught:
            await QueueGroup.open(tmp_path, "ev", role)
        assert caught.value.path == lay.shard_path(0)
    assert list(lay.shards()) == [0] and lay.members() == {}


async def test_more_claims_at_once_than_executor_threads(tmp_path: Path) -> None:
    # Waiting for the group lock must not hold a thread of the loop's executor: with
    # every thread blocked in flock(), the holder could not finish its claim (it needs a
    # thread too) and no claim ever would.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    groups = await asyncio.wait_for(
        asyncio.gather(*(QueueGroup.open(tmp_path, "ev") for _ in range(5))), WAIT)
    assert sorted(g.shard or "" for g in groups) == [f"{n:06d}" for n in range(5)]
    for g in groups:
        await g.aclose()
