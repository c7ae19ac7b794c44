"""Where the broker behaves as nsqd 1.3.0 does and NSQ clients rely on it.

Each test names the nsqd behaviour it checks; the figures in comments were
measured on nsqd 1.3.0.
"""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
from aiohttp import ClientSession
from test_broker_support import (
    TIMEOUT,
    MakeBroker,
    RawClient,
    broker,
    channel_stats,
    connect,
    eventually,
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
    await eventually(lambda: store.stats().dead_lettered == 1)
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


async def test_req_delay_above_the_maximum_is_clamped(make_broker: MakeBroker,
                                                      raw_clients: list[RawClient]) -> None:
    # nsqd clamps to --max-req-timeout and keeps the connection (pynsq's backoff
    # exceeds 1 h from attempt 41); here the maximum is 0.2 s.
    server = await make_broker(max_req_timeout=0.2)
    c = await connect(server.tcp_port, raw_clients)
    await c.sub("clamp", "ch")
    p = await connect(server.tcp_port, raw_clients)
    await p.pub("clamp", b"x")
    m = await c.read()
    c.send(b"REQ " + m.msg_id + b" 7200000")
    again = await c.read()  # back after 0.2 s, on the same connection
    assert (again.type, again.body, again.attempts) == (FRAME_MESSAGE, b"x", 2)
    assert channel_stats(server, "clamp", "ch")["requeue_count"] == 1


@pytest.mark.parametrize("timeout", [b"abc", b"-5"])
async def test_req_with_a_non_numeric_timeout_is_e_invalid(broker: BrokerServer,
                                                           raw_clients: list[RawClient],
                                                           timeout: bytes) -> None:
    # nsqd parses the timeout (digits only, no sign) before looking the id up:
    # E_INVALID (fatal), not E_REQ_FAILED.
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rqbad", "ch")
    c.send(b"REQ 0123456789abcdef " + timeout)
    f = await c.read()
    assert (f.type, f.data) == (FRAME_ERROR,
                                b"E_INVALID REQ could not parse timeout " + timeout)
    assert await c.closed_by_server()


async def test_req_of_an_unknown_id_with_a_valid_timeout_is_e_req_failed(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rqunk", "ch")
    c.send(b"REQ 0123456789abcdef 0")
    f = await c.read()
    assert f.type == FRAME_ERROR and f.data.startswith(b"E_REQ_FAILED")
    await c.pub("rqunk", b"still connected")


# ---------------------------------------------------------------------- channels and stats


async def test_paused_channel_delivers_nothing_to_idle_consumers(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    # nsqd: 0 messages until unpause; the broker leaked one per waiting consumer.
    await _post(broker, "/topic/create?topic=pa")
    await _post(broker, "/channel/create?topic=pa&channel=ch")
    consumers = [await connect(broker.tcp_port, raw_clients) for _ in range(2)]
    for c in consumers:
        await c.sub("pa", "ch", rdy=5)
    # Both pumps wait in the store for a message; the round trip makes sure they do.
    await _get_json(broker, "/stats?format=json")
    assert (await _post(broker, "/channel/pause?topic=pa&channel=ch"))[0] == 200
    assert (await _post(broker, "/mpub?topic=pa", b"1\n2\n3"))[0] == 200
    await _get_json(broker, "/stats?format=json")  # loop iterations for a (wrong) delivery
    st = channel_stats(broker, "pa", "ch")
    assert (st["depth"], st["in_flight_count"]) == (3, 0)
    assert [cl["message_count"] for cl in st["clients"]] == [0, 0]
    assert (await _post(broker, "/channel/unpause?topic=pa&channel=ch"))[0] == 200
    await eventually(lambda: channel_stats(broker, "pa", "ch")["in_flight_count"] == 3)


async def test_stats_message_count_counts_messages_not_deliveries(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    # nsqd: 5 after 5 publishes with no consumer; a message delivered twice counts once.
    await _post(broker, "/topic/create?topic=mc")
    await _post(broker, "/channel/create?topic=mc&channel=ch")
    await _post(broker, "/mpub?topic=mc", b"1\n2\n3\n4\n5")
    assert channel_stats(broker, "mc", "ch")["message_count"] == 5
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("mc", "ch", rdy=1)
    m = await c.read()
    c.send(b"REQ " + m.msg_id + b" 0")
    await c.read()
    st = channel_stats(broker, "mc", "ch")
    assert st["message_count"] == 5
    assert st["clients"][0]["message_count"] == 2  # the client's own figure: deliveries
    # Messages held in the topic count once they reach a channel.
    await _post(broker, "/pub?topic=mc2", b"waiting in the topic")
    await _post(broker, "/channel/create?topic=mc2&channel=late")
    await eventually(lambda: channel_stats(broker, "mc2", "late")["message_count"] == 1)


async def test_subscribed_client_state_is_3(broker: BrokerServer,
                                            raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("st", "ch", rdy=0)
    assert channel_stats(broker, "st", "ch")["clients"][0]["state"] == 3  # nsqd's stateSubscribed


async def test_stats_topics_and_channels_sorted_by_name(broker: BrokerServer) -> None:
    for t in ("b", "c", "a"):
        await _post(broker, f"/topic/create?topic={t}")
    for ch in ("z", "x", "y"):
        await _post(broker, f"/channel/create?topic=b&channel={ch}")
    stats = await _get_json(broker, "/stats?format=json")
    assert isinstance(stats, dict)
    assert [t["topic_name"] for t in stats["topics"]] == ["a", "b", "c"]
    assert [c["channel_name"] for c in stats["topics"][1]["channels"]] == ["x", "y", "z"]


async def test_info_carries_nsqd_fields(make_broker: MakeBroker) -> None:
    server = await make_broker(broadcast_address="node7.example", max_heartbeat_interval=45.0)
    info = await _get_json(server, "/info")
    assert isinstance(info, dict)
    # Go encodes time.Duration as nanoseconds.
    assert info["max_heartbeat_interval"] == 45 * 10**9
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30 * 10**9
    assert info["max_deflate_level"] == 6
    assert info["broadcast_address"] == "node7.example"
    assert info["hostname"] != "" and (info["tcp_port"], info["http_port"]) == (
        server.tcp_port, server.http_port)


def test_broadcast_address_flag_defaults_to_the_hostname() -> None:
    import socket

    from aiodiskqueue.broker.__main__ import options, parse_args
    from aiodiskqueue.broker._broker import Broker

    args = parse_args(["--data-dir", "d", "--broadcast-address", "10.1.2.3",
                       "--lookupd-tcp-address", "l1:4160", "--lookupd-tcp-address", "l2:4160"])
    opts = options(args)
    assert opts.broadcast_address == "10.1.2.3"
    assert opts.lookupd_tcp_addresses == ("l1:4160", "l2:4160")
    assert Broker("d", options(parse_args(["--data-dir", "d"]))).broadcast_address == \
        socket.gethostname()


# ---------------------------------------------------------------------- IDENTIFY

_NESTED_OK = b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b', "client_id": "deep"}'
_NESTED_TOO_DEEP = b'{"x": ' + b"[" * 10000 + b"]" * 10000 + b"}"


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (b"null", b"OK"),
        (_NESTED_OK, b"OK"),
        (b'{"heartbeat_interval": null}', b"OK"),
        (b'{"HeartBeat_Interval": 5000}', b"OK"),
        (b'{"heartbeat_interval": "30000"}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"heartbeat_interval": 30000.0}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"msg_timeout": 99999999999999999999999999}',
         b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"sample_rate": 2147483648}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"client_id": 42}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"client_id": ["a"]}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"feature_negotiation": "yes"}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"x": NaN}', b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"[1, 2]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (_NESTED_TOO_DEEP, b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b'{"output_buffer_size": 10}', b"E_BAD_BODY IDENTIFY output buffer size (10) is invalid"),
        (b'{"output_buffer_size": 65537}',
         b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
        (b'{"output_buffer_timeout": 10}',
         b"E_BAD_BODY IDENTIFY output buffer timeout (10) is invalid"),
        (b'{"output_buffer_size": -1, "output_buffer_timeout": -1}', b"OK"),
    ],
    ids=["null", "nested-valid", "null-field", "field-case", "heartbeat-string",
         "heartbeat-float", "huge-int", "int32-overflow", "client-id-number", "client-id-array",
         "negotiation-string", "nan", "array", "nested-too-deep", "buffer-size-10",
         "buffer-size-over-max", "buffer-timeout-10", "buffering-off"],
)
async def test_identify_judged_as_nsqd(make_broker: MakeBroker, raw_clients: list[RawClient],
                                       caplog: pytest.LogCaptureFixture, body: bytes,
                                       answer: bytes) -> None:
    broker = await make_broker(max_body_size=1 << 20)  # room for the nested bodies
    c = await connect(broker.tcp_port, raw_clients)
    c.send(b"IDENTIFY", body)
    f = await c.read()
    assert f.data == answer
    if answer == b"OK":
        await c.pub("after_identify", b"the connection serves on")
    else:
        assert f.type == FRAME_ERROR
        assert await c.closed_by_server()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


