"""export-for-nsqd: a stopped broker's in-flight and deferred messages, handed to nsqd's disk queue.

Read back with the independent go-diskqueue reader (helpers_format) and the
nsqd message header decoded by hand, as nsqd reads a channel's disk queue.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from helpers_format import read_queue
from test_broker_support import MakeBroker, RawClient, connect, make_broker, raw_clients

from aiodiskqueue.broker.__main__ import main

__all__ = ["make_broker", "raw_clients"]


async def _export(data_dir: Path) -> int:
    """The command line, in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(main, ["export-for-nsqd", str(data_dir)])


def _bodies_and_attempts(data_dir: Path, name: str) -> dict[bytes, int]:
    out = {}
    for p in read_queue(data_dir, name):
        _, attempts, _ = struct.unpack_from(">qH16s", p)
        out[p[26:]] = attempts
    return out


async def test_export_moves_in_flight_and_deferred_into_the_disk_queue(
        make_broker: MakeBroker, raw_clients: list[RawClient], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = await make_broker(max_body_size=1 << 20)
    p = await connect(server.tcp_port, raw_clients)
    c = await connect(server.tcp_port, raw_clients)
    await c.sub("t", "c", rdy=0)
    bodies = [b"%03d" % i for i in range(100)]
    p.send(b"MPUB t", struct.pack(">i", len(bodies))
           + b"".join(struct.pack(">i", len(b)) + b for b in bodies))
    await p.expect_ok()
    c.send(b"RDY 60")
    got = [await c.read() for _ in range(60)]
    c.send(b"RDY 0")  # nothing more is delivered
    for m in got[:30]:
        c.send(b"FIN " + m.msg_id)
    for m in got[30:40]:
        c.send(b"REQ " + m.msg_id + b" 600000")  # deferred 10 minutes
    await c.pub("other", b"round trip")  # FIN and REQ handled before this OK
    data_dir = Path(server.broker.data_dir)
    # The broker still running: its queues are locked.
    assert await _export(data_dir) == 1
    await server.aclose()  # the 20 still in flight are requeued, in the ack log only
    unread = _bodies_and_attempts(data_dir, "t:c")
    assert sorted(unread) == sorted(bodies[60:])  # without the export nsqd sees only these
    capsys.readouterr()

    assert await _export(data_dir) == 0
    assert "t:c: 30 message(s) moved" in capsys.readouterr().out
    handed = _bodies_and_attempts(data_dir, "t:c")
    assert sorted(handed) == sorted(bodies[30:])  # everything not finished
    assert {b: handed[b] for b in bodies[30:60]} == dict.fromkeys(bodies[30:60], 1)
    assert {b: handed[b] for b in bodies[60:]} == dict.fromkeys(bodies[60:], 0)

    # A second export finds nothing; the broker reopens the directory as it was.
    assert await _export(data_dir) == 0
    assert "t:c: 0 message(s)" in capsys.readouterr().out
    server = await make_broker(max_body_size=1 << 20)
    st = server.broker.stats("t", "c")["topics"][0]["channels"][0]
    assert (st["depth"], st["in_flight_count"], st["deferred_count"]) == (70, 0, 0)
