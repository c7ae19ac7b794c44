"""The broker driven by ansq, an asyncio NSQ client from PyPI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ansq import ConnectionFeatures, ConnectionOptions, open_connection
from ansq.tcp.connection import NSQConnection
from ansq.tcp.types import NSQErrorSchema, NSQMessage
from ansq.typedefs import TCPResponse
from test_broker_support import TIMEOUT, broker, channel_stats, eventually, make_broker

from aiodiskqueue.broker import BrokerServer

__all__ = ["broker", "make_broker"]

OPTIONS = ConnectionOptions(auto_reconnect=False)


@pytest.fixture
async def conns() -> AsyncIterator[list[NSQConnection]]:
    """ansq connections opened by a test; all closed at the end."""
    opened: list[NSQConnection] = []
    try:
        yield opened
    finally:
        for c in opened:
            if not c.is_closed:
                await c.close()


async def _open(b: BrokerServer, conns: list[NSQConnection], **features: Any) -> NSQConnection:
    opts = OPTIONS
    if features:
        opts = ConnectionOptions(auto_reconnect=False, features=ConnectionFeatures(**features))
    c = await open_connection("127.0.0.1", b.tcp_port, connection_options=opts)
    conns.append(c)
    return c


def _ok(resp: TCPResponse) -> bool:
    return resp is not None and resp.is_ok


async def _next(c: NSQConnection) -> NSQMessage:
    msg = await asyncio.wait_for(c.wait_for_message(), TIMEOUT)
    assert msg is not None
    return msg


async def test_identify_negotiates_features(
    broker: BrokerServer, conns: list[NSQConnection]
) -> None:
    c = await _open(broker, conns, msg_timeout=5000)
    assert c.is_connected
    assert _ok(await c.sub("identify", "ch"))
    clients = broker.broker.stats("identify", "ch")["topics"][0]["channels"][0]["clients"]
    assert clients[0]["msg_timeout"] == 5000  # the client's own timeout applies
    assert clients[0]["user_agent"].startswith("ansq/")


async def test_publish_and_consume(broker: BrokerServer, conns: list[NSQConnection]) -> None:
    w = await _open(broker, conns)
    r = await _open(broker, conns)
    await r.subscribe("orders", "billing", 10)
    assert _ok(await w.pub("orders", b"one"))
    assert _ok(await w.mpub("orders", b"two", b"three"))
    got = []
    for _ in range(3):
        m = await _next(r)
        got.append(m.body)
        assert m.attempts == 1
        await m.fin()
    assert sorted(got) == [b"one", b"three", b"two"]
    await eventually(lambda: channel_stats(broker, "orders", "billing")["finish_count"] == 3)
    assert channel_stats(broker, "orders", "billing")["depth"] == 0


async def test_req_then_fin(broker: BrokerServer, conns: list[NSQConnection]) -> None:
    w = await _open(broker, conns)
    r = await _open(broker, conns)
    await r.subscribe("retry", "ch", 1)
    await w.pub("retry", b"flaky")
    m1 = await _next(r)
    await m1.req(timeout=0)
    m2 = await _next(r)
    assert (m2.id, m2.body, m2.attempts) == (m1.id, b"flaky", 2)
    await m2.fin()
    await eventually(lambda: channel_stats(broker, "retry", "ch")["finish_count"] == 1)
    assert channel_stats(broker, "retry", "ch")["requeue_count"] == 1


async def test_touch_extends_deadline(broker: BrokerServer, conns: list[NSQConnection]) -> None:
    w = await _open(broker, conns)
    r = await _open(broker, conns, msg_timeout=1000)
    await r.subscribe("touchy", "ch", 1)
    await w.pub("touchy", b"long job")
    m = await _next(r)
    await m.touch()
    await m.fin()
    await w.pub("touchy", b"next")
    m2 = await _next(r)
    assert m2.body == b"next"  # the first was finished, not redelivered
    await m2.fin()


async def test_dpub(broker: BrokerServer, conns: list[NSQConnection]) -> None:
    w = await _open(broker, conns)
    r = await _open(broker, conns)
    await r.subscribe("deferred", "ch", 5)
    assert _ok(await w.dpub("deferred", b"later", 200))
    await w.pub("deferred", b"now")
    first = await _next(r)
    second = await _next(r)
    assert (first.body, second.body) == (b"now", b"later")


async def test_consumer_disconnect_mid_flight(
    broker: BrokerServer, conns: list[NSQConnection]
) -> None:
    w = await _open(broker, conns)
    r1 = await _open(broker, conns)
    await r1.subscribe("jobs", "workers", 5)
    await w.mpub("jobs", b"a", b"b", b"c")
    seen = [await _next(r1) for _ in range(3)]
    await seen[0].fin()
    await r1.close()  # b and c were in flight

    r2 = await _open(broker, conns)
    await r2.subscribe("jobs", "workers", 5)
    again = [await _next(r2) for _ in range(2)]
    assert sorted(m.body for m in again) == [b"b", b"c"]
    assert all(m.attempts == 2 for m in again)
    for m in again:
        await m.fin()


async def test_two_channels_progress_independently(
    broker: BrokerServer, conns: list[NSQConnection]
) -> None:
    w = await _open(broker, conns)
    fast = await _open(broker, conns)
    slow = await _open(broker, conns)
    await fast.subscribe("stream", "fast", 10)
    await slow.subscribe("stream", "slow", 10)
    await w.mpub("stream", b"1", b"2", b"3", b"4")
    for _ in range(4):
        await (await _next(fast)).fin()
    one = await _next(slow)
    await one.fin()
    await eventually(lambda: channel_stats(broker, "stream", "fast")["finish_count"] == 4)
    await eventually(lambda: channel_stats(broker, "stream", "slow")["finish_count"] == 1)
    slow_stats = channel_stats(broker, "stream", "slow")
    assert slow_stats["in_flight_count"] + slow_stats["depth"] == 3


async def test_bad_topic_is_refused_and_server_keeps_serving(
    broker: BrokerServer, conns: list[NSQConnection]
) -> None:
    c = await _open(broker, conns)
    resp = await c.execute("PUB", "bad/topic", data=b"x")
    assert isinstance(resp, NSQErrorSchema)
    assert resp.code == "E_BAD_TOPIC"
    assert resp.body == b'PUB topic name "bad/topic" is not valid'
    w = await _open(broker, conns)
    assert _ok(await w.pub("fine", b"ok"))
