"""hand_back: an AckQueue's unfinished messages moved into its data queue, as nsqd reads it.

The data queue is read back with the independent go-diskqueue reader of
helpers_format and the nsqd message header decoded by hand (8-byte
timestamp, 2-byte attempts, 16-byte id, then the body).
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from helpers_format import read_queue

from aiodiskqueue import AckQueue, QueueLocked
from aiodiskqueue.ack.export import hand_back

WAIT = 10.0


def nsqd_message(payload: bytes) -> tuple[int, int, bytes, bytes]:
    ts, attempts, msg_id = struct.unpack_from(">qH16s", payload)
    return ts, attempts, msg_id, payload[26:]


async def _leave_unfinished(tmp_path: Path) -> dict[bytes, tuple[int, bytes]]:
    """Five published: m0 finished, m1 in flight, m2 deferred after 2 deliveries, m3 m4 unread."""
    async with AckQueue(tmp_path, "t:c", format="nsq", max_bytes_per_file=200) as q:
        await q.put_many([b"m0", b"m1", b"m2"])
        m0 = await asyncio.wait_for(q.get(), WAIT)
        m1 = await asyncio.wait_for(q.get(), WAIT)
        m2 = await asyncio.wait_for(q.get(), WAIT)
        await m0.finish()
        await m2.requeue(0)
        m2 = await asyncio.wait_for(q.get(), WAIT)
        assert (m2.body, m2.attempts) == (b"m2", 2)
        await m2.requeue(600.0)
        await q.put_many([b"m3", b"m4"])
        ids = {m.id.encode(): (m.attempts, m.body) for m in (m1, m2)}
        # Closed with m1 in flight and m2 deferred: both only in the ack log.
    return ids


async def test_unfinished_messages_go_behind_the_unread_ones_with_attempts(tmp_path: Path) -> None:
    logged = await _leave_unfinished(tmp_path)
    before = read_queue(tmp_path, "t:c")
    assert [nsqd_message(p)[3] for p in before] == [b"m3", b"m4"]
    assert await hand_back(tmp_path, "t:c", max_bytes_per_file=200) == 2
    after = [nsqd_message(p) for p in read_queue(tmp_path, "t:c")]
    assert [m[3] for m in after] == [b"m3", b"m4", b"m1", b"m2"]
    assert [m[1] for m in after] == [0, 0, 1, 2]  # attempts as nsqd counts them: deliveries
    assert {m[2]: (m[1], m[3]) for m in after[2:]} == logged
    # Nothing left in the log: the queue itself now delivers each once.
    async with AckQueue(tmp_path, "t:c", format="nsq", max_bytes_per_file=200) as q:
        got: list[tuple[bytes, int]] = []
        while len(got) < 4:
            m = await asyncio.wait_for(q.get(), WAIT)
            got.append((m.body, m.attempts))
            await m.finish()
        assert got == [(b"m3", 1), (b"m4", 1), (b"m1", 2), (b"m2", 3)]
        assert q.statistics().depth == 0


async def test_nothing_to_hand_back(tmp_path: Path) -> None:
    async with AckQueue(tmp_path, "q", format="nsq") as q:
        await q.put(b"x")
    assert await hand_back(tmp_path, "q") == 0
    assert [nsqd_message(p)[3] for p in read_queue(tmp_path, "q")] == [b"x"]


async def test_hand_back_refuses_an_open_queue(tmp_path: Path) -> None:
    async with AckQueue(tmp_path, "q", format="nsq"):
        with pytest.raises(QueueLocked):
            await hand_back(tmp_path, "q")