async def test_identify_answers_the_negotiated_output_buffer(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    c.send(b"IDENTIFY", b'{"feature_negotiation": true, "output_buffer_size": 4096, '
                        b'"output_buffer_timeout": 100}')
    data = json.loads((await c.read()).data)
    assert (data["output_buffer_size"], data["output_buffer_timeout"]) == (4096, 100)
    assert (data["deflate"], data["deflate_level"], data["max_deflate_level"]) == (False, 6, 6)
    d = await connect(broker.tcp_port, raw_clients)
    d.send(b"IDENTIFY", b'{"feature_negotiation": true, "output_buffer_size": -1}')
    data = json.loads((await d.read()).data)
    assert (data["output_buffer_size"], data["output_buffer_timeout"]) == (1, 0)


# ---------------------------------------------------------------------- HTTP timeouts


async def test_http_headers_sent_too_slowly_are_cut_off(make_broker: MakeBroker) -> None:
    server = await make_broker(http_read_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"GET /ping HTTP/1.1\r\nHo")  # and never the rest
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # closed by the server
    finally:
        writer.close()


async def test_http_body_sent_too_slowly_is_cut_off(make_broker: MakeBroker) -> None:
    server = await make_broker(http_read_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"POST /pub?topic=slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        rest = await asyncio.wait_for(reader.read(), TIMEOUT)  # read until the server closes
        assert b"OK" not in rest
    finally:
        writer.close()
    assert "slow" not in server.broker.topics or \
        server.broker.topics["slow"].stats()["message_count"] == 0


async def test_http_keeps_serving_a_prompt_client(make_broker: MakeBroker) -> None:
    server = await make_broker(http_read_timeout=5.0)
    assert (await _post(server, "/pub?topic=fast", b"x"))[0] == 200


@pytest.mark.parametrize(
    ("rdy", "expected"),
    [(b"RDY -1", b"E_INVALID RDY could not parse count -1"),
     (b"RDY 2x", b"E_INVALID RDY could not parse count 2x"),
     (b"RDY 18446744073709551615", b"E_INVALID RDY count -1 out of range 0-2500")],
    ids=["sign", "junk", "wraps-to-minus-one"],
)
async def test_rdy_counts_are_read_as_nsqd_reads_them(
        broker: BrokerServer, raw_clients: list[RawClient], rdy: bytes, expected: bytes) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rdyparse", "ch", rdy=0)
    c.send(rdy)
    f = await c.read()
    assert (f.type, f.data) == (FRAME_ERROR, expected)


async def test_an_empty_number_is_zero_and_a_huge_one_wraps_as_nsqd(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    c.send(b"DPUB wrap ", b"deferred 0 ms")  # an empty timeout parameter is 0
    await c.expect_ok()
    await c.sub("wrap", "ch", rdy=0)
    c.send(b"RDY 18446744073709551617")  # 2**64 + 1: RDY 1
    m = await c.read()
    assert m.body == b"deferred 0 ms"
    c.send(b"REQ " + m.msg_id + b" ")  # an empty delay: requeued at once
    again = await c.read()
    assert (again.body, again.attempts) == (b"deferred 0 ms", 2)


async def test_mpub_messages_are_read_from_the_stream_as_nsqd(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    # nsqd reads an MPUB's messages from the stream; its body size bounds nothing.
    c = await connect(broker.tcp_port, raw_clients)
    messages = struct.pack(">i", 2) + struct.pack(">i", 3) + b"one" + struct.pack(">i", 3) + b"two"
    # A body size shorter than the messages: the rest is read on.
    c.write(b"MPUB short\n" + struct.pack(">i", 6) + messages)
    await c.expect_ok()
    # A body size longer than the messages: what follows them is the next command.
    c.write(b"MPUB long\n" + struct.pack(">i", len(messages) + 4) + messages + b"NOP\n")
    await c.expect_ok()
    await c.pub("long", b"after")  # the NOP was read as a command: the stream is in step
    assert broker.broker.topics["short"].message_count == 2
    assert broker.broker.topics["long"].message_count == 3


async def test_mpub_read_on_from_the_stream_keeps_nsqds_checks(
        broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    c.write(b"MPUB t\n" + struct.pack(">i", 4) + struct.pack(">ii", 2, 3) + b"abc"
            + struct.pack(">i", 0))
    f = await c.read()
    assert (f.type, f.data) == (FRAME_ERROR, b"E_BAD_MESSAGE MPUB invalid message(1) body size 0")
    assert await c.closed_by_server()
