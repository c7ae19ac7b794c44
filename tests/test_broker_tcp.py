"""The broker's protocol V2 over raw sockets: the happy path and every error path."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import struct
from pathlib import Path

import pytest
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

from aiodiskqueue import DiskQueue
from aiodiskqueue.broker import BrokerServer

__all__ = ["broker", "make_broker", "raw_clients"]  # fixtures used by the tests below


async def test_identify_feature_negotiation(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, msg_timeout=5000, heartbeat_interval=2000,
                         client_id="t1", hostname="h1", user_agent="raw/1")
    assert f.is_response
    data = json.loads(f.data)
    assert data["msg_timeout"] == 5000  # the client's own timeout applies
    assert data["max_rdy_count"] == 2500
    assert data["max_msg_timeout"] == 900_000
    assert data["heartbeat_interval"] == 2000
    assert data["tls_v1"] is False and data["snappy"] is False and data["deflate"] is False


async def test_identify_without_negotiation_is_ok(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    f = await c.identify(client_id="plain")
    assert (f.is_response, f.data) == (True, b"OK")


async def test_pub_sub_fin(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients, feature_negotiation=True)
    await c.sub("events", "ch")
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("events", b"hello")
    m = await c.read()
    assert m.is_message
    assert (m.body, m.attempts) == (b"hello", 1)
    assert len(m.msg_id) == 16 and m.timestamp > 0
    c.send(b"FIN " + m.msg_id)
    # FIN has no response; a NOP round trip through PUB proves it was handled in order.
    await p.pub("events", b"second")
    m2 = await c.read()
    assert m2.body == b"second"
    stats = broker.broker.stats("events", "ch")["topics"][0]["channels"][0]
    assert stats["finish_count"] == 1
    assert stats["message_count"] == 2


async def test_messages_published_before_any_channel_reach_it(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    for i in range(5):
        await p.pub("early", b"m%d" % i)
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("early", "late-channel", rdy=10)
    got = sorted([(await c.read()).body for _ in range(5)])
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]


async def test_fan_out_to_every_channel(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    a = await connect(broker.tcp_port, raw_clients)
    await a.sub("fan", "a", rdy=10)
    b = await connect(broker.tcp_port, raw_clients)
    await b.sub("fan", "b", rdy=10)
    p = await connect(broker.tcp_port, raw_clients)
    p.send(b"MPUB fan", struct.pack(">i", 3)
           + b"".join(struct.pack(">i", 1) + x for x in (b"x", b"y", b"z")))
    await p.expect_ok()
    for c in (a, b):
        assert sorted([(await c.read()).body for _ in range(3)]) == [b"x", b"y", b"z"]


async def test_rdy_bounds_in_flight(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    for i in range(3):
        await p.pub("rdy", b"%d" % i)
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rdy", "ch", rdy=2)
    m1, m2 = await c.read(), await c.read()
    assert m1.is_message and m2.is_message
    # With RDY 2 and two in flight, nothing more comes until one is finished.
    c.send(b"NOP")
    await p.pub("rdy", b"probe")
    stats = channel_stats(broker, "rdy", "ch")
    assert (stats["clients"][0]["in_flight_count"], stats["in_flight_count"],
            stats["depth"]) == (2, 2, 2)
    c.send(b"FIN " + m1.msg_id)
    m3 = await c.read()
    assert m3.is_message and m3.body in (b"2", b"probe")


async def test_req_redelivers_with_more_attempts(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("req", b"again")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("req", "ch")
    m = await c.read()
    c.send(b"REQ " + m.msg_id + b" 0")
    m2 = await c.read()
    assert (m2.body, m2.msg_id, m2.attempts) == (b"again", m.msg_id, 2)
    c.send(b"FIN " + m2.msg_id)


async def test_touch_keeps_message_in_flight(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("touch", b"slow")
    c = await connect(broker.tcp_port, raw_clients, msg_timeout=1000)
    await c.sub("touch", "ch")
    m = await c.read()
    c.send(b"TOUCH " + m.msg_id)
    c.send(b"FIN " + m.msg_id)
    # FIN after TOUCH succeeds: an error frame would arrive before the PUB's OK.
    await p.pub("touch", b"next")
    m2 = await c.read()
    assert m2.is_message and m2.body == b"next"


async def test_disconnect_mid_flight_redelivers(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("drop", b"important")
    c1 = await connect(broker.tcp_port, raw_clients)
    await c1.sub("drop", "ch")
    m = await c1.read()
    assert m.body == b"important"
    await c1.close()
    c2 = await connect(broker.tcp_port, raw_clients)
    await c2.sub("drop", "ch")
    m2 = await c2.read()
    assert (m2.body, m2.msg_id) == (b"important", m.msg_id)
    assert m2.attempts == 2


async def test_message_timeout_redelivers(
    make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    broker = await make_broker(msg_timeout=1.0)
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("slow", b"late")
    c1 = await connect(broker.tcp_port, raw_clients, msg_timeout=1000)
    await c1.sub("slow", "ch")
    m = await c1.read()
    c1.send(b"RDY 0")
    c2 = await connect(broker.tcp_port, raw_clients)
    await c2.sub("slow", "ch")
    m2 = await c2.read()  # not finished within 1 s: delivered again, to the ready client
    assert (m2.body, m2.msg_id, m2.attempts) == (b"late", m.msg_id, 2)
    c1.send(b"FIN " + m.msg_id)  # too late: the first delivery is gone; not fatal
    f = await c1.read()
    assert f.is_error and f.data.startswith(b"E_FIN_FAILED"), f.data
    c2.send(b"FIN " + m2.msg_id)
    c2.send(b"CLS")
    assert (await c2.read()).data == b"CLOSE_WAIT"
    c1.send(b"RDY 1")
    await p.pub("slow", b"after")
    assert (await c1.read()).body == b"after"


async def test_identify_msg_timeout_applies_to_that_client(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    """The broker's timeout is 60 s; a client that asks for 1 s sees its message taken back."""
    assert broker.broker.options.msg_timeout == 60.0
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("short", b"slow job")
    c1 = await connect(broker.tcp_port, raw_clients)
    f = await c1.identify(feature_negotiation=True, msg_timeout=1000)
    assert json.loads(f.data)["msg_timeout"] == 1000
    await c1.sub("short", "ch")
    m = await c1.read()
    c1.send(b"RDY 0")
    assert channel_stats(broker, "short", "ch")["clients"][0]["msg_timeout"] == 1000
    c2 = await connect(broker.tcp_port, raw_clients)  # the broker's 60 s
    await c2.sub("short", "ch")
    # Within the tests' bound (20 s), far below 60 s: only the client's 1 s can do this.
    m2 = await c2.read()
    assert (m2.body, m2.msg_id, m2.attempts) == (b"slow job", m.msg_id, 2)
    stats = channel_stats(broker, "short", "ch")
    assert (stats["timeout_count"], stats["in_flight_count"]) == (1, 1)
    c1.send(b"FIN " + m.msg_id)
    f = await c1.read()
    assert f.is_error and f.data.startswith(b"E_FIN_FAILED"), f.data
    c2.send(b"FIN " + m2.msg_id)
    await eventually(lambda: channel_stats(broker, "short", "ch")["finish_count"] == 1,
                     "the second delivery finished")


