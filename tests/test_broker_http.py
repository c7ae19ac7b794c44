"""The broker's HTTP API: nsqd's routes, status codes and error messages."""

from __future__ import annotations

import os
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession
from ansq.http.writer import NSQDHTTPWriter
from test_broker_support import (
    MakeBroker,
    RawClient,
    broker,
    channel_stats,
    connect,
    make_broker,
    raw_clients,
)

from aiodiskqueue.broker import BrokerServer

__all__ = ["broker", "make_broker", "raw_clients"]


@pytest.fixture
async def http(broker: BrokerServer) -> AsyncIterator[tuple[ClientSession, str]]:
    """A client session and the broker's base URL; closed at the end."""
    async with ClientSession() as s:
        yield s, f"http://127.0.0.1:{broker.http_port}"


async def _req(http: tuple[ClientSession, str], method: str, path: str,
               data: bytes | None = None) -> tuple[int, str, str]:
    s, base = http
    async with s.request(method, base + path, data=data) as resp:
        return resp.status, await resp.text(), resp.headers.get("Content-Type", "")


async def test_ping_and_info(broker: BrokerServer, http: tuple[ClientSession, str]) -> None:
    assert (await _req(http, "GET", "/ping"))[:2] == (200, "OK")
    s, base = http
    async with s.get(base + "/info") as resp:
        info: dict[str, Any] = await resp.json()
    assert (info["tcp_port"], info["http_port"]) == (broker.tcp_port, broker.http_port)
    assert info["version"]


