"""The broker's command reader: lines and bodies back in the order sent, however the
bytes arrive, and the errors StreamReader gives for a line too long and an early end."""

from __future__ import annotations

import asyncio
import random

import pytest

from aiodiskqueue.broker._input import CommandReader


def _reader(*chunks: bytes, eof: bool = True, limit: int = 64) -> CommandReader:
    stream = asyncio.StreamReader(limit=limit)  # as the broker's server: the same limit
    for c in chunks:
        stream.feed_data(c)
    if eof:
        stream.feed_eof()
    return CommandReader(stream, limit)


@pytest.mark.parametrize("seed", range(20))
async def test_lines_and_bodies_come_back_in_order_whatever_the_chunks(seed: int) -> None:
    rng = random.Random(seed)
    items: list[tuple[str, bytes]] = []
    for _ in range(rng.randrange(1, 60)):
        if rng.random() < 0.6:
            items.append(("line", b"FIN %016x" % rng.getrandbits(64)))
        else:  # a body of any bytes, newlines too, sometimes far larger than a chunk
            items.append(("body", rng.randbytes(rng.choice([0, 1, 7, 300, 5000]))))
    wire = b"".join(v + b"\n" if k == "line" else v for k, v in items)
    cuts = sorted(rng.sample(range(1, len(wire)), min(len(wire) - 1, rng.randrange(0, 40))))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    stream = asyncio.StreamReader(limit=1 << 16)
    r = CommandReader(stream, 64)

    async def feed() -> None:
        for c in chunks:
            stream.feed_data(c)
            await asyncio.sleep(0)
        stream.feed_eof()

    feeder = asyncio.ensure_future(feed())
    got: list[tuple[str, bytes]] = []
    for kind, value in items:
        if kind == "line":
            line = r.line_nowait()
            got.append(("line", line if line is not None else await r.readline()))
        else:
            got.append(("body", await r.readexactly(len(value))))
    await feeder
    assert got == items
    assert r.line_nowait() is None
    with pytest.raises(asyncio.IncompleteReadError):
        await r.readline()


async def test_line_nowait_waits_for_the_newline() -> None:
    r = _reader(b"NOP\nFIN 01", eof=False)
    assert await r.readline() == b"NOP"
    assert r.line_nowait() is None  # the rest of the line has not arrived
    r._stream.feed_data(b"23\nRDY 1\nNOP\n")
    assert await r.readline() == b"FIN 0123"
    assert await r.readline() == b"RDY 1"  # with what came with it
    assert r.line_nowait() == b"NOP"
    assert r.line_nowait() is None


@pytest.mark.parametrize("data", [b"X" * 65 + b"\n", b"X" * 200])
async def test_a_line_longer_than_the_limit_is_refused_whole_or_not(data: bytes) -> None:
    r = _reader(b"OK\n" + data, eof=False)
    assert await r.readline() == b"OK"
    assert r.line_nowait() is None
    with pytest.raises(asyncio.LimitOverrunError):
        await r.readline()


async def test_a_line_at_the_limit_is_read() -> None:
    r = _reader(b"Y" * 64 + b"\n")
    assert await r.readline() == b"Y" * 64


async def test_a_cancelled_read_takes_nothing() -> None:
    r = _reader(b"FIN 01", eof=False)
    for read in (r.readline(), r.readexactly(10)):
        task = asyncio.ensure_future(read)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    r._stream.feed_data(b"23\n")
    assert await r.readline() == b"FIN 0123"


async def test_a_line_arriving_a_byte_at_a_time_is_searched_once() -> None:
    # The part already here is not searched again for each byte that arrives.
    stream = asyncio.StreamReader(limit=1 << 16)
    r = CommandReader(stream, 1 << 16)
    line = b"X" * 20_000

    async def trickle() -> None:
        for i in range(len(line)):
            stream.feed_data(line[i:i + 1])
            await asyncio.sleep(0)
        stream.feed_data(b"\n")

    feeder = asyncio.ensure_future(trickle())
    assert await r.readline() == line
    await feeder


async def test_an_early_end_raises_incomplete_read_with_what_arrived() -> None:
    r = _reader(b"SUB t c")
    with pytest.raises(asyncio.IncompleteReadError) as line_end:
        await r.readline()
    assert line_end.value.partial == b"SUB t c"
    r = _reader(b"PUB t\n\x00\x00\x00\x05ab")
    assert await r.readline() == b"PUB t"
    assert await r.readexactly(4) == b"\x00\x00\x00\x05"
    with pytest.raises(asyncio.IncompleteReadError) as body_end:
        await r.readexactly(5)
    assert body_end.value.partial == b"ab"


async def test_unread_puts_bytes_back_before_the_rest() -> None:
    r = _reader(b"BODYNOP\nRDY 1\n", eof=False)
    body = await r.readexactly(7)
    assert body == b"BODYNOP"
    r.unread(body[4:] + b"\n")  # the part that was not the body: the next command
    assert await r.readline() == b"NOP"
    assert await r.readline() == b""  # the newline that followed the 7 bytes
    assert await r.readline() == b"RDY 1"