async def test_dpub_is_delivered_after_delay(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("later", "ch")
    p = await connect(broker.tcp_port, raw_clients)
    p.send(b"DPUB later 300", b"deferred")
    await p.expect_ok()
    await p.pub("later", b"now")
    first, second = await c.read(), None
    assert first.body == b"now"
    c.send(b"FIN " + first.msg_id)
    second = await c.read()
    assert second.body == b"deferred"


async def test_cls_answers_close_wait(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("cls", "ch")
    c.send(b"CLS")
    f = await c.read()
    assert (f.is_response, f.data) == (True, b"CLOSE_WAIT")


async def test_heartbeat_is_sent(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients, heartbeat_interval=1000)
    f = await c.read(skip_heartbeats=False)
    assert (f.is_response, f.data) == (True, b"_heartbeat_")


# ---------------------------------------------------------------------- errors

FATAL_CASES = [
    (b"BOGUS\n", b"E_INVALID invalid command BOGUS"),
    (b"PUB bad/topic\n", b'E_BAD_TOPIC PUB topic name "bad/topic" is not valid'),
    (b"PUB " + b"t" * 65 + b"\n", b"E_BAD_TOPIC PUB topic name"),
    (b"PUB\n", b"E_INVALID PUB insufficient number of parameters"),
    (b"PUB big\n" + struct.pack(">i", 1025) + b"x" * 1025,
     b"E_BAD_MESSAGE PUB message too big 1025 > 1024"),
    (b"PUB empty\n" + struct.pack(">i", 0), b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"PUB neg\n" + struct.pack(">i", -5), b"E_BAD_MESSAGE PUB invalid message body size -5"),
    (b"MPUB t\n" + struct.pack(">i", 5000), b"E_BAD_BODY MPUB body too big 5000 > 4096"),
    (b"MPUB t\n" + struct.pack(">ii", 4, 0), b"E_BAD_BODY MPUB invalid message count 0"),
    (b"MPUB t\n" + struct.pack(">iii", 8, 1, 2000),
     b"E_BAD_MESSAGE MPUB message too big 2000 > 1024"),
    (b"DPUB t 99999999999\n", b"E_INVALID DPUB timeout 99999999999 out of range 0-3600000"),
    (b"DPUB t soon\n", b"E_INVALID DPUB could not parse timeout soon"),
    (b"DPUB t -5\n", b"E_INVALID DPUB could not parse timeout -5"),
    (b"SUB t bad:channel\n", b'E_BAD_CHANNEL SUB channel name "bad:channel" is not valid'),
    (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"RDY 5\n", b"E_INVALID cannot RDY in current state"),
    (b"FIN 0123456789abcdef\n", b"E_INVALID cannot FIN in current state"),
    (b"CLS\n", b"E_INVALID cannot CLS in current state"),
    (b"IDENTIFY\n" + struct.pack(">i", 8) + b"not json",
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"IDENTIFY\n" + struct.pack(">i", 999_999), b"E_BAD_BODY IDENTIFY body too big 999999 > 4096"),
    (b"AUTH\n" + struct.pack(">i", 3) + b"abc", b"E_AUTH_DISABLED AUTH disabled"),
    (b"MPUB bad/topic\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad/topic" is not valid'),
    (b"SUB t\xff\x01 c\n", b'E_BAD_TOPIC SUB topic name "t\\xff\\x01" is not valid'),
    (b"AUTH x\n", b"E_INVALID AUTH invalid number of parameters"),
    (b"MPUB t\n" + struct.pack(">ii", 4, 900), b"E_BAD_BODY MPUB invalid message count 900"),
]


@pytest.mark.parametrize(
    ("data", "expected"), FATAL_CASES,
    ids=["unknown-command", "bad-topic", "long-topic", "pub-no-topic", "oversize-body",
         "zero-body", "negative-body", "mpub-body-too-big", "mpub-zero-count", "mpub-msg-too-big",
         "dpub-range", "dpub-parse", "dpub-signed", "bad-channel", "sub-params", "rdy-before-sub",
         "fin-before-sub", "cls-before-sub", "identify-bad-json", "identify-too-big",
         "auth", "mpub-bad-topic", "sub-topic-quoted", "auth-params", "mpub-count-range"],
)
async def test_fatal_errors_close_only_that_connection(
    broker: BrokerServer, raw_clients: list[RawClient], data: bytes, expected: bytes
) -> None:
    keeper = await connect(broker.tcp_port, raw_clients)
    await keeper.pub("kept", b"stored before the bad client")

    bad = await connect(broker.tcp_port, raw_clients)
    bad.writer.write(data)
    f = await bad.read()
    assert f.is_error
    assert f.data.startswith(expected), f.data
    assert await bad.closed_by_server()

    # The server keeps serving, other connections and stored data are intact.
    await keeper.pub("kept", b"stored after")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("kept", "ch", rdy=2)
    assert sorted([(await c.read()).body for _ in range(2)]) == [
        b"stored after", b"stored before the bad client"]


async def test_bad_magic_is_refused(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await RawClient.connect(broker.tcp_port, magic=b"  V1")
    raw_clients.append(c)
    f = await c.read()
    assert f.is_error and f.data == b"E_BAD_PROTOCOL"  # nsqd's frame: the code alone
    assert await c.closed_by_server()


@pytest.mark.parametrize(
    ("cmd", "code"),
    [(b"FIN", b"E_FIN_FAILED"), (b"REQ", b"E_REQ_FAILED"), (b"TOUCH", b"E_TOUCH_FAILED")],
    ids=["fin", "req", "touch"],
)
async def test_settle_unknown_id_is_not_fatal(
    broker: BrokerServer, raw_clients: list[RawClient], cmd: bytes, code: bytes
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("settle", "ch")
    line = cmd + b" ffffffffffffffff" + (b" 0" if cmd == b"REQ" else b"")
    c.send(line)
    f = await c.read()
    assert f.is_error and f.data == code + b" " + cmd + b" ffffffffffffffff failed ID not in flight"
    # Still connected and subscribed: a published message arrives.
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("settle", b"still here")
    assert (await c.read()).body == b"still here"


async def test_bad_message_id_is_fatal(broker: BrokerServer, raw_clients: list[RawClient]) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("ids", "ch")
    c.send(b"FIN short")
    f = await c.read()
    assert f.is_error and f.data == b"E_INVALID invalid message ID"
    assert await c.closed_by_server()


async def test_rdy_out_of_range_is_fatal(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("rdyr", "ch", rdy=0)
    c.send(b"RDY 2501")
    f = await c.read()
    assert f.is_error and f.data == b"E_INVALID RDY count 2501 out of range 0-2500"
    assert await c.closed_by_server()


async def test_max_attempts_moves_message_to_dead_letters(
    make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    broker = await make_broker(max_attempts=2)
    p = await connect(broker.tcp_port, raw_clients)
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("poison", "ch")
    await p.pub("poison", b"bad input")
    for attempt in (1, 2):
        m = await c.read()
        assert (m.body, m.attempts) == (b"bad input", attempt)
        c.send(b"REQ " + m.msg_id + b" 0")
    await p.pub("poison", b"good input")
    m = await c.read()
    assert m.body == b"good input"  # the poison message is not delivered a third time
    store = broker.broker.topics["poison"].channels["ch"].store
    await eventually(lambda: store.stats().dead_lettered == 1)
    assert channel_stats(broker, "poison", "ch")["dead_letter_count"] == 1
    dead = await asyncio.wait_for(store.q.dead_letters.get(), TIMEOUT)  # type: ignore[attr-defined]
    assert dead.endswith(b"bad input")


async def test_restart_reopens_topics_and_channels(
    make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    first = await make_broker()
    c = await connect(first.tcp_port, raw_clients)
    await c.sub("kept", "ch", rdy=0)
    for i in range(3):
        await c.pub("kept", b"%d" % i)
    await c.pub("only-topic", b"waiting")
    await first.aclose()
    second = await make_broker()
    assert channel_stats(second, "kept", "ch")["depth"] == 3
    assert second.broker.stats("only-topic")["topics"][0]["depth"] == 1


async def test_ephemeral_channel_goes_with_its_last_client(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("eph", "tmp#ephemeral", rdy=0)
    await c.pub("eph", b"x")
    assert "tmp#ephemeral" in broker.broker.topics["eph"].channels
    assert broker.broker.meta()["topics"][0]["channels"] == []  # never in the metadata
    await c.close()
    await eventually(lambda: "tmp#ephemeral" not in broker.broker.topics["eph"].channels)
    # Its files go right after (closing the queue comes first).
    await eventually(
        lambda: not [f for f in os.listdir(broker.broker.data_dir) if "#ephemeral" in f])
    assert "eph" in broker.broker.topics  # a durable topic stays


async def test_ephemeral_topic_goes_with_its_last_channel(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("t#ephemeral", "c#ephemeral", rdy=0)
    await c.close()
    await eventually(lambda: "t#ephemeral" not in broker.broker.topics)


@pytest.mark.parametrize(("rate", "delivered"), [(40, False), (60, True)],
                         ids=["sampled-out", "sampled-in"])
async def test_sample_rate(
    broker: BrokerServer, raw_clients: list[RawClient], monkeypatch: pytest.MonkeyPatch,
    rate: int, delivered: bool
) -> None:
    monkeypatch.setattr("aiodiskqueue.broker._delivery._rng.randrange", lambda n: 50)
    c = await connect(broker.tcp_port, raw_clients, sample_rate=rate)
    await c.sub("sampled", "ch")
    # Published on another connection: on the subscriber's own, the message
    # may come before the OK of its PUB.
    p = await connect(broker.tcp_port, raw_clients)
    await p.pub("sampled", b"maybe")
    if delivered:
        assert (await c.read()).body == b"maybe"
    else:
        store = broker.broker.topics["sampled"].channels["ch"].store
        await eventually(lambda: store.stats().finished == 1)  # dropped, as nsqd drops it
        assert channel_stats(broker, "sampled", "ch")["clients"][0]["message_count"] == 0


async def test_silent_client_is_closed_after_two_heartbeats(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients, heartbeat_interval=1000)
    heartbeats = 0
    while True:  # never answer: the server gives up after two intervals
        try:
            f = await c.read(skip_heartbeats=False)
        except asyncio.IncompleteReadError:
            break
        assert f.data == b"_heartbeat_"
        heartbeats += 1
    assert 1 <= heartbeats <= 3
    await eventually(lambda: not broker.tcp.connections)


async def test_random_garbage_never_hurts_the_server(
    broker: BrokerServer, raw_clients: list[RawClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiodiskqueue.broker")
    rng = random.Random(1234)
    keeper = await connect(broker.tcp_port, raw_clients)
    await keeper.pub("fuzz", b"kept")
    commands = [b"PUB", b"MPUB", b"DPUB", b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH", b"IDENTIFY",
                b"NOP", b"CLS", b"AUTH"]
    for _ in range(40):
        junk = rng.choice(commands) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        junk += b"\n" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 16)))
        c = await RawClient.connect(broker.tcp_port)
        c.writer.write(junk)
        await c.writer.drain()
        await c.close()
    await keeper.pub("fuzz", b"still accepted")
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("fuzz", "ch", rdy=2)
    got = sorted([(await c.read()).body for _ in range(2)])
    assert got == [b"kept", b"still accepted"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no unexpected error
    assert any("E_INVALID" in r.getMessage() or "E_BAD" in r.getMessage() for r in caplog.records)


async def test_serves_a_channel_queue_in_nsqd_layout(
    tmp_path: Path, make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    # A channel queue as nsqd leaves it on disk: a diskqueue named "topic:channel"
    # whose payloads are nsqd's message layout (here with 3 earlier attempts).
    data = tmp_path / "data"
    async with DiskQueue(data, "legacy:ch") as q:
        for i in range(3):
            await q.put(struct.pack(">qH", 1_600_000_000_000_000_000 + i, 3)
                        + b"%016x" % i + b"old %d" % i)
    (data / "broker.meta.json").write_text(json.dumps(
        {"topics": [{"name": "legacy", "paused": False,
                     "channels": [{"name": "ch", "paused": False}]}]}))
    broker = await make_broker()
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("legacy", "ch", rdy=3)
    got = [await c.read() for _ in range(3)]
    assert [(m.body, m.msg_id, m.attempts, m.timestamp) for m in got] == [
        (b"old %d" % i, b"%016x" % i, 4, 1_600_000_000_000_000_000 + i) for i in range(3)]


@pytest.mark.parametrize("n", [50, 600], ids=["50-pubs", "600-pubs-past-the-pending-bound"])
async def test_pipelined_publishes_keep_order_and_replies_stay_in_order(
    broker: BrokerServer, raw_clients: list[RawClient], n: int
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("pipe", "ch", rdy=0)
    p = await connect(broker.tcp_port, raw_clients)
    bodies = [b"p%03d" % i for i in range(n)]
    batch = b"".join(b"PUB pipe\n" + struct.pack(">i", len(b)) + b for b in bodies)
    mpub = struct.pack(">i", 2) + b"".join(struct.pack(">i", 3) + b for b in (b"m00", b"m01"))
    p.writer.write(batch + b"MPUB pipe\n" + struct.pack(">i", len(mpub)) + mpub + b"BOGUS\n")
    replies = [await p.read() for _ in range(n + 1)]  # n PUB, 1 MPUB
    assert [(f.type, f.data) for f in replies] == [(0, b"OK")] * (n + 1)
    err = await p.read()
    assert err.is_error and err.data.startswith(b"E_INVALID invalid command")  # after every OK
    assert await p.closed_by_server()
    c.send(b"RDY 1000")
    got = [(await c.read()).body for _ in range(n + 2)]
    assert got == [*bodies, b"m00", b"m01"]  # stored in the order sent


async def test_large_topic_backlog_moves_to_a_new_channel_in_order(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    p = await connect(broker.tcp_port, raw_clients)
    bodies = [b"b%04d" % i for i in range(700)]  # more than one pump batch
    p.writer.write(b"".join(b"PUB backlog\n" + struct.pack(">i", len(b)) + b for b in bodies))
    assert [(await p.read()).data for _ in bodies] == [b"OK"] * len(bodies)
    assert broker.broker.stats("backlog")["topics"][0]["depth"] == 700
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("backlog", "ch", rdy=1000)
    got = [(await c.read()).body for _ in bodies]
    assert got == bodies
    await eventually(lambda: broker.broker.stats("backlog")["topics"][0]["depth"] == 0)


async def test_pipelined_pubs_to_one_topic_share_a_store_call_and_keep_order(
    broker: BrokerServer, raw_clients: list[RawClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiodiskqueue.broker._backend import AckStore

    calls: list[int] = []
    put, put_many = AckStore.put, AckStore.put_many

    async def counting_put(self: AckStore, body: bytes, delay: float = 0.0) -> None:
        calls.append(1)
        await put(self, body, delay)

    async def counting_put_many(self: AckStore, bodies: list[bytes], delay: float = 0.0) -> None:
        calls.append(len(bodies))
        await put_many(self, bodies, delay)

    monkeypatch.setattr(AckStore, "put", counting_put)
    monkeypatch.setattr(AckStore, "put_many", counting_put_many)
    c = await connect(broker.tcp_port, raw_clients)
    await c.sub("joined", "ch", rdy=0)
    p = await connect(broker.tcp_port, raw_clients)

    def pub(topic: bytes, body: bytes) -> bytes:
        return b"PUB " + topic + b"\n" + struct.pack(">i", len(body)) + body

    mpub = struct.pack(">i", 1) + struct.pack(">i", 3) + b"m00"
    sent = ([pub(b"joined", b"a%02d" % i) for i in range(50)]
            + [pub(b"other", b"o00"), pub(b"joined", b"b00"), b"NOP\n",
               b"MPUB joined\n" + struct.pack(">i", len(mpub)) + mpub, pub(b"joined", b"c00")])
    p.writer.write(b"".join(sent))  # one write: the broker reads them in one go
    replies = [await p.read() for _ in range(54)]  # 50 + 1 + 1 PUB, 1 MPUB, 1 PUB
    assert [(f.type, f.data) for f in replies] == [(0, b"OK")] * 54
    assert sum(calls) == 54
    assert len(calls) < 20  # the 50 pipelined PUBs were not stored one by one
    c.send(b"RDY 100")
    got = [(await c.read()).body for _ in range(53)]
    assert got == [b"a%02d" % i for i in range(50)] + [b"b00", b"m00", b"c00"]
