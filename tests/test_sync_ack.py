"""``aiodiskqueue.sync.AckQueue``: deliveries finished and requeued from many threads."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from pathlib import Path

import pytest

import aiodiskqueue
from aiodiskqueue import MessageNotInFlight, QueueClosed
from aiodiskqueue.sync import AckQueue, Empty, LoopThreadError, Message


def test_put_get_finish_and_statistics(tmp_path: Path) -> None:
    with AckQueue(tmp_path, "a") as q:
        q.put(b"one")
        q.put_many([b"two", b"three"])
        assert q.qsize() == 3 and not q.empty()
        m = q.get()
        assert isinstance(m, Message) and m.body == b"one" and m.attempts == 1
        assert len(m.id) == 16 and m.in_flight
        m.finish()
        assert not m.in_flight
        with pytest.raises(MessageNotInFlight):
            m.finish()
        m2 = q.get(timeout=5)
        assert m2.body == b"two"
        m2.touch()
        m2.requeue()
        rest = [q.get(timeout=5), q.get(timeout=5)]
        assert sorted((m.body, m.attempts) for m in rest) == [(b"three", 1), (b"two", 2)]
        again = next(m for m in rest if m.body == b"two")
        again.finish()
        st = q.statistics()
        assert (st.finished, st.requeued, st.in_flight, st.depth) == (2, 1, 1, 0)


def test_get_timeout_delivers_nothing(tmp_path: Path) -> None:
    with AckQueue(tmp_path, "t") as q:
        with pytest.raises(Empty, match=re.escape("no message within 0.01 s")):
            q.get(timeout=0.01)
        with pytest.raises(Empty, match="no message ready"):
            q.get(block=False)
        q.put(b"x")
        m = q.get(timeout=10)
        assert m.attempts == 1  # the timed-out gets delivered nothing
        st = q.statistics()
        assert (st.delivered, st.in_flight) == (1, 1)
        m.finish()


def test_with_block_finishes_or_requeues(tmp_path: Path) -> None:
    with AckQueue(tmp_path, "w") as q:
        q.put_many([b"ok", b"bad"])
        with q.get() as m:
            assert m.body == b"ok"
        with pytest.raises(RuntimeError, match="handler failed"), q.get() as m:
            raise RuntimeError("handler failed")
        st = q.statistics()
        assert (st.finished, st.requeued, st.deferred) == (1, 1, 1)  # requeued with backoff


def test_threads_finish_and_requeue_every_message_exactly_once(tmp_path: Path) -> None:
    n, workers = 400, 8
    finished: Counter[bytes] = Counter()
    lock = threading.Lock()
    with AckQueue(tmp_path, "mt", max_in_flight=64) as q:
        q.put_many([b"%d" % i for i in range(n)])

        def work() -> None:
            for m in q:
                if m.attempts == 1 and int(m.body) % 3 == 0:
                    m.requeue()  # every third message goes round once more
                    continue
                m.finish()
                with lock:
                    finished[m.body] += 1

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for t in threads:
            t.start()
        while True:
            st = q.statistics()
            if st.finished == n:
                break
            threading.Event().wait(0.005)
        q.close()  # the workers' loops end with the queue
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    assert finished == Counter(b"%d" % i for i in range(n))
    assert st.requeued == len(range(0, n, 3))
    assert st.in_flight == 0 and st.depth == 0


def test_in_flight_messages_come_back_after_reopen(tmp_path: Path) -> None:
    with AckQueue(tmp_path, "r") as q:
        q.put_many([b"a", b"b"])
        q.get().finish()
        q.get()  # left in flight
    with AckQueue(tmp_path, "r") as q:
        m = q.get(timeout=10)
        assert (m.body, m.attempts) == (b"b", 2)
        m.finish()


def test_close_wakes_blocked_getters(tmp_path: Path) -> None:
    q = AckQueue(tmp_path, "c")
    out: list[QueueClosed] = []

    def getter() -> None:
        try:
            q.get()
        except QueueClosed as exc:
            out.append(exc)

    threads = [threading.Thread(target=getter) for _ in range(4)]
    for t in threads:
        t.start()
    while q._peek(lambda: q.queue._dispatcher.n_getters()) < 4:
        threading.Event().wait(0.002)
    q.close()
    for t in threads:
        t.join(30)
    assert len(out) == 4 and all(isinstance(e, QueueClosed) for e in out)


def test_dead_letters_and_attach(tmp_path: Path) -> None:
    async def main() -> None:
        async with aiodiskqueue.AckQueue(tmp_path, "dl", max_attempts=1) as aq:
            sq = AckQueue.attach(aq)

            def in_thread() -> bytes:
                sq.put(b"doomed")
                sq.get().requeue()
                with pytest.raises(Empty):
                    sq.get(timeout=0.05)  # dead-lettered on its next delivery
                dead = sq.dead_letters
                return dead.get(timeout=10)

            assert await asyncio.to_thread(in_thread) == b"doomed"
            assert aq.statistics().dead_lettered == 1
            sq.close()
            await aq.put(b"alive")  # detaching left the queue open
            assert (await aq.get()).body == b"alive"

    asyncio.run(main())


def test_closing_an_owned_facade_on_its_loop_raises(tmp_path: Path) -> None:
    with AckQueue(tmp_path, "own") as q:
        async def close_here() -> None:
            q.close()

        with pytest.raises(LoopThreadError, match="use aclose"):
            asyncio.run_coroutine_threadsafe(close_here(), q.loop).result()
        assert not q.closed
