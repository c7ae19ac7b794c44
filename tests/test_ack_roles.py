"""AckQueue with roles: a producer (an object here, or a process) puts while a consumer
holds the deliveries (in flight, finish, requeue, timeouts, dead letters, the ack log).

Run as a script this file is the child process of the kill tests:
``produce DIR N FORMAT`` puts ``0..N-1`` with ``role="producer"``, printing ``P i`` once each
``put()`` returned; ``consume DIR`` finishes every message with ``role="consumer"``,
printing ``F body`` once ``finish()`` returned and ``T body`` when it takes one it keeps
in flight (every fifth). Both print ``READY`` once open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal, cast

import pytest

from aiodiskqueue import (
    AckQueue,
    DiskQueue,
    Message,
    OptionConflict,
    QueueEmpty,
    QueueLocked,
    QueueNotFound,
    RoleError,
)
from aiodiskqueue._format import nsq
from aiodiskqueue.ack.clock import ManualClock
from aiodiskqueue.sync import AckQueue as SyncAckQueue

NAME = "jobs"


async def _get(q: AckQueue, timeout: float = 10.0) -> Message:
    return await asyncio.wait_for(q.get(), timeout)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[AckQueue, AckQueue, ManualClock]]:
    """A producer and a consumer of one AckQueue in this process; a manual clock."""
    clock = ManualClock()
    p = await AckQueue.open(tmp_path, NAME, role="producer", clock=clock)
    c = await AckQueue.open(tmp_path, NAME, role="consumer", clock=clock, msg_timeout=10.0,
                            max_attempts=3)
    yield p, c, clock
    await c.aclose()
    await p.aclose()


# ---------------------------------------------------------------------- delivery


async def test_the_consumer_delivers_what_the_producer_puts(
        pair: tuple[AckQueue, AckQueue, ManualClock]) -> None:
    p, c, _ = pair
    assert (p.role, c.role) == ("producer", "consumer")
    await p.put(b"one")
    await p.put_many([b"two", b"three"])
    got = [await _get(c) for _ in range(3)]
    assert [m.body for m in got] == [b"one", b"two", b"three"]
    for m in got:
        await m.finish()
    st = c.statistics()
    assert (st.finished, st.in_flight, st.delivered) == (3, 0, 3)
    await c.sync()
    await p.sync()
    assert p.qsize() == 0  # counted from the consumer's last commit


async def test_requeue_timeout_and_dead_letters_in_the_consumer(
        pair: tuple[AckQueue, AckQueue, ManualClock]) -> None:
    p, c, clock = pair
    await p.put(b"flaky")
    m1 = await _get(c)
    await m1.requeue()
    m2 = await _get(c)
    assert (m2.body, m2.attempts, m2.id) == (b"flaky", 2, m1.id)
    clock.advance(10.0)  # its msg_timeout: requeued by the consumer's timer
    assert not m2.in_flight
    m3 = await _get(c)
    assert m3.attempts == 3
    await m3.requeue()  # out of attempts: a dead letter
    dead = await asyncio.wait_for(c.dead_letters.get(), 10)
    assert dead == b"flaky"
    st = c.statistics()
    assert (st.requeued, st.timed_out, st.dead_lettered, st.in_flight) == (2, 1, 1, 0)
    with pytest.raises(QueueEmpty):
        c.get_nowait()


async def test_a_consumer_makes_deferred_puts(
        pair: tuple[AckQueue, AckQueue, ManualClock]) -> None:
    p, c, clock = pair
    await c.put(b"later", delay=5.0)  # into the consumer's ack log
    await p.put(b"now")
    assert (await _get(c)).body == b"now"
    assert c.statistics().deferred == 1
    clock.advance(5.0)
    assert (await _get(c)).body == b"later"


@pytest.mark.parametrize("fmt", ["raw", "nsq"])
async def test_a_put_waits_for_no_commit_with_sync_every_1(
        tmp_path: Path, fmt: Literal["raw", "nsq"]) -> None:
    # The producer's data queue fsyncs each put itself; the consumer commits on its own.
    p = await AckQueue.open(tmp_path, NAME, role="producer", sync_every=1, format=fmt)
    c = await AckQueue.open(tmp_path, NAME, role="consumer", sync_every=1, format=fmt)
    await p.put(b"durable")
    assert p.statistics().commits == 0  # the put returned once fsynced, without one
    m = await _get(c)
    assert m.body == b"durable"
    await m.finish()  # returns once the log is fsynced
    await c.aclose()
    await p.aclose()


async def test_nsq_format_the_producer_writes_nsqd_messages(tmp_path: Path) -> None:
    p = await AckQueue.open(tmp_path, NAME, role="producer", format="nsq")
    await p.put_many([b"a", b"b"])
    await p.aclose()
    # The data queue holds nsqd's message layout, as with role="both".
    async with DiskQueue(tmp_path, NAME, role="consumer") as dq:
        raw = [await dq.get(), await dq.get()]
        ts, attempts, msg_id, body = nsq.decode(raw[0])
        assert (attempts, body) == (0, b"a") and ts > 0 and len(msg_id) == 16
        assert nsq.decode(raw[1])[3] == b"b"
        assert nsq.decode(raw[1])[2] != msg_id
    async with AckQueue(tmp_path, NAME, role="producer", format="nsq") as p, \
            AckQueue(tmp_path, NAME, role="consumer", format="nsq") as c:
        await p.put(b"c")
        m = await _get(c)
        assert (m.body, m.attempts) == (b"c", 1)
        assert m.timestamp > 0
        await m.finish()


# ---------------------------------------------------------------------- each side's API


async def test_a_producer_has_no_get_side(tmp_path: Path) -> None:
    async with AckQueue(tmp_path, NAME, role="producer", max_attempts=2) as p:
        with pytest.raises(RoleError, match=r"^get\(\) is not available to a queue opened "
                                            r"with role='producer'$"):
            await p.get()
        with pytest.raises(RoleError, match="role='producer'"):
            p.get_nowait()
        with pytest.raises(RoleError, match="role='producer'"):
            await p.get_many(3)
        with pytest.raises(RoleError, match=r"^get_many\(\) .*role='producer'"):
            p.get_many_nowait(3)
        with pytest.raises(RoleError, match="role='producer'"):
            await p.__anext__()
        with pytest.raises(RoleError, match=r"^dead_letters \(the dead-letter queue is the "
                                            r"consumer's\)"):
            p.dead_letters  # noqa: B018
        with pytest.raises(RoleError, match=r"^purge\(\)"):
            await p.purge()
        with pytest.raises(RoleError, match=r"^put\(\) with a delay \(a deferred message goes "
                                            r"to the ack log, which the consumer role holds\)"):
            await p.put(b"x", delay=1.0)
        with pytest.raises(RoleError, match="role='producer'"):
            await p.put_many([b"x"], delay=1.0)
        assert p.qsize() == 0  # nothing of the refused calls was put
        await p.put(b"ok")
        assert p.qsize() == 1
        st = p.statistics()
        assert (st.depth, st.in_flight, st.deferred, st.commits, st.log_bytes) == (1, 0, 0, 0, 0)
        assert st.queue.puts == 1
        assert "in_flight=0" in repr(p)
    # No ack log and no dead-letter queue: those are the consumer's files.
    assert not [n for n in os.listdir(tmp_path) if ".ack." in n or "dead" in n]


async def test_a_consumer_has_no_put_of_ready_messages(tmp_path: Path) -> None:
    async with DiskQueue(tmp_path, NAME, role="producer"):
        pass
    async with AckQueue(tmp_path, NAME, role="consumer") as c:
        with pytest.raises(RoleError, match=r"^put\(\) without a delay \(ready messages are "
                                            r"put by the producer role.*role='consumer'$"):
            await c.put(b"x")
        with pytest.raises(RoleError, match="role='consumer'"):
            await c.put_many([b"x", b"y"])
        assert c.qsize() == 0


async def test_roles_lock_as_the_data_queue_does(tmp_path: Path) -> None:
    with pytest.raises(QueueNotFound):
        await AckQueue.open(tmp_path, NAME, role="consumer")
    with pytest.raises(ValueError, match="role"):
        AckQueue(tmp_path, NAME, role="reader")
    async with AckQueue(tmp_path, NAME, role="producer"):
        with pytest.raises(QueueLocked):
            await AckQueue.open(tmp_path, NAME, role="producer")
        with pytest.raises(QueueLocked):
            await AckQueue.open(tmp_path, NAME)
        async with AckQueue(tmp_path, NAME, role="consumer"):
            with pytest.raises(QueueLocked):
                await AckQueue.open(tmp_path, NAME, role="consumer")
    async with AckQueue(tmp_path, NAME, role="consumer", max_msg_size=1000):
        with pytest.raises(OptionConflict):
            await AckQueue.open(tmp_path, NAME, role="producer", max_msg_size=2000)
        # A plain DiskQueue producer feeds a raw-format AckQueue consumer.
        async with DiskQueue(tmp_path, NAME, role="producer", max_msg_size=1000) as dq:
            await dq.put(b"plain")


async def test_a_consumer_purges_only_while_the_producer_role_is_free(tmp_path: Path) -> None:
    p = await AckQueue.open(tmp_path, NAME, role="producer")
    c = await AckQueue.open(tmp_path, NAME, role="consumer")
    await p.put_many([b"a", b"b"])
    with pytest.raises(RoleError, match=rf"process {os.getpid()} holds the producer role"):
        await c.purge()
    assert (await _get(c)).body == b"a"  # nothing dropped
    await p.aclose()
    await c.purge()
    with pytest.raises(QueueEmpty):
        c.get_nowait()
    await c.aclose()


async def test_a_consumer_sync_asked_during_a_read_is_not_lost(tmp_path: Path) -> None:
    # A sync() asked while the consumer's ioLoop reads was served only at the next change
    # of the producer's file (a second later when idle): each commit of an AckQueue
    # consumer, and its open, waited for it.
    async with DiskQueue(tmp_path, NAME, role="producer") as p, \
            DiskQueue(tmp_path, NAME, role="consumer") as c:
        await p.put(b"x")
        assert await asyncio.wait_for(c.get(), 10) == b"x"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(5):
            await c.sync()  # each right after the round before it: its read is running
        assert loop.time() - t0 < 2.5  # lost wake-ups: 1 s each


async def test_a_consumer_data_queue_held_closes_without_storing_its_position(
        tmp_path: Path) -> None:
    # What the AckQueue does when its final commit failed: the read position on disk
    # stays where the last commit put it, so the messages taken since come again.
    async with DiskQueue(tmp_path, NAME, role="producer") as p:
        await p.put_many([b"0", b"1", b"2"])
        c = await DiskQueue.open(tmp_path, NAME, role="consumer")
        await c.sync()
        assert [await c.get(), await c.get()] == [b"0", b"1"]
        c._hold_meta()
        await c.aclose()
        async with DiskQueue(tmp_path, NAME, role="consumer") as c:
            assert await asyncio.wait_for(c.get(), 10) == b"0"
        async with DiskQueue(tmp_path, NAME, role="consumer") as c:
            assert await asyncio.wait_for(c.get(), 10) == b"1"  # stored on close as usual
        with pytest.raises(RoleError, match="role='producer'"):
            p._hold_meta()


async def test_an_ack_consumer_whose_final_commit_fails_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodiskqueue.ack import pump as pump_mod

    async with AckQueue(tmp_path, NAME, role="producer") as p:
        await p.put_many([b"0", b"1", b"2"])
        c = await AckQueue.open(tmp_path, NAME, role="consumer")
        m0, m1 = await _get(c), await _get(c)
        await m0.finish()
        real = pump_mod.Pump.commit_now

        async def failing(self: pump_mod.Pump, resume: bool = True) -> None:
            raise OSError(5, "injected")

        monkeypatch.setattr(pump_mod.Pump, "commit_now", failing)
        await c.aclose()  # logged: the final commit failed; the data queue holds its meta
        monkeypatch.setattr(pump_mod.Pump, "commit_now", real)
        async with AckQueue(tmp_path, NAME, role="consumer") as c:
            await p.put(b"end")
            got = []
            while (m := await _get(c)).body != b"end":
                got.append(m.body)
                await m.finish()
        assert b"1" in got and b"2" in got and got.count(b"1") == 1
        assert m1.body == b"1"


# ---------------------------------------------------------------------- restarts


async def test_a_consumer_reopened_gets_only_what_was_not_finished(tmp_path: Path) -> None:
    p = await AckQueue.open(tmp_path, NAME, role="producer")
    c = await AckQueue.open(tmp_path, NAME, role="consumer")
    await p.put_many([b"%d" % i for i in range(10)])
    taken = [await _get(c) for _ in range(6)]
    for m in taken[:4]:
        await m.finish()
    await c.aclose()  # 4 and 5 stay in flight: delivered again
    await p.put_many([b"10", b"11"])  # the producer goes on meanwhile
    c = await AckQueue.open(tmp_path, NAME, role="consumer")
    got = []
    for _ in range(8):
        m = await _get(c)
        got.append(m.body)
        await m.finish()
    assert sorted(got, key=int) == [b"%d" % i for i in range(4, 12)]
    with pytest.raises(QueueEmpty):
        c.get_nowait()
    await c.aclose()
    await p.aclose()
    # After both closed, the whole queue opens with nothing left.
    async with AckQueue(tmp_path, NAME) as q:
        assert q.qsize() == 0 and q.statistics().deferred == 0


def test_the_sync_facade_takes_the_role(tmp_path: Path) -> None:
    with SyncAckQueue(tmp_path, NAME, role="producer") as p, \
            SyncAckQueue(tmp_path, NAME, role="consumer") as c:
        assert (p.role, c.role) == ("producer", "consumer")
        p.put(b"sync")
        m = c.get(timeout=10)
        assert m.body == b"sync"
        m.finish()
        with pytest.raises(RoleError, match="role='producer'"):
            p.get(timeout=1)
        with pytest.raises(RoleError, match="role='consumer'"):
            c.put(b"x")


# ---------------------------------------------------------------------- processes

_SELF = Path(__file__)


async def _spawn(tmp_path: Path, *args: str) -> asyncio.subprocess.Process:
    with (tmp_path / "stderr.txt").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(_SELF), *args, stdout=asyncio.subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert first == b"READY\n", (tmp_path / "stderr.txt").read_text()
    return proc


async def _lines_until(proc: asyncio.subprocess.Process, n: int, tag: str) -> list[str]:
    """Read the child's lines until ``n`` of them start with ``tag``."""
    assert proc.stdout is not None
    out: list[str] = []
    count = 0
    while count < n:
        raw = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert raw, "the child ended early"
        line = raw.decode().strip()
        out.append(line)
        count += line.startswith(tag)
    return out


