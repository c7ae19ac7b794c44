"""Compression negotiated in IDENTIFY, as nsqd 1.3.0: raw deflate and snappy's framing
format, each direction of the stream, after TLS when both are asked."""

from __future__ import annotations

import json
import logging
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import cramjam
import pytest
from test_broker_support import (
    SNAPPY_STREAM_ID,
    MakeBroker,
    RawClient,
    broker,
    client_tls_context,
    connect,
    make_broker,
    pki,
    raw_clients,
)

from aiodiskqueue.broker import BrokerServer
from aiodiskqueue.broker._compress import deflate_codec, snappy_codec
from aiodiskqueue.broker._input import BadStream

__all__ = ["broker", "make_broker", "pki", "raw_clients"]  # fixtures used by the tests below


async def compressed_client(server: BrokerServer, clients: list[RawClient], kind: str,
                            **identify: Any) -> tuple[RawClient, dict[str, Any]]:
    """A client that asked for ``kind`` (deflate or snappy) and switched to it."""
    c = await connect(server.tcp_port, clients)
    f = await c.identify(feature_negotiation=True, **{kind: True}, **identify)
    assert f.is_response, f
    answer = json.loads(f.data)
    assert answer[kind] is True
    c.use_deflate() if kind == "deflate" else c.use_snappy()
    await c.expect_ok()  # nsqd's OK, compressed
    return c, answer


@pytest.mark.parametrize("kind", ["deflate", "snappy"])
async def test_pub_sub_over_a_compressed_stream(
    broker: BrokerServer, raw_clients: list[RawClient], kind: str
) -> None:
    consumer, _ = await compressed_client(broker, raw_clients, kind)
    await consumer.sub("packed", "ch", rdy=100)
    producer, _ = await compressed_client(broker, raw_clients, kind)
    rng = random.Random(7)
    bodies = [rng.randbytes(rng.randrange(1, 1000)) if i % 2 else b"a" * 1000 for i in range(50)]
    for b in bodies:
        await producer.pub("packed", b)
    producer.send(b"MPUB packed", struct.pack(">i", 2) + b"".join(
        struct.pack(">i", len(b)) + b for b in (b"m1", b"m2")))
    await producer.expect_ok()
    got = []
    for _ in range(len(bodies) + 2):
        m = await consumer.read()
        got.append(m.body)
        consumer.send(b"FIN " + m.msg_id)
    assert got == [*bodies, b"m1", b"m2"]
    (client,) = broker.broker.stats("packed", "ch")["topics"][0]["channels"][0]["clients"]
    assert client[kind] is True and client["deflate" if kind == "snappy" else "snappy"] is False


async def test_deflate_level_negotiated_and_capped(
    make_broker: MakeBroker, raw_clients: list[RawClient]
) -> None:
    server = await make_broker(max_deflate_level=4)
    c, answer = await compressed_client(server, raw_clients, "deflate", deflate_level=9)
    assert (answer["deflate_level"], answer["max_deflate_level"]) == (4, 4)
    await c.pub("lvl", b"x" * 500)


async def test_both_compressions_is_e_identify_failed(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, deflate=True, snappy=True)
    assert (f.is_error, f.data) == (
        True, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    assert await c.closed_by_server()


@pytest.mark.parametrize("kind", ["deflate", "snappy"])
async def test_a_disabled_compression_is_answered_false(
    make_broker: MakeBroker, raw_clients: list[RawClient], kind: str
) -> None:
    server = await make_broker(**{kind: False})
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, **{kind: True})
    assert json.loads(f.data)[kind] is False
    await c.pub("plain", b"uncompressed")


@pytest.mark.parametrize("kind", ["deflate", "snappy"])
async def test_tls_then_compression(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: dict[str, Path], kind: str
) -> None:
    server = await make_broker(tls_cert=str(pki["server_cert"]), tls_key=str(pki["server_key"]))
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True, **{kind: True})
    answer = json.loads(f.data)
    assert answer["tls_v1"] is True and answer[kind] is True
    await c.start_tls(client_tls_context(pki))
    await c.expect_ok()  # TLS's OK: over TLS, not compressed
    c.use_deflate() if kind == "deflate" else c.use_snappy()
    await c.expect_ok()  # the compression's OK
    await c.sub("both", "ch")
    await c.pub("both", b"encrypted and compressed")
    assert (await c.read()).body == b"encrypted and compressed"
    (conn,) = server.tcp.connections.values()
    assert conn.stats()["tls"] is True and conn.stats()[kind] is True


