"""AckQueue: where a message made due again goes in the delivery order.

As nsqd: a message requeued for now, timed out, or whose requeue delay ends
goes behind every message queued at that moment and ahead of later ones.
Time is a ManualClock.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import MakeAck

from aiodiskqueue import AckQueue, Message, QueueEmpty
from aiodiskqueue.ack.clock import ManualClock


async def get(q: AckQueue) -> Message:
    """``q.get()`` with a guard against a hang (not a timing assertion)."""
    return await asyncio.wait_for(q.get(), 10)


@pytest.mark.parametrize("sync_every", [2500, 1], ids=["batched", "sync-every-1"])
async def test_requeue_now_goes_behind_what_is_queued(make_ack: MakeAck, sync_every: int) -> None:
    # nsqd 1.3.0, RDY 1, five queued, the first one requeued each time: m0 m1 m2 m3 m4 m0 ...
    q = await make_ack(max_in_flight=1, sync_every=sync_every)
    await q.put_many([b"m%d" % i for i in range(5)])
    seen = []
    for _ in range(12):
        m = await get(q)
        seen.append(m.body)
        await m.requeue(0)
    assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4"] * 2 + [b"m0", b"m1"]


async def test_poison_message_does_not_starve_the_others(make_ack: MakeAck) -> None:
    q = await make_ack(max_in_flight=1)
    await q.put_many([b"poison", b"a", b"b"])
    done = []
    for _ in range(6):
        m = await get(q)
        if m.body == b"poison":
            await m.requeue(0)
        else:
            done.append(m.body)
            await m.finish()
        if len(done) == 2:
            break
    assert done == [b"a", b"b"]


async def test_requeue_now_is_ahead_of_later_puts(make_ack: MakeAck) -> None:
    q = await make_ack()
    await q.put_many([b"a", b"b"])
    a = await get(q)
    await a.requeue(0)
    await q.put(b"c")
    assert [(await get(q)).body for _ in range(3)] == [b"b", b"a", b"c"]


async def test_requeue_now_with_nothing_queued_comes_back_at_once(make_ack: MakeAck) -> None:
    q = await make_ack()
    await q.put(b"only")
    m = await get(q)
    await m.requeue(0)
    m2 = await get(q)
    assert (m2.body, m2.attempts) == (b"only", 2)


async def test_timed_out_message_goes_behind_what_is_queued(make_ack: MakeAck,
                                                            clock: ManualClock) -> None:
    q = await make_ack(msg_timeout=10.0, max_in_flight=1)
    await q.put_many([b"slow", b"x", b"y"])
    m = await get(q)
    assert m.body == b"slow"
    clock.advance(10.0)
    assert not m.in_flight
    order = []
    for _ in range(3):
        m = await get(q)
        order.append((m.body, m.attempts))
        await m.finish()
    assert order == [(b"x", 1), (b"y", 1), (b"slow", 2)]


async def test_deferred_message_goes_behind_what_is_queued_when_due(
        make_ack: MakeAck, clock: ManualClock) -> None:
    q = await make_ack()
    await q.put(b"later", delay=1.0)
    await q.put_many([b"x", b"y"])
    clock.advance(1.0)
    # Its body is read back from the log first; wait for that (a message
    # published while it is being read may come first).
    for _ in range(1000):
        if q._dispatcher._behind:
            break
        await asyncio.sleep(0.01)
    await q.put(b"z")
    assert [(await get(q)).body for _ in range(4)] == [b"x", b"y", b"later", b"z"]


async def test_order_after_read_ahead(make_ack: MakeAck) -> None:
    # Many queued: some are read ahead into memory, the rest are still in the
    # data queue; the requeued one comes after all of them.
    q = await make_ack(max_in_flight=1)
    bodies = [b"%04d" % i for i in range(600)]
    await q.put_many(bodies)
    first = await get(q)
    await first.requeue(0)
    out = []
    for _ in range(600):
        m = await get(q)
        out.append(m.body)
        await m.finish()
    assert out == [*bodies[1:], bodies[0]]


async def test_requeued_message_waits_while_taking_is_paused_for_a_commit(
        make_ack: MakeAck) -> None:
    # While a commit pauses taking from the data queue, a requeued message does
    # not overtake the messages queued ahead of it.
    q = await make_ack()
    await q.put_many([b"m0", b"m1"])
    m0 = await get(q)
    await m0.requeue(0)
    q._pump.paused = True  # what commit_now() does while it syncs
    try:
        with pytest.raises(QueueEmpty):
            q.get_nowait()
    finally:
        q._pump.paused = False
    assert [(await get(q)).body for _ in range(2)] == [b"m1", b"m0"]