async def test_pub_then_consume_over_tcp(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    assert (await _req(http, "POST", "/pub?topic=web", b"from http"))[:2] == (200, "OK")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("web", "ch")
    m = await c.read()
    assert m.body == b"from http"


async def test_mpub_newline_and_binary(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/topic/create?topic=batch")
    await _req(http, "POST", "/channel/create?topic=batch&channel=ch")
    assert (await _req(http, "POST", "/mpub?topic=batch", b"a\nb\n\nc\n"))[:2] == (200, "OK")
    binary = struct.pack(">i", 2) + struct.pack(">i", 2) + b"d\n" + struct.pack(">i", 1) + b"e"
    assert (await _req(http, "POST", "/mpub?topic=batch&binary=true", binary))[:2] == (200, "OK")
    assert channel_stats(broker, "batch", "ch")["depth"] == 5
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("batch", "ch", rdy=5)
    assert sorted([(await c.read()).body for _ in range(5)]) == [b"a", b"b", b"c", b"d\n", b"e"]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("/pub?topic=bad/name", b"x", 400, "INVALID_TOPIC"),
        ("/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("/pub?topic=t", b"x" * 1025, 413, "MSG_TOO_BIG"),
        ("/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=soon", b"x", 400, "INVALID_DEFER"),
        ("/mpub?topic=t", b"x" * 5000, 413, "BODY_TOO_BIG"),
        ("/mpub?topic=t", b"ok\n" + b"y" * 1025, 413, "MSG_TOO_BIG"),
        ("/mpub?topic=t&binary=true", struct.pack(">i", 0), 413, "BAD_BODY"),
        ("/mpub?topic=t&binary=true", struct.pack(">ii", 1, 9) + b"short", 413, "BAD_MESSAGE"),
        ("/channel/create?topic=nosuch&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
        ("/channel/create?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
        ("/channel/create?topic=t&channel=bad:name", b"", 400, "INVALID_CHANNEL"),
        ("/channel/empty?topic=t&channel=nosuch", b"", 404, "TOPIC_NOT_FOUND"),
        ("/topic/empty?topic=nosuch", b"", 404, "TOPIC_NOT_FOUND"),
        ("/no/such/route", b"", 404, "NOT_FOUND"),
    ],
    ids=["pub-no-topic", "pub-bad-topic", "pub-empty", "pub-too-big", "defer-negative",
         "defer-junk", "mpub-too-big", "mpub-line-too-big", "mpub-binary-count",
         "mpub-binary-truncated", "channel-no-topic", "channel-missing-arg", "channel-bad-name",
         "empty-no-topic", "topic-empty-missing", "unknown-route"],
)
async def test_errors(http: tuple[ClientSession, str], path: str, body: bytes, status: int,
                      message: str) -> None:
    code, text, ctype = await _req(http, "POST", path, body)
    assert code == status
    assert ctype.startswith("application/json")
    assert text == f'{{"message": "{message}"}}'
    # The server keeps serving.
    assert (await _req(http, "GET", "/ping"))[:2] == (200, "OK")


async def test_stats_json_shape(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/pub?topic=st", b"1")
    c = await connect(broker.tcp_port, raw_clients, client_id="statsclient")
    await c.sub("st", "ch")
    m = await c.read()
    s, base = http
    async with s.get(base + "/stats?format=json&topic=st") as resp:
        stats: dict[str, Any] = await resp.json()
    assert stats["health"] == "OK"
    [topic] = stats["topics"]
    assert topic["topic_name"] == "st"
    assert topic["message_count"] == 1
    [ch] = topic["channels"]
    assert ch["channel_name"] == "ch"
    assert ch["in_flight_count"] == 1
    [client] = ch["clients"]
    assert (client["client_id"], client["in_flight_count"], client["ready_count"]) == (
        "statsclient", 1, 1)
    c.send(b"FIN " + m.msg_id)
    code, text, _ = await _req(http, "GET", "/stats")
    assert code == 200 and "[st" in text


async def test_channel_empty_drops_queued_messages(
    broker: BrokerServer, http: tuple[ClientSession, str]
) -> None:
    await _req(http, "POST", "/topic/create?topic=emp")
    await _req(http, "POST", "/channel/create?topic=emp&channel=ch")
    await _req(http, "POST", "/mpub?topic=emp", b"1\n2\n3")
    assert channel_stats(broker, "emp", "ch")["depth"] == 3
    assert (await _req(http, "POST", "/channel/empty?topic=emp&channel=ch"))[:2] == (200, "")
    assert channel_stats(broker, "emp", "ch")["depth"] == 0


async def test_topic_empty_drops_its_ready_and_deferred_messages(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/mpub?topic=temp", b"1\n2")  # no channel: kept in the topic
    await _req(http, "POST", "/pub?topic=temp&defer=3600000", b"later")
    t = broker.broker.topics["temp"]
    assert (t.stats()["depth"], t.stats()["backend_depth"]) == (3, 2)
    assert (await _req(http, "POST", "/topic/empty?topic=temp"))[:2] == (200, "")
    assert t.stats()["depth"] == 0
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("temp", "ch", rdy=5)
    await _req(http, "POST", "/pub?topic=temp", b"fresh")
    assert (await c.read()).body == b"fresh"
    stats = channel_stats(broker, "temp", "ch")
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 1, 0)


async def test_ansq_http_writer(broker: BrokerServer) -> None:
    w = NSQDHTTPWriter("127.0.0.1", broker.http_port)
    try:
        assert await w.ping() == "OK"
        assert await w.create_topic("ansq_http") == ""
        assert await w.create_channel("ansq_http", "c") == ""
        assert await w.pub("ansq_http", "hello") == "OK"
        assert await w.mpub("ansq_http", "a", "b") == "OK"
        stats = await w.stats()
        assert isinstance(stats, dict)
        [topic] = [t for t in stats["topics"] if t["topic_name"] == "ansq_http"]
        assert topic["channels"][0]["depth"] == 3
    finally:
        await w.close()


async def test_channel_pause_holds_deliveries(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/topic/create?topic=pz")
    await _req(http, "POST", "/channel/create?topic=pz&channel=ch")
    assert (await _req(http, "POST", "/channel/pause?topic=pz&channel=ch"))[0] == 200
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("pz", "ch")
    await _req(http, "POST", "/pub?topic=pz", b"held")
    # Paused: the message stays queued although the client is ready.
    await c.pub("other", b"round trip")
    assert channel_stats(broker, "pz", "ch")["depth"] == 1
    assert channel_stats(broker, "pz", "ch")["paused"] is True
    assert (await _req(http, "POST", "/channel/unpause?topic=pz&channel=ch"))[0] == 200
    m = await c.read()
    assert m.body == b"held"


async def test_topic_pause_keeps_messages_in_topic(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/topic/create?topic=tp")
    await _req(http, "POST", "/channel/create?topic=tp&channel=ch")
    await _req(http, "POST", "/topic/pause?topic=tp")
    await _req(http, "POST", "/pub?topic=tp", b"in topic")
    assert broker.broker.stats("tp")["topics"][0]["depth"] == 1
    assert channel_stats(broker, "tp", "ch")["depth"] == 0
    await _req(http, "POST", "/topic/unpause?topic=tp")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("tp", "ch")
    assert (await c.read()).body == b"in topic"


def _files(broker: BrokerServer) -> set[str]:
    return set(os.listdir(broker.broker.data_dir))


async def test_channel_delete_removes_its_files_only(
    broker: BrokerServer, http: tuple[ClientSession, str], raw_clients: list[RawClient]
) -> None:
    await _req(http, "POST", "/topic/create?topic=del")
    for ch in ("a", "a.b"):
        await _req(http, "POST", f"/channel/create?topic=del&channel={ch}")
    await _req(http, "POST", "/mpub?topic=del", b"1\n2")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("del", "a", rdy=0)
    before = _files(broker)
    assert any(f.startswith("del:a.diskqueue.") for f in before)

    assert (await _req(http, "POST", "/channel/delete?topic=del&channel=a"))[:2] == (200, "")
    assert await c.closed_by_server()  # its subscriber is disconnected
    after = _files(broker)
    assert not any(f.startswith(("del:a.diskqueue.", "del:a.ack.")) for f in after)
    assert {f for f in before if f.startswith("del:a.b.")} <= after  # the other channel is intact
    channels = broker.broker.stats("del")["topics"][0]["channels"]
    assert [ch["channel_name"] for ch in channels] == ["a.b"]
    assert channel_stats(broker, "del", "a.b")["depth"] == 2
    assert (await _req(http, "POST", "/channel/delete?topic=del&channel=a"))[0] == 404


async def test_topic_delete_removes_everything(
    broker: BrokerServer, http: tuple[ClientSession, str]
) -> None:
    await _req(http, "POST", "/pub?topic=gone", b"queued in the topic")
    await _req(http, "POST", "/channel/create?topic=gone&channel=c1")
    await _req(http, "POST", "/pub?topic=gone", b"in the channel")
    await _req(http, "POST", "/pub?topic=gone2", b"another topic")
    assert (await _req(http, "POST", "/topic/delete?topic=gone"))[:2] == (200, "")
    assert "gone" not in broker.broker.topics
    assert not any(f.startswith(("gone.", "gone:")) for f in _files(broker))
    assert any(f.startswith("gone2.") for f in _files(broker))
    assert (await _req(http, "POST", "/topic/delete?topic=gone"))[:2] == (
        404, '{"message": "TOPIC_NOT_FOUND"}')


async def test_channel_empty_drops_in_flight_ready_and_deferred(
    make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    """nsqd's Channel.Empty: in-flight, ready and deferred messages are all dropped, for good."""
    broker = await make_broker()
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("emp2", "ch", rdy=2)
    p = await connect(broker.tcp_port, raw_clients)
    p.send(b"MPUB emp2", struct.pack(">i", 3)
           + b"".join(struct.pack(">i", 1) + x for x in (b"1", b"2", b"3")))
    await p.expect_ok()
    p.send(b"DPUB emp2 3600000", b"deferred")
    await p.expect_ok()
    m1, m2 = await c.read(), await c.read()
    before = channel_stats(broker, "emp2", "ch")
    assert (before["depth"], before["in_flight_count"], before["deferred_count"]) == (1, 2, 1)
    url = f"http://127.0.0.1:{broker.http_port}/channel/empty?topic=emp2&channel=ch"
    async with ClientSession() as s, s.post(url) as r:
        assert (r.status, await r.text()) == (200, "")
    after = channel_stats(broker, "emp2", "ch")
    assert (after["depth"], after["in_flight_count"], after["deferred_count"]) == (0, 0, 0)
    assert after["clients"][0]["in_flight_count"] == 0
    assert after["finish_count"] == 2  # the in-flight ones, finished in the store
    # The client's deliveries are gone: FIN, REQ and TOUCH fail, and are not fatal.
    for cmd, code in ((b"FIN ", b"E_FIN_FAILED"), (b"REQ ", b"E_REQ_FAILED"),
                      (b"TOUCH ", b"E_TOUCH_FAILED")):
        c.send(cmd + (m1.msg_id if cmd != b"REQ " else m2.msg_id + b" 0"))
        f = await c.read()
        assert f.is_error and f.data.startswith(code), f
    await p.pub("emp2", b"fresh")
    assert (await c.read()).body == b"fresh"  # nothing emptied comes back
    c.send(b"RDY 0")
    await c.close()
    # Nor after a restart: the drop is stored, not only forgotten in memory.
    await broker.aclose()
    broker = await make_broker()
    c2 = await connect(broker.tcp_port, raw_clients)
    await c2.sub("emp2", "ch", rdy=5)
    assert (await c2.read()).body == b"fresh"  # unfinished when the client left
    p2 = await connect(broker.tcp_port, raw_clients)
    await p2.pub("emp2", b"end")
    assert (await c2.read()).body == b"end"
    stats = channel_stats(broker, "emp2", "ch")
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 2, 0)