async def _kill(proc: asyncio.subprocess.Process) -> list[str]:
    """SIGKILL the child once; the lines already in the pipe."""
    assert proc.stdout is not None
    proc.kill()
    rest = await asyncio.wait_for(proc.stdout.read(), 60)
    assert await proc.wait() == -signal.SIGKILL
    return rest.decode().split("\n")


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "kill_producer"), [("raw", True), ("nsq", True),
                                                    ("raw", False)],
                         ids=["raw-both-killed", "nsq-both-killed", "raw-producer-lives"])
async def test_killed_consumer_and_producer_processes_lose_nothing(
        tmp_path: Path, fmt: Literal["raw", "nsq"], kill_producer: bool) -> None:
    """A producer process puts; a consumer process finishes most and keeps some in flight;
    it is SIGKILLed mid-run, and so is the producer (or the next consumer opens beside the
    producer still putting). The next consumer gets every message whose put() returned and
    that was not finished, and the ones in flight at the kill again."""
    n = 3000
    producer = await _spawn(tmp_path, "produce", str(tmp_path), str(n), fmt)
    p_lines = await _lines_until(producer, 200, "P")
    consumer = await _spawn(tmp_path, "consume", str(tmp_path), fmt)
    c_lines = await _lines_until(consumer, 100, "F")
    c_lines += await _kill(consumer)  # mid-run: some in flight, some lingering
    p_lines += await _lines_until(producer, 200, "P")
    c = await AckQueue.open(tmp_path, NAME, role="consumer", format=fmt)
    try:
        if kill_producer:
            p_lines += await _kill(producer)  # perhaps mid-write: the next open cuts the tail
        else:
            assert producer.stdout is not None
            p_lines += (await asyncio.wait_for(producer.stdout.read(), 120)).decode().split("\n")
            assert await producer.wait() == 0
            assert f"P {n - 1}" in p_lines
        acknowledged = {ln.split()[1] for ln in p_lines if ln.startswith("P ")}
        finished = {ln.split()[1] for ln in c_lines if ln.startswith("F ")}
        kept = {ln.split()[1] for ln in c_lines if ln.startswith("T ")}
        assert kept and finished
        async with AckQueue(tmp_path, NAME, role="producer", format=fmt) as p:
            await p.put(b"end")  # after every other put
        got: set[str] = set()
        while (body := (m := await _get(c, 30)).body.decode()) != "end":
            await m.finish()
            got.add(body)
        await m.finish()
        with pytest.raises(QueueEmpty):
            c.get_nowait()
    finally:
        await c.aclose()
    lost = acknowledged - got - finished
    assert not lost, sorted(lost, key=int)[:10]
    assert kept <= got  # in flight at the kill: delivered again
    assert got <= {str(i) for i in range(n)}


