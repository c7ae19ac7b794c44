"""Where the broker behaves as nsqd 1.3.0 does and NSQ clients rely on it.

Each test names the nsqd behaviour it checks; the figures in comments were
measured on nsqd 1.3.0.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession
from test_broker_support import (
    TIMEOUT,
    MakeBroker,
    RawClient,
    broker,
    channel_stats,
    connect,
    make_broker,
    raw_clients,
)

from aiodiskqueue.broker import BrokerServer
from aiodiskqueue.broker._protocol import FRAME_ERROR, FRAME_MESSAGE

__all__ = ["broker", "make_broker", "raw_clients"]


async def _post(server: BrokerServer, path: str, body: bytes = b"") -> tuple[int, str]:
    async with ClientSession() as s, s.post(f"http://127.0.0.1:{server.http_port}{path}",
                                            data=body) as resp:
        return resp.status, await resp.text()


async def _get_json(server: BrokerServer, path: str) -> object:
    async with ClientSession() as s, s.get(f"http://127.0.0.1:{server.http_port}{path}") as resp:
        return await resp.json()


# ---------------------------------------------------------------------- data loss


async def test_topic_delete_keeps_topic_x_dead(make_broker: MakeBroker,
                                               raw_clients: list[RawClient]) -> None:
    # nsqd keeps all 5 messages of zz.dead after deleting zz.
    server = await make_broker()
    assert (await _post(server, "/topic/create?topic=zz"))[0] == 200
    assert (await _post(server, "/topic/create?topic=zz.dead"))[0] == 200
    assert (await _post(server, "/mpub?topic=zz.dead", b"1\n2\n3\n4\n5"))[0] == 200
    assert (await _post(server, "/topic/delete?topic=zz"))[0] == 200
    await server.aclose()
    server = await make_broker()
    c = await connect(server.tcp_port, raw_clients)
    await c.sub("zz.dead", "ch", rdy=5)
    assert sorted([(await c.read()).body for _ in range(5)]) == [b"1", b"2", b"3", b"4", b"5"]


async def test_channel_delete_keeps_channel_x_dead(make_broker: MakeBroker,
                                                   raw_clients: list[RawClient]) -> None:
    server = await make_broker(max_attempts=1)
    await _post(server, "/topic/create?topic=t")
    for ch in ("c", "c.dead"):
        assert (await _post(server, f"/channel/create?topic=t&channel={ch}"))[0] == 200
    await _post(server, "/mpub?topic=t", b"a\nb")
    # Channel c dead-letters one message (max_attempts=1), then is deleted.
    c = await connect(server.tcp_port, raw_clients)
    await c.sub("t", "c")
    m = await c.read()
    c.send(b"REQ " + m.msg_id + b" 0")
    store = server.broker.topics["t"].channels["c"].store
    for _ in range(int(TIMEOUT * 100)):
        if store.stats().dead_lettered == 1:
            break
        await asyncio.sleep(0.01)
    assert (await _post(server, "/channel/delete?topic=t&channel=c"))[0] == 200
    await server.aclose()
    server = await make_broker(max_attempts=1)
    d = await connect(server.tcp_port, raw_clients)
    await d.sub("t", "c.dead", rdy=2)
    assert sorted([(await d.read()).body for _ in range(2)]) == [b"a", b"b"]


# ---------------------------------------------------------------------- REQ


async def test_req_0_puts_the_message_at_the_back(broker: BrokerServer,
                                                  raw_clients: list[RawClient]) -> None:
    # nsqd: RDY 1, five queued, the first requeued every time: m0 m1 m2 m3 m4 m0 ...
    await _post(broker, "/topic/create?topic=rq")
    await _post(broker, "/channel/create?topic=rq&channel=ch")
    await _post(broker, "/mpub?topic=rq", b"m0\nm1\nm2\nm3\nm4")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rq", "ch", rdy=1)
    seen = []
    for _ in range(7):
        m = await c.read()
        assert m.type == FRAME_MESSAGE, m
        seen.append(m.body)
        c.send(b"REQ " + m.msg_id + b" 0")
    assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m0", b"m1"]
