"""``aiodiskqueue.sync``: the blocking facade used from many threads, alone and shared
with tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import queue as stdqueue
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import aiodiskqueue
from aiodiskqueue import DiskQueueError, MessageSizeError, QueueClosed, QueueEmpty, QueueFull
from aiodiskqueue.serializers import MissingExtra
from aiodiskqueue.sync import DiskQueue, Empty, Full, LoopThreadError


def until(pred: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Wait for a condition another thread brings about (fails after ``limit`` seconds)."""
    end = time.monotonic() + limit
    while not pred():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


def run_threads(target: Callable[[int], None], n: int) -> list[None]:
    """Run ``target(i)`` on ``n`` threads at once; re-raise the first error."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(target, i) for i in range(n)]
        return [f.result(timeout=120) for f in futures]


def waiting_getters(q: DiskQueue) -> int:
    return q._peek(lambda: len(q.queue._e.getters))


def loop_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"aiodiskqueue-sync-{name}"]


@pytest.fixture
def sq(tmp_path: Path) -> Iterator[DiskQueue]:
    q = DiskQueue(tmp_path, "sync")
    try:
        yield q
    finally:
        q.close()


# ---------------------------------------------------------------------- basics


def test_put_get_and_sizes(sq: DiskQueue) -> None:
    assert sq.empty() and sq.qsize() == 0 and len(sq) == 0
    sq.put(b"a")
    sq.put(bytearray(b"b"))
    sq.put_many([b"c", memoryview(b"d")])
    assert sq.qsize() == 4 and not sq.empty() and not sq.full()
    assert sq.get() == b"a"
    assert sq.get(timeout=5) == b"b"
    assert sq.get_many(10) == [b"c", b"d"]
    st = sq.statistics()
    assert (st.puts, st.gets, st.depth) == (4, 4, 0)
    assert sq.name == "sync" and sq.maxsize == 0


def test_put_returns_once_written_to_the_os(sq: DiskQueue, tmp_path: Path) -> None:
    sq.put(b"hello")
    # 4-byte big-endian length, then the payload, readable while the queue is open.
    data = (tmp_path / "sync.diskqueue.000000.dat").read_bytes()
    assert data == b"\x00\x00\x00\x05hello"


def test_iteration_ends_after_shutdown_and_drain(sq: DiskQueue) -> None:
    sq.put_many([b"1", b"2", b"3"])
    sq.shutdown()
    assert list(sq) == [b"1", b"2", b"3"]
    with pytest.raises(QueueClosed):
        sq.put(b"4")


def test_errors_are_the_cores(tmp_path: Path) -> None:
    with DiskQueue(tmp_path, "small", max_msg_size=4) as small:
        with pytest.raises(MessageSizeError, match="message of 5 bytes"):
            small.put(b"12345")
        with pytest.raises(MessageSizeError):
            small.put_nowait(b"12345")
        assert small.qsize() == 0


def test_errors_of_arguments(sq: DiskQueue) -> None:
    with pytest.raises(TypeError):
        sq.put("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_items must be >= 1, got 0"):
        sq.get_many(0)
    with pytest.raises(ValueError, match="timeout must be >= 0 or None, got -1"):
        sq.get(timeout=-1)
    with pytest.raises(TypeError, match="timeout must be a number or None, got 'x'"):
        sq.get(timeout="x")  # type: ignore[arg-type]


def test_bad_options_and_locked_queue_raise_and_leave_no_thread(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sync_every must be >= 1, got 0"):
        DiskQueue(tmp_path, "bad", sync_every=0)
    with DiskQueue(tmp_path, "held"), pytest.raises(aiodiskqueue.QueueLocked):
        DiskQueue(tmp_path, "held")
    until(lambda: not loop_threads("bad"), "the failed facades' loop threads to end")


# ---------------------------------------------------------------------- timeouts


def test_get_timeout_raises_empty_of_both_kinds(sq: DiskQueue) -> None:
    with pytest.raises(stdqueue.Empty):
        sq.get(timeout=0.01)
    with pytest.raises(QueueEmpty):
        sq.get(timeout=0)
    with pytest.raises(Empty, match="no message ready"):
        sq.get(block=False)
    with pytest.raises(Empty):
        sq.get_nowait()
    with pytest.raises(Empty, match=re.escape("no message within 0.01 s")):
        sq.get_many(5, timeout=0.01)
    sq.put(b"late")
    assert sq.get(timeout=10) == b"late"  # the timed-out gets took nothing
    assert sq.statistics().gets == 1


def test_timed_out_gets_racing_puts_lose_nothing(sq: DiskQueue) -> None:
    """Consumers whose gets time out all the time, while a producer puts: all arrive once."""
    n = 2000
    got: list[list[bytes]] = [[] for _ in range(4)]
    timeouts = [0]
    done = threading.Event()

    def producer() -> None:
        for i in range(n):
            sq.put(b"%d" % i)
        done.set()

    def consumer(i: int) -> None:
        while not (done.is_set() and sq.empty()):
            try:
                got[i].append(sq.get(timeout=0.0005))
            except Empty:
                timeouts[0] += 1

    prod = threading.Thread(target=producer)
    prod.start()
    run_threads(consumer, 4)
    prod.join()
    everything = [m for part in got for m in part]
    assert sorted(everything, key=int) == [b"%d" % i for i in range(n)]
    for part in got:  # each consumer sees the queue's order
        assert [int(m) for m in part] == sorted(int(m) for m in part)
    assert timeouts[0] > 0  # the race was really run
    assert sq.statistics().gets == n


# ---------------------------------------------------------------------- many threads


@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_threads_put_and_get_every_message_once_in_producer_order(
        tmp_path: Path, uvloop: bool) -> None:
    producers, consumers, per = 8, 8, 500
    got: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]
    with DiskQueue(tmp_path, "many", uvloop=uvloop) as q:
        if uvloop:
            import uvloop as uv

            assert isinstance(q.loop, uv.Loop)

        def consume(i: int) -> None:
            for m in q:
                p, k = m.split(b":")
                got[i].append((int(p), int(k)))

        cons = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
        for t in cons:
            t.start()
        def produce(p: int) -> None:
            for k in range(per):
                q.put(b"%d:%d" % (p, k))

        run_threads(produce, producers)
        q.shutdown()  # the consumers drain what is left, then their loops end
        for t in cons:
            t.join(120)
            assert not t.is_alive()
        assert q.statistics().gets == producers * per
    everything = sorted(x for part in got for x in part)
    assert everything == [(p, k) for p in range(producers) for k in range(per)]
    for part in got:
        for p in range(producers):
            ks = [k for pp, k in part if pp == p]
            assert ks == sorted(ks), f"producer {p} out of order"


def test_messages_put_from_threads_survive_reopen(tmp_path: Path) -> None:
    with DiskQueue(tmp_path, "re") as q:
        run_threads(lambda p: q.put_many([b"%d-%d" % (p, k) for k in range(50)]), 8)
    with DiskQueue(tmp_path, "re") as q:
        assert q.qsize() == 400
        assert len(set(q.get_many(400))) == 400


# ---------------------------------------------------------------------- bounded queues


def test_bounded_put_block_false_and_timeout_raise_full(tmp_path: Path) -> None:
    with DiskQueue(tmp_path, "b", maxsize=2) as q:
        q.put(b"1")
        q.put_nowait(b"2")
        assert q.full()
        with pytest.raises(stdqueue.Full):
            q.put(b"3", block=False)
        with pytest.raises(QueueFull, match="maxsize=2"):
            q.put(b"3", timeout=0.01)
        with pytest.raises(Full):
            q.put_nowait(b"3")
        assert q.qsize() == 2  # nothing of the refused puts was stored

        t = threading.Thread(target=q.put, args=(b"4",))
        t.start()
        until(lambda: q._peek(lambda: len(q.queue._e.putters)) == 1, "the put to wait")
        assert q.get() == b"1"
        t.join(30)
        assert [q.get(), q.get()] == [b"2", b"4"]

        waiter = threading.Thread(target=q.put_many, args=([b"5", b"6"],))
        waiter.start()
        waiter.join(30)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            timed = pool.submit(q.put, b"7", timeout=30)
            assert q.get() == b"5"  # room: the timed put goes in well before its timeout
            timed.result(30)
        assert [q.get(), q.get()] == [b"6", b"7"]


# ---------------------------------------------------------------------- closing


def test_close_wakes_blocked_getters_with_queue_closed(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, "c")
    outcomes: list[QueueClosed | bytes] = []

    def getter(_: int) -> None:
        try:
            outcomes.append(q.get())
        except QueueClosed as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=getter, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    until(lambda: waiting_getters(q) == 6, "six blocked getters")
    closer = threading.Thread(target=q.close)  # closing from yet another thread
    closer.start()
    closer.join(30)
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert len(outcomes) == 6 and all(isinstance(o, QueueClosed) for o in outcomes)
    assert not loop_threads("c")
    q.close()  # idempotent
    with pytest.raises(QueueClosed, match="'c' is closed"):
        q.put(b"x")
    with pytest.raises(QueueClosed):
        q.qsize()
    with DiskQueue(tmp_path, "c") as again:  # the lock was released
        assert again.empty()


def test_close_from_many_threads_at_once(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, "cc")
    q.put(b"kept")
    run_threads(lambda _: q.close(), 8)
    assert q.closed
    with DiskQueue(tmp_path, "cc") as again:
        assert again.get() == b"kept"


def drop(holder: list[DiskQueue]) -> None:
    """Forget the facade and wait until its finalizer ran (the loop thread may hold it a
    moment, in a callback that has not quite finished; the recorded warning keeps it)."""
    ref = weakref.ref(holder.pop())

    def finalized() -> bool:
        gc.collect()
        q = ref()
        return q is None or q.closed

    until(finalized, "the facade to be collected")


def test_unclosed_facade_warns_and_releases_its_files(tmp_path: Path) -> None:
    holder = [DiskQueue(tmp_path, "leak")]
    holder[0].put(b"x")
    with pytest.warns(ResourceWarning, match="unclosed <sync <DiskQueue 'leak'"):
        drop(holder)
    until(lambda: not loop_threads("leak"), "the leaked facade's thread to end")
    with DiskQueue(tmp_path, "leak") as again:
        assert again.get() == b"x"


def test_uvloop_false_default_is_asyncio(sq: DiskQueue) -> None:
    assert type(sq.loop).__module__.startswith("asyncio")


# ---------------------------------------------------------------------- shared with tasks


async def test_threads_and_tasks_share_one_queue(tmp_path: Path) -> None:
    producers, per = 8, 200
    async with aiodiskqueue.DiskQueue(tmp_path, "shared") as aq:
        sq = DiskQueue.attach(aq)
        assert sq.queue is aq and sq.loop is asyncio.get_running_loop()
        got_threads: list[list[bytes]] = [[] for _ in range(4)]
        got_tasks: list[list[bytes]] = [[] for _ in range(4)]

        def thread_consumer(i: int) -> None:
            for m in sq:
                got_threads[i].append(m)

        async def task_consumer(i: int) -> None:
            async for m in aq:
                got_tasks[i].append(m)

        def thread_producer(p: int) -> None:
            for k in range(per):
                sq.put(b"t%d:%d" % (p, k))

        async def task_producer(p: int) -> None:
            for k in range(per):
                await aq.put(b"a%d:%d" % (p, k))

        consumers = [asyncio.create_task(task_consumer(i)) for i in range(4)]
        consumers += [asyncio.create_task(asyncio.to_thread(thread_consumer, i))
                      for i in range(4)]
        await asyncio.gather(*(asyncio.to_thread(thread_producer, p) for p in range(producers)),
                             *(task_producer(p) for p in range(producers)))
        aq.shutdown()
        await asyncio.gather(*consumers)
        sq.close()
        assert not aq.statistics().depth
    everything = [m for part in got_threads + got_tasks for m in part]
    expected = [b"%s%d:%d" % (w, p, k) for w in (b"t", b"a") for p in range(producers)
                for k in range(per)]
    assert sorted(everything) == sorted(expected)
    assert any(got_threads) and any(got_tasks)
    for part in got_threads + got_tasks:
        for w in (b"t", b"a"):
            for p in range(producers):
                ks = [int(m.split(b":")[1]) for m in part if m.startswith(b"%s%d:" % (w, p))]
                assert ks == sorted(ks)


async def test_async_owner_closing_wakes_sync_getters(tmp_path: Path) -> None:
    aq = await aiodiskqueue.DiskQueue.open(tmp_path, "own")
    sq = DiskQueue.attach(aq)
    getters = [asyncio.create_task(asyncio.to_thread(sq.get)) for _ in range(3)]
    while len(aq._e.getters) < 3:
        await asyncio.sleep(0.001)
    await aq.aclose()
    for g in getters:
        with pytest.raises(QueueClosed):
            await g


async def test_detaching_cancels_only_the_facades_calls(tmp_path: Path) -> None:
    async with aiodiskqueue.DiskQueue(tmp_path, "det") as aq:
        sq = DiskQueue.attach(aq)
        blocked = asyncio.create_task(asyncio.to_thread(sq.get))
        own_getter = asyncio.create_task(aq.get())
        while len(aq._e.getters) < 2:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(sq.close)
        with pytest.raises(QueueClosed, match="closed during the call"):
            await blocked
        with pytest.raises(QueueClosed, match="is closed"):
            await asyncio.to_thread(sq.put, b"x")
        await aq.put(b"still open")
        assert await own_getter == b"still open"  # the detached get took nothing


async def test_blocking_call_on_the_loop_thread_raises(tmp_path: Path) -> None:
    async with aiodiskqueue.DiskQueue(tmp_path, "lt") as aq:
        sq = DiskQueue.attach(aq)
        with pytest.raises(LoopThreadError, match="use the async queue there"):
            sq.put(b"x")
        assert sq.qsize() == 0  # quick reads run in place
        sq.close()  # an attached facade does not wait: it may close here
        with pytest.raises(QueueClosed):
            await asyncio.to_thread(sq.get)
        assert isinstance(LoopThreadError("x"), DiskQueueError)


def test_attach_without_a_loop_raises(tmp_path: Path) -> None:
    aq = aiodiskqueue.DiskQueue(tmp_path, "nl")
    with pytest.raises(DiskQueueError, match=re.escape("attach() needs the loop")):
        DiskQueue.attach(aq)


def test_calls_after_the_loop_closed_raise_queue_closed(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    aq = loop.run_until_complete(aiodiskqueue.DiskQueue.open(tmp_path, "gone"))
    sq = DiskQueue.attach(aq, loop)
    loop.run_until_complete(aq.aclose())
    loop.close()
    with pytest.raises(QueueClosed, match="event loop is closed"):
        sq.put(b"x")


def test_a_bad_message_among_gathered_puts_fails_only_its_own_put(tmp_path: Path) -> None:
    """Puts from many threads go to the loop together; one bad message spoils no other."""
    failures: list[BaseException] = []
    lock = threading.Lock()
    with DiskQueue(tmp_path, "mix", max_msg_size=16) as q:
        def produce(p: int) -> None:
            for k in range(200):
                bad: object = b"x" * 17 if k % 50 == 7 else "text" if k % 50 == 8 else None
                try:
                    q.put(bad if bad is not None else b"%d:%d" % (p, k))  # type: ignore[arg-type]
                except (MessageSizeError, TypeError) as exc:
                    with lock:
                        failures.append(exc)

        run_threads(produce, 8)
        got = q.get_many(10_000)
        while q.qsize():
            got += q.get_many(10_000)
    assert len(failures) == 8 * 4 * 2
    assert sum(isinstance(e, MessageSizeError) for e in failures) == 8 * 4
    expected = [(p, k) for p in range(8) for k in range(200) if k % 50 not in (7, 8)]
    pairs = [tuple(map(int, m.split(b":"))) for m in got]
    assert sorted(pairs) == expected
    for p in range(8):
        ks = [k for pp, k in pairs if pp == p]
        assert ks == sorted(ks)


def test_uvloop_true_without_uvloop_raises_missing_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(MissingExtra, match=r'uvloop=True needs uvloop: pip install'):
        DiskQueue(tmp_path, "nouv", uvloop=True)


def _put_until_closed(q: DiskQueue, p: int, returned: list[bytes], lock: threading.Lock) -> None:
    for k in range(100_000):
        m = b"%d:%d" % (p, k)
        try:
            q.put(m)
        except QueueClosed:
            return
        with lock:
            returned.append(m)


def test_close_while_threads_put_stores_every_put_that_returned(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path, "pc")
    returned: list[bytes] = []
    lock = threading.Lock()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_put_until_closed, q, p, returned, lock) for p in range(8)]
        until(lambda: len(returned) >= 400, "some puts to return")
        q.close()
        for f in futures:
            f.result(60)  # every thread ended: none hangs on a put the close cut off
    with DiskQueue(tmp_path, "pc") as again:
        stored: list[bytes] = []
        while again.qsize():
            stored += again.get_many(100_000)
    assert set(returned) <= set(stored)
    assert len(stored) == len(set(stored))


async def test_detaching_while_threads_put_leaves_no_thread_hanging(tmp_path: Path) -> None:
    async with aiodiskqueue.DiskQueue(tmp_path, "pd") as aq:
        sq = DiskQueue.attach(aq)
        returned: list[bytes] = []
        lock = threading.Lock()
        putters = [asyncio.create_task(asyncio.to_thread(_put_until_closed, sq, p, returned,
                                                         lock)) for p in range(8)]
        while len(returned) < 400:
            await asyncio.sleep(0.002)
        sq.close()
        await asyncio.wait_for(asyncio.gather(*putters), 60)
        await aq.put(b"after")  # the queue itself stays open
        stored = []
        while aq.qsize():
            stored += await aq.get_many(100_000)
    assert set(returned) <= set(stored) and stored[-1] == b"after"


async def test_detaching_before_a_gathered_put_started_releases_its_thread(
        tmp_path: Path) -> None:
    """The loop is kept busy while a thread's put is gathered; the facade is closed before the
    write task's first step: the thread must raise QueueClosed, not wait forever."""
    async with aiodiskqueue.DiskQueue(tmp_path, "early") as aq:
        sq = DiskQueue.attach(aq)
        putter = asyncio.create_task(asyncio.to_thread(sq.put, b"x"))
        await asyncio.sleep(0)  # let the executor thread start
        end = time.monotonic() + 30
        while not sq._batch and time.monotonic() < end:  # the loop does not turn meanwhile
            time.sleep(0.001)
        assert sq._batch, "the put was not gathered"
        sq.close()  # on the loop thread: scheduled right after the drain of the put
        with pytest.raises(QueueClosed, match="closed during the call"):
            await asyncio.wait_for(putter, 30)
