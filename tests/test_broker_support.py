"""Shared fixtures and a raw protocol V2 client for the broker tests (no tests here)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue.broker import BrokerOptions, BrokerServer
from aiodiskqueue.broker._protocol import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2

TIMEOUT = 20.0
"""Upper bound for any single wait in these tests, so that every test stops by itself."""


MakeBroker = Callable[..., Awaitable[BrokerServer]]


@pytest.fixture
async def make_broker(tmp_path: Path) -> AsyncIterator[MakeBroker]:
    """Start brokers on ephemeral loopback ports over ``tmp_path/data``; all closed at the end.

    Keyword arguments are :class:`BrokerOptions`; the test defaults are 1 KiB
    messages and 4 KiB MPUB bodies.
    """
    servers: list[BrokerServer] = []

    async def make(**options: Any) -> BrokerServer:
        opts = {"max_msg_size": 1024, "max_body_size": 4096, **options}
        server = BrokerServer(tmp_path / "data", tcp_port=0, http_port=0,
                              options=BrokerOptions(**opts))
        servers.append(server)
        await server.start()
        return server

    try:
        yield make
    finally:
        for s in servers:
            await s.aclose()


@pytest.fixture
async def broker(make_broker: MakeBroker) -> BrokerServer:
    """A broker with the test defaults."""
    return await make_broker()


class Frame:
    """One frame read from the broker."""

    def __init__(self, ftype: int, data: bytes) -> None:
        self.type = ftype
        self.data = data

    @property
    def is_message(self) -> bool:
        return self.type == FRAME_MESSAGE

    @property
    def is_error(self) -> bool:
        return self.type == FRAME_ERROR

    @property
    def is_response(self) -> bool:
        return self.type == FRAME_RESPONSE

    @property
    def msg_id(self) -> bytes:
        return self.data[10:26]

    @property
    def attempts(self) -> int:
        return int(struct.unpack(">H", self.data[8:10])[0])

    @property
    def timestamp(self) -> int:
        return int(struct.unpack(">q", self.data[:8])[0])

    @property
    def body(self) -> bytes:
        return self.data[26:]

    def __repr__(self) -> str:
        return f"<Frame {self.type} {self.data[:60]!r}>"


class RawClient:
    """A byte-level protocol V2 client: write commands, read frames (heartbeats skipped)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, *, magic: bytes = MAGIC_V2) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(magic)
        return cls(reader, writer)

    def send(self, line: bytes, body: bytes | None = None) -> None:
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.writer.write(data)

    async def identify(self, **fields: Any) -> Frame:
        self.send(b"IDENTIFY", json.dumps(fields).encode())
        return await self.read()

    async def read(self, *, skip_heartbeats: bool = True) -> Frame:
        while True:
            head = await asyncio.wait_for(self.reader.readexactly(8), TIMEOUT)
            size, ftype = struct.unpack(">ii", head)
            data = await asyncio.wait_for(self.reader.readexactly(size - 4), TIMEOUT)
            if skip_heartbeats and ftype == FRAME_RESPONSE and data == b"_heartbeat_":
                self.send(b"NOP")
                continue
            return Frame(ftype, data)

    async def expect_ok(self) -> None:
        f = await self.read()
        assert (f.type, f.data) == (FRAME_RESPONSE, b"OK"), f

    async def pub(self, topic: str, body: bytes) -> None:
        self.send(b"PUB " + topic.encode(), body)
        await self.expect_ok()

    async def sub(self, topic: str, channel: str, rdy: int = 1) -> None:
        self.send(f"SUB {topic} {channel}".encode())
        await self.expect_ok()
        if rdy:
            self.send(f"RDY {rdy}".encode())

    async def closed_by_server(self) -> bool:
        """True once the server closed the connection (EOF), reading off anything left."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), TIMEOUT):
                pass
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


@pytest.fixture
async def raw_clients() -> AsyncIterator[list[RawClient]]:
    """A list to register raw clients in; each is closed at the end of the test."""
    clients: list[RawClient] = []
    try:
        yield clients
    finally:
        for c in clients:
            await c.close()


async def connect(port: int, clients: list[RawClient], **identify: Any) -> RawClient:
    """A connected raw client that sent IDENTIFY (with ``identify`` fields, if any)."""
    c = await RawClient.connect(port)
    clients.append(c)
    if identify:
        f = await c.identify(**identify)
        assert f.is_response, f
    return c


def start_broker_process(data_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], int, int]:
    """Start ``python -m aiodiskqueue.broker`` on ephemeral ports; return it and its ports."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiodiskqueue.broker", "--data-dir", str(data_dir),
         "--tcp-port", "0", "--http-port", "0", *extra],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("LISTENING"):
        proc.kill()
        proc.wait()
        raise AssertionError(f"broker did not start: {line!r}")
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return proc, int(fields["tcp"]), int(fields["http"])


async def eventually(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Poll real state until ``predicate()`` holds (commands like FIN have no reply to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not hold within {TIMEOUT} s")
        await asyncio.sleep(0.01)


def channel_stats(server: BrokerServer, topic: str, channel: str) -> dict[str, Any]:
    """The ``/stats`` entry of one channel."""
    t = server.broker.stats(topic, channel)["topics"][0]
    chans: list[dict[str, Any]] = t["channels"]
    return chans[0]
