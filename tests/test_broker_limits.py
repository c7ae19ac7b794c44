"""Bad input a protocol fuzzer found: each answered as nsqd 1.3.0 answers it."""

from __future__ import annotations

import struct

import pytest
from test_broker_support import RawClient, broker, connect, make_broker, raw_clients

from aiodiskqueue.broker import BrokerServer
from aiodiskqueue.broker._input import LINE_LIMIT

__all__ = ["broker", "make_broker", "raw_clients"]  # fixtures used by the tests below


@pytest.mark.parametrize(
    "body",
    [b'{"heartbeat_interval": ' + b"9" * 5000 + b"}",
     b'{"sample_rate": -' + b"1" * 5000 + b"}",
     b'{"unknown": ' + b"7" * 5000 + b"}"],
    ids=["known-field", "negative", "unknown-field"],
)
async def test_identify_with_a_huge_integer_is_e_bad_body(
    make_broker: object, raw_clients: list[RawClient], body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server: BrokerServer = await make_broker(max_body_size=1 << 16)  # type: ignore[operator]
    c = await connect(server.tcp_port, raw_clients)
    c.send(b"IDENTIFY", body)
    f = await c.read()
    if body.startswith(b'{"unknown"'):  # a number nsqd skips: valid JSON, an empty identify
        assert (f.is_response, f.data) == (True, b"OK")
        return
    assert (f.is_error, f.data) == (True, b"E_BAD_BODY IDENTIFY failed to decode JSON body")
    assert await c.closed_by_server()
    assert "unexpected error" not in caplog.text


@pytest.mark.parametrize("newline", [b"", b"\n"], ids=["no-newline", "newline"])
async def test_a_line_longer_than_nsqds_buffer_closes_the_connection(
    broker: BrokerServer, raw_clients: list[RawClient], newline: bytes
) -> None:
    keeper = await connect(broker.tcp_port, raw_clients)
    bad = await connect(broker.tcp_port, raw_clients)
    bad.writer.write(b"X" * 70_000 + newline)
    # nsqd answers nothing: the line does not fit its 16 KiB read buffer.
    assert await bad.reader.read() == b""
    await keeper.pub("kept", b"the other client is served")


@pytest.mark.parametrize(("size", "served"), [(LINE_LIMIT, True), (LINE_LIMIT + 1, False)],
                         ids=["fits", "one-byte-over"])
async def test_the_line_limit_is_16_kib_with_the_newline(
    broker: BrokerServer, raw_clients: list[RawClient], size: int, served: bool
) -> None:
    assert LINE_LIMIT + 1 == 16 * 1024
    c = await connect(broker.tcp_port, raw_clients)
    c.send(b"NOP" + b" " * (size - 3))  # a NOP with empty parameters: no answer
    if served:
        await c.pub("limit", b"after a long NOP")
    else:
        assert await c.reader.read() == b""


async def test_a_line_trickling_in_past_the_limit_closes_the_connection(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    c.writer.write(b"PUB " + b"t" * 10_000)
    await c.writer.drain()
    c.writer.write(b"t" * 10_000)  # 20,004 bytes and still no newline: past the limit
    assert await c.reader.read() == b""


async def test_mpub_count_checked_against_the_body_limit(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    c.send(b"MPUB t", struct.pack(">i", (4096 - 4) // 5 + 1))
    f = await c.read()
    assert (f.is_error, f.data) == (True, b"E_BAD_BODY MPUB invalid message count 819")