async def _produce(directory: str, n: int, fmt: Literal["raw", "nsq"]) -> None:
    async with AckQueue(directory, NAME, role="producer", format=fmt,
                        sync_every=1) as p:
        print("READY", flush=True)
        for i in range(n):
            await p.put(b"%d" % i)
            print(f"P {i}", flush=True)
            if i % 50 == 0:
                await asyncio.sleep(0.005)  # the consumer catches up now and then


async def _consume(directory: str, fmt: Literal["raw", "nsq"]) -> None:
    async with AckQueue(directory, NAME, role="consumer", format=fmt,
                        msg_timeout=600.0, sync_interval=0.05) as c:
        print("READY", flush=True)
        kept = []
        async for m in c:
            body = m.body.decode()
            if int(body) % 5 == 0:
                kept.append(m)  # in flight until the kill
                print(f"T {body}", flush=True)
                continue
            await m.finish()
            print(f"F {body}", flush=True)


if __name__ == "__main__":
    mode, directory, *rest = sys.argv[1:]
    if mode == "produce":
        asyncio.run(_produce(directory, int(rest[0]), cast(Literal["raw", "nsq"], rest[1])))
    else:
        asyncio.run(_consume(directory, cast(Literal["raw", "nsq"], rest[0])))
    raise SystemExit(0)
