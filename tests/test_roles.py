"""One queue, two roles: a producer object and a consumer object (in this process or
another) at once; the locks, the API of each role, bad input, and the files they leave
for go-diskqueue."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest
from conftest import CopyFixture
from helpers_child import child_msg
from helpers_format import bad_files, patch_bytes, read_meta, read_queue, seg_name
from helpers_proc import Child
from test_core_fixtures import FIXTURES, IDS, Fixture, _extra

from aiodiskqueue import (
    CorruptionError,
    DiskQueue,
    OptionConflict,
    QueueLocked,
    QueueNotFound,
    RoleError,
)
from aiodiskqueue.sync import DiskQueue as SyncDiskQueue


async def _pair(tmp_path: Path, **opts: object) -> tuple[DiskQueue, DiskQueue]:
    p = await DiskQueue.open(tmp_path, "q", role="producer", **opts)
    c = await DiskQueue.open(tmp_path, "q", role="consumer", **opts)
    return p, c


async def _get(q: DiskQueue, timeout: float = 10.0) -> bytes:
    return await asyncio.wait_for(q.get(), timeout)


# ---------------------------------------------------------------------- locks


async def test_a_producer_and_a_consumer_hold_one_queue(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    assert (p.role, c.role) == ("producer", "consumer")
    await p.put(b"one")
    await p.put_many([b"two", b"three"])
    assert [await _get(c) for _ in range(3)] == [b"one", b"two", b"three"]
    await c.aclose()
    await p.aclose()


@pytest.mark.parametrize("role", ["producer", "consumer"])
async def test_a_second_holder_of_a_role_gets_queue_locked_with_the_pid(
        tmp_path: Path, role: str) -> None:
    async with DiskQueue(tmp_path, "q", "producer"):
        pass  # the queue exists for a consumer
    first = await DiskQueue.open(tmp_path, "q", role=role)
    with pytest.raises(QueueLocked) as ei:
        await DiskQueue.open(tmp_path, "q", role=role)
    assert ei.value.pid == os.getpid()
    assert ei.value.path == str(tmp_path / f"q.diskqueue.{role}")
    assert f"process {os.getpid()}" in str(ei.value)
    await first.aclose()
    again = await DiskQueue.open(tmp_path, "q", role=role)  # released on close
    await again.aclose()


@pytest.mark.parametrize("role", ["producer", "consumer"])
async def test_both_conflicts_with_either_role(tmp_path: Path, role: str) -> None:
    async with DiskQueue(tmp_path, "q"):
        pass
    held = await DiskQueue.open(tmp_path, "q", role=role)
    with pytest.raises(QueueLocked) as ei:
        await DiskQueue.open(tmp_path, "q")
    assert ei.value.pid == os.getpid()  # the role holder's pid, not a stale one
    await held.aclose()
    whole = await DiskQueue.open(tmp_path, "q")
    with pytest.raises(QueueLocked) as ei:
        await DiskQueue.open(tmp_path, "q", role=role)
    assert ei.value.pid == os.getpid()
    await whole.aclose()


@pytest.mark.parametrize("role", ["producer", "consumer"])
async def test_an_older_version_holding_the_queue_conflicts_with_any_role(
        tmp_path: Path, role: str) -> None:
    async with DiskQueue(tmp_path, "q"):
        pass
    # An older version takes flock(LOCK_EX) on NAME.diskqueue.lock and nothing else.
    fd = os.open(tmp_path / "q.diskqueue.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(QueueLocked):
            await DiskQueue.open(tmp_path, "q", role=role)
    finally:
        os.close(fd)
    # And a role held here keeps the older version out.
    async with DiskQueue(tmp_path, "q", role):
        fd = os.open(tmp_path / "q.diskqueue.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


async def test_roles_in_other_processes(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", "producer"):
        pass
    holder = await Child.spawn(tmp_path / "err.txt", "rhold", str(tmp_path), "q", "consumer")
    try:
        line = await holder.line()
        assert line is not None and line.startswith("OPEN ")
        pid = int(line.split()[1])
        trier = await Child.spawn(tmp_path / "err.txt", "rtry", str(tmp_path), "q", "consumer")
        assert await trier.rest() == [f"LOCKED {pid}"]
        trier = await Child.spawn(tmp_path / "err.txt", "rtry", str(tmp_path), "q", "producer")
        assert await trier.rest() == ["OPENED"]
        with pytest.raises(QueueLocked) as ei:
            await DiskQueue.open(tmp_path, "q")
        assert ei.value.pid == pid
    finally:
        assert holder.proc.stdin is not None
        holder.proc.stdin.close()
        assert await holder.wait() == 0
    assert holder.stderr() == ""


# ---------------------------------------------------------------------- the API per role


async def test_each_role_has_its_side_of_the_api_only(tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    with pytest.raises(RoleError, match=r"^get\(\) is not available to a queue opened with "
                                        r"role='producer'$"):
        await p.get()
    with pytest.raises(RoleError, match="role='producer'"):
        p.get_nowait()
    with pytest.raises(RoleError, match="role='producer'"):
        await p.get_many(3)
    with pytest.raises(RoleError, match="role='producer'"):
        await p.__anext__()
    with pytest.raises(RoleError, match=r"^put\(\) is not available to a queue opened with "
                                        r"role='consumer'$"):
        await c.put(b"x")
    with pytest.raises(RoleError, match="role='consumer'"):
        c.put_nowait(b"x")
    with pytest.raises(RoleError, match="role='consumer'"):
        await c.put_many([b"x"])
    with pytest.raises(RoleError, match="role='consumer'"):
        await c.put(b"x" * (2 << 20))  # the role, not the size, is the problem
    for q, other in ((p, "consumer"), (c, "producer")):
        with pytest.raises(RoleError, match=rf"^purge\(\) while process {os.getpid()} holds "
                                            rf"the {other} role \(it needs both roles\) is "
                                            r"not available"):
            await q.purge()
    # Nothing was changed by the refused calls.
    await p.put(b"ok")
    assert await _get(c) == b"ok"
    await c.aclose()
    await p.aclose()


@pytest.mark.parametrize("role", ["producer", "consumer"])
async def test_purge_by_a_role_whose_other_role_is_free(tmp_path: Path, role: str) -> None:
    p, c = await _pair(tmp_path, max_bytes_per_file=1024)
    await p.put_many([child_msg(i) for i in range(100)])
    assert await _get(c) == child_msg(0)
    keep, gone = (p, c) if role == "producer" else (c, p)
    await gone.aclose()
    await keep.purge()
    assert keep.qsize() == 0
    await keep.aclose()
    meta = read_meta(tmp_path, "q")
    assert (meta.depth, meta.read_file, meta.read_pos) == (0, meta.write_file, 0)
    assert not [e for e in tmp_path.iterdir() if e.name.endswith(".dat")
                and "meta" not in e.name]
    assert read_queue(tmp_path, "q") == []
    # Both roles go on from the purged state.
    p, c = await _pair(tmp_path, max_bytes_per_file=1024)
    await p.put(b"after")
    assert await _get(c) == b"after"
    assert c.qsize() == 0
    await c.aclose()
    await p.aclose()
    assert read_queue(tmp_path, "q") == []


async def test_an_unknown_role_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^role must be 'producer', 'consumer' or 'both', "
                                         r"got 'reader'$"):
        DiskQueue(tmp_path, "q", role="reader")
    with pytest.raises(TypeError, match="role must be a str, got int"):
        DiskQueue(tmp_path, "q", role=1)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


async def test_a_consumer_of_no_queue_gets_queue_not_found(tmp_path: Path) -> None:
    with pytest.raises(QueueNotFound):
        await DiskQueue.open(tmp_path, "q", role="consumer")
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize(("option", "first", "second"), [
    ("max_bytes_per_file", 4096, 8192),
    ("min_msg_size", 0, 4),
    ("max_msg_size", 1000, 2000),
])
@pytest.mark.parametrize("first_role", ["producer", "consumer"])
async def test_contradicting_options_between_live_roles_name_both_values(
        tmp_path: Path, option: str, first: int, second: int, first_role: str) -> None:
    async with DiskQueue(tmp_path, "q", "producer"):
        pass
    other = "consumer" if first_role == "producer" else "producer"
    held = await DiskQueue.open(tmp_path, "q", role=first_role, **{option: first})
    before = sorted((e.name, e.read_bytes()) for e in tmp_path.iterdir()
                    if e.name != f"q.diskqueue.{other}")
    with pytest.raises(OptionConflict) as ei:
        await DiskQueue.open(tmp_path, "q", role=other, **{option: second})
    assert str(ei.value) == (f"{option}={second} contradicts {option}={first} of the "
                             f"{first_role} (process {os.getpid()}) holding the queue")
    after = sorted((e.name, e.read_bytes()) for e in tmp_path.iterdir()
                   if e.name != f"q.diskqueue.{other}")
    assert after == before
    # The role was not taken: the same options open it.
    ok = await DiskQueue.open(tmp_path, "q", role=other, **{option: first})
    await ok.aclose()
    await held.aclose()


# ---------------------------------------------------------------------- state and files


async def test_go_diskqueue_reads_the_queue_after_every_role_closed(tmp_path: Path) -> None:
    msgs = [child_msg(i) for i in range(300)]
    p, c = await _pair(tmp_path, max_bytes_per_file=4096)
    await p.put_many(msgs)
    got = [await _get(c) for _ in range(120)]
    assert got == msgs[:120]
    await c.aclose()
    await p.put(b"late")
    await p.aclose()
    meta = read_meta(tmp_path, "q")
    assert meta.depth == 181
    assert read_queue(tmp_path, "q") == [*msgs[120:], b"late"]
    # Segments the consumer finished are gone; nothing else of go-diskqueue's names.
    assert not (tmp_path / seg_name("q", 0)).exists()
    extra = {e.name for e in tmp_path.iterdir() if ".dat" not in e.name}
    assert extra == {"q.diskqueue.lock", "q.diskqueue.producer", "q.diskqueue.consumer",
                     "q.diskqueue.roles"}
    async with DiskQueue(tmp_path, "q") as q:  # and role="both" reads on from there
        assert q.qsize() == 181
        assert [await q.get() for _ in range(181)] == [*msgs[120:], b"late"]


async def test_closing_in_either_order_leaves_the_right_depth(tmp_path: Path) -> None:
    for first_closed in ("producer", "consumer"):
        d = tmp_path / first_closed
        p, c = await _pair(d)
        await p.put_many([b"a", b"b", b"c", b"d"])
        assert await _get(c) == b"a"
        assert await _get(c) == b"b"
        order = [p, c] if first_closed == "producer" else [c, p]
        for q in order:
            await q.aclose()
        assert read_meta(d, "q").depth == 2
        assert read_queue(d, "q") == [b"c", b"d"]


async def test_role_both_after_roles_and_roles_after_both(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q") as q:
        await q.put_many([b"1", b"2", b"3"])
        assert await q.get() == b"1"
    p, c = await _pair(tmp_path)
    assert c.qsize() == 2 and p.qsize() == 2
    assert await _get(c) == b"2"
    await p.put(b"4")
    await c.aclose()
    await p.aclose()
    async with DiskQueue(tmp_path, "q") as q:
        assert [await q.get() for _ in range(q.qsize())] == [b"3", b"4"]
        await q.put(b"5")
    p, c = await _pair(tmp_path)
    assert await _get(c) == b"5"
    await c.aclose()
    await p.aclose()
    assert read_queue(tmp_path, "q") == []


async def test_the_consumer_follows_segment_rolls_and_deletes_what_it_finished(
        tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, max_bytes_per_file=1024, sync_every=50)
    msgs = [child_msg(i) for i in range(400)]
    for m in msgs:
        await p.put(m)
    got = [await _get(c) for _ in range(400)]
    assert got == msgs
    await c.sync()
    assert c.qsize() == 0
    segs = sorted(e.name for e in tmp_path.iterdir() if e.name.endswith(".dat")
                  and "meta" not in e.name)
    assert len(segs) <= 2  # only the read file and the write file are left
    await c.aclose()
    await p.aclose()
    assert read_meta(tmp_path, "q").depth == 0


async def test_a_producer_counts_what_the_consumer_has_not_stored_as_taken(
        tmp_path: Path) -> None:
    p, c = await _pair(tmp_path, maxsize=3, sync_every=1)
    for i in range(3):
        await p.put(b"%d" % i)
    assert p.full()
    blocked = asyncio.ensure_future(p.put(b"3"))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    assert await _get(c) == b"0"  # sync_every=1: its position is stored at once
    await asyncio.wait_for(blocked, 10)
    assert [await _get(c) for _ in range(3)] == [b"1", b"2", b"3"]
    await c.aclose()
    await p.aclose()


async def test_a_torn_tail_past_the_published_position_is_not_yet_then_cut(
        tmp_path: Path) -> None:
    p, c = await _pair(tmp_path)
    await p.put(b"first")
    assert await _get(c) == b"first"
    # A producer that died half way through a record: bytes past its published position.
    seg = tmp_path / seg_name("q", 0)
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x10half")
    late = asyncio.ensure_future(c.get())
    await asyncio.sleep(0.1)
    assert not late.done()  # not yet: never damage, never skipped
    await p.aclose()
    p = await DiskQueue.open(tmp_path, "q", role="producer")  # cuts the torn tail
    await p.put(b"second")
    assert await asyncio.wait_for(late, 10) == b"second"
    assert c.statistics().bad_files == 0
    await c.aclose()
    await p.aclose()
    assert read_queue(tmp_path, "q") == []


async def test_a_consumer_alone_reads_what_a_dead_producer_acknowledged(
        tmp_path: Path) -> None:
    prod = await Child.spawn(tmp_path / "err.txt", "rproduce", str(tmp_path), "q", "0",
                             "2500", str(1 << 20))
    assert (await prod.line() or "").startswith("READY")
    acked = [int(await prod.line() or "-1") for _ in range(50)]
    prod.kill()
    await prod.wait()
    async with DiskQueue(tmp_path, "q", "consumer") as c:
        got = [await _get(c) for _ in range(50)]
    assert got == [child_msg(i) for i in acked]


async def test_the_sync_facade_takes_a_role(tmp_path: Path) -> None:
    with SyncDiskQueue(tmp_path, "q", role="producer") as p:
        assert p.role == "producer"
        p.put(b"x")
        with SyncDiskQueue(tmp_path, "q", role="consumer") as c:
            assert c.role == "consumer"
            assert c.get(timeout=10) == b"x"
            with pytest.raises(RoleError):
                c.put(b"y")
        with pytest.raises(RoleError):
            p.get(timeout=1)


async def test_an_idle_consumer_costs_under_one_percent_of_a_core(tmp_path: Path) -> None:
    # The consumer runs in a process of its own: this process's CPU time counts every
    # thread earlier tests left behind, and it says nothing about the consumer.
    async with DiskQueue(tmp_path, "q", "producer") as p:
        child = await Child.spawn(tmp_path / "err.txt", "ridle", str(tmp_path), "q", "3.0")
        idle = await child.line(60)
        assert idle is not None and idle.startswith("IDLE "), child.stderr()
        used = float(idle.split()[1])
        # About 0.03 s is measured here on a quiet machine, start-up included (a look a
        # second, about 0.5% of a core once settled). The bound is generous for a shared,
        # noisy machine, and far below what polling every millisecond would cost (~0.3 s).
        assert used < 0.15, f"{used:.3f} s of CPU in 3 s idle"
        await p.put(b"wake")
        assert await child.line(10) == "G wake"
        assert await child.wait() == 0


async def test_a_killed_producers_record_is_not_taken_for_a_live_one(tmp_path: Path) -> None:
    prod = await Child.spawn(tmp_path / "err.txt", "rproduce", str(tmp_path), "q", "0",
                             "2500", str(1 << 20))
    assert (await prod.line() or "").startswith("READY")
    for _ in range(20):
        await prod.line()
    prod.kill()
    await prod.wait()
    async with DiskQueue(tmp_path, "q") as q:  # the whole queue moves on meanwhile
        while q.qsize():
            await q.get()
        await q.put(b"x")
    # A new producer has taken the role and not yet written its record: the killed
    # one's record (live, positions of another time) is still there.
    fd = os.open(tmp_path / "q.diskqueue.producer", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        async with DiskQueue(tmp_path, "q", "consumer") as c:
            assert c.qsize() == 1
            assert await _get(c) == b"x"
    finally:
        os.close(fd)


async def test_without_inotify_the_consumer_polls_with_backoff(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue._core import notify

    monkeypatch.setattr(notify, "_libc", lambda: None)  # as on NFS or another OS
    p, c = await _pair(tmp_path)
    waiter = asyncio.ensure_future(c.get())
    await asyncio.sleep(0.5)
    watch = c._e.watch()  # type: ignore[attr-defined]
    assert not watch.inotify
    assert watch._delay == notify.POLL_MAX  # backed off while nothing changed
    await p.put(b"polled")
    assert await asyncio.wait_for(waiter, 10) == b"polled"
    assert watch._delay < notify.POLL_MAX  # a change: polling comes soon again
    await c.aclose()
    await p.aclose()


async def test_a_producer_alone_deletes_nothing(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", "producer", max_bytes_per_file=1024) as p:
        await p.put_many([child_msg(i) for i in range(200)])
        assert p.qsize() == 200
    segs = [e for e in tmp_path.iterdir() if e.name.endswith(".dat") and "meta" not in e.name]
    assert len(segs) > 5
    async with DiskQueue(tmp_path, "q", "producer", max_bytes_per_file=1024) as p:
        assert p.qsize() == 200
    assert read_queue(tmp_path, "q") == [child_msg(i) for i in range(200)]


@pytest.mark.parametrize("role", ["producer", "consumer"])
async def test_tools_see_a_queue_held_by_a_role_as_held(tmp_path: Path, role: str) -> None:
    from aiodiskqueue._format.lock import lock_holder

    async with DiskQueue(tmp_path, "q"):
        pass
    lock = str(tmp_path / "q.diskqueue.lock")
    assert lock_holder(lock) is None
    async with DiskQueue(tmp_path, "q", role):
        assert lock_holder(lock) == os.getpid()
    assert lock_holder(lock) is None


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
@pytest.mark.parametrize("first", ["consumer", "producer"])
async def test_go_diskqueue_fixtures_through_the_roles(copy_fixture: CopyFixture,
                                                       tmp_path: Path, fx: Fixture,
                                                       first: str) -> None:
    copy_fixture(fx.name, tmp_path)
    opts = {"max_bytes_per_file": fx.max_bytes, "max_msg_size": fx.max_msg}
    expected = fx.remaining()
    extra = _extra(fx)
    q1 = await DiskQueue.open(tmp_path, fx.name, role=first, **opts)
    q2 = await DiskQueue.open(tmp_path, fx.name, role="producer" if first == "consumer"
                              else "consumer", **opts)
    p, c = (q2, q1) if first == "consumer" else (q1, q2)
    assert c.qsize() == p.qsize() == len(expected)
    assert [await _get(c) for _ in range(len(expected))] == expected
    put, got = len(extra) * 2 // 3, len(extra) // 3
    await p.put_many(extra[:put])
    assert [await _get(c) for _ in range(got)] == extra[:got]
    await c.aclose()
    await p.put_many(extra[put:])
    await p.aclose()
    assert bad_files(tmp_path) == []
    assert read_queue(tmp_path, fx.name) == extra[got:]  # go-diskqueue's view
    assert read_meta(tmp_path, fx.name).depth == len(extra) - got


async def test_damage_inside_published_data_stops_the_consumer(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, "q", "producer") as p:
        await p.put_many([b"aaaa", b"bbbb", b"cccc"])
        # The second record's length (bytes 8-11) says 2 GiB: not what was written.
        patch_bytes(tmp_path / seg_name("q", 0), 8, b"\x7f\xff\xff\xff")
        async with DiskQueue(tmp_path, "q", "consumer") as c:
            assert await _get(c) == b"aaaa"
            with pytest.raises(CorruptionError) as ei:
                await _get(c)
            assert ei.value.path == str(tmp_path / seg_name("q", 0))
            assert ei.value.offset == 8
            await p.put(b"dddd")  # the producer is not held up
    assert bad_files(tmp_path) == []  # nothing renamed beside a live producer


async def test_a_change_during_a_look_at_the_producer_is_not_missed(tmp_path: Path) -> None:
    # A notification that comes while the consumer is reading the producer's record
    # (not waiting) must still end its next wait: else a message would wait for the
    # once-a-second check. Pairs of puts, the second while the first is being read.
    p, c = await _pair(tmp_path)
    loop = asyncio.get_running_loop()
    worst = 0.0
    for i in range(200):
        t0 = loop.time()
        await p.put(b"a")
        await asyncio.sleep(0.00005 * (i % 20))
        await p.put(b"b")
        got = await asyncio.wait_for(c.get_many(2), 10)
        if got == [b"a"]:
            got.append(await asyncio.wait_for(c.get(), 10))
        assert got == [b"a", b"b"]
        worst = max(worst, loop.time() - t0)
    assert worst < 0.5, worst
    await c.aclose()
    await p.aclose()


async def test_a_consumers_meta_names_only_durable_data(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The producer fsyncs by its own count (here: not before close); the consumer's
    # store makes the data its meta's write half names durable first.
    p, c = await _pair(tmp_path, sync_every=10**6, sync_interval=3600.0)
    await p.put_many([b"one", b"two"])
    assert await _get(c) == b"one"
    synced: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    await c.sync()
    assert str(tmp_path / seg_name("q", 0)) in synced
    meta = read_meta(tmp_path, "q")
    assert (meta.depth, meta.read_pos, meta.write_pos) == (1, 7, 14)
    await c.aclose()
    await p.aclose()