def _flip_crc() -> bytes:
    wire = bytearray(cramjam.snappy.compress(b"NOP\n" * 50))
    wire[len(SNAPPY_STREAM_ID) + 4] ^= 0x01  # the first chunk's checksum
    return bytes(wire)


_BAD_CRC = _flip_crc()


@pytest.mark.parametrize(
    ("kind", "garbage", "reason"),
    [("snappy", b"PUB t\n", "is too long"),  # plain bytes where chunks must be
     ("snappy", _BAD_CRC, "bad checksum"),
     ("snappy", SNAPPY_STREAM_ID + b"\x00\x10\x00\x00" + b"\x00" * 16, "bad chunk"),
     ("snappy", SNAPPY_STREAM_ID + b"\x05\x01\x00\x00x", "unsupported chunk type 0x5"),
     ("snappy", SNAPPY_STREAM_ID + b"\x00\xff\xff\xff", "is too long"),
     ("snappy", b"\x01\x05\x00\x00\x00\x00\x00\x00x", "does not start with its identifier"),
     ("deflate", b"\xff" * 64, "deflate: Error -3")],
    ids=["snappy-plain", "snappy-checksum", "snappy-corrupt", "snappy-reserved",
         "snappy-too-long", "snappy-no-identifier", "deflate"],
)
async def test_garbage_after_asking_for_compression_closes_only_that_connection(
    broker: BrokerServer, raw_clients: list[RawClient], kind: str, garbage: bytes, reason: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiodiskqueue.broker._server")
    keeper = await connect(broker.tcp_port, raw_clients)
    c, _ = await compressed_client(broker, raw_clients, kind)
    c.writer.write(garbage)  # not through the client's encoder
    assert await c.closed_by_server()  # as nsqd: no answer, the stream is unreadable
    await keeper.pub("kept", b"the other client is served")
    assert reason in caplog.text
    assert "unexpected error" not in caplog.text


def test_snappy_encoder_writes_as_gos_library() -> None:
    encode, _ = snappy_codec()
    first = encode(b"hello world")
    # The stream identifier once, then a chunk: too short to compress, so stored
    # (type 1) with its masked CRC-32C, as Go's snappy.Writer does.
    assert first.startswith(SNAPPY_STREAM_ID)
    assert first[10] == 0x01 and first[11:14] == (4 + 11).to_bytes(3, "little")
    assert first.endswith(b"hello world")
    second = encode(b"z" * 200_000)
    assert not second.startswith(SNAPPY_STREAM_ID)
    assert second[0] == 0x00  # compressible: a compressed chunk
    assert bytes(cramjam.snappy.decompress(first + second)) == b"hello world" + b"z" * 200_000


@pytest.mark.parametrize("seed", range(5))
def test_snappy_decoder_takes_any_split_of_the_stream(seed: int) -> None:
    rng = random.Random(seed)
    data = b"".join(rng.randbytes(rng.randrange(0, 3000)) + b"q" * rng.randrange(0, 90_000)
                    for _ in range(4))
    wire = bytes(cramjam.snappy.compress(data)) + b"\xfe\x02\x00\x00pp"  # padding: skipped
    wire += bytes(cramjam.snappy.compress(b"tail"))  # a second identifier: allowed
    _, decode = snappy_codec()
    cuts = sorted(rng.sample(range(1, len(wire)), 30))
    out = b"".join(decode(wire[a:b]) for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True))
    assert out == data + b"tail"


def test_snappy_decoder_needs_the_stream_identifier_first() -> None:
    _, decode = snappy_codec()
    with pytest.raises(BadStream, match="does not start with its identifier"):
        decode(bytes(cramjam.snappy.compress(b"abc"))[10:])


def test_deflate_codec_round_trip_and_a_client_that_ends_its_stream() -> None:
    encode, decode = deflate_codec(6)
    d = zlib.decompressobj(-15)
    assert d.decompress(encode(b"one")) + d.decompress(encode(b"two")) == b"onetwo"
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert decode(c.compress(b"abc") + c.flush(zlib.Z_SYNC_FLUSH)) == b"abc"
    with pytest.raises(BadStream, match="the stream ended"):
        decode(c.flush())


async def test_without_cramjam_snappy_is_answered_false_and_said_once(
    make_broker: MakeBroker, raw_clients: list[RawClient], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("aiodiskqueue.broker._options.snappy_available", lambda: False)
    monkeypatch.setattr("aiodiskqueue.broker._tcp.snappy_available", lambda: False)
    server = await make_broker()
    assert "the cramjam package is missing" in caplog.text
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, snappy=True)
    assert json.loads(f.data)["snappy"] is False
    await c.pub("plain", b"uncompressed")
