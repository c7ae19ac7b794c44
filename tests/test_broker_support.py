"""Shared fixtures and a raw protocol V2 client for the broker tests (no tests here)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import ssl
import struct
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aiodiskqueue.broker import BrokerOptions, BrokerServer
from aiodiskqueue.broker._protocol import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2

TIMEOUT = 20.0
"""Upper bound for any single wait in these tests, so that every test stops by itself."""

SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def make_pki(directory: Path) -> dict[str, Path]:
    """A throwaway PKI made with the openssl command: a CA; a server certificate for
    ``localhost`` and 127.0.0.1 and a client certificate (CN ``client-1``), both signed
    by the CA; a self-signed client certificate (CN ``rogue``). Keys are P-256.

    Returns the paths: ``ca``, ``server_cert``, ``server_key``, ``client_cert``,
    ``client_key``, ``rogue_cert``, ``rogue_key``.
    """
    d = directory
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
        "-days", "2", "-subj", "/CN=aiodiskqueue test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, cn, ext in (
        ("server", "localhost",
         "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "client-1", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(ext)
        run("req", *ec, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
            "-out", str(d / f"{name}.pem"), "-extfile", str(d / f"{name}.ext"))
    run("req", "-x509", *ec, "-keyout", str(d / "rogue.key"), "-out", str(d / "rogue.pem"),
        "-days", "2", "-subj", "/CN=rogue")
    return {"ca": d / "ca.pem", "server_cert": d / "server.pem", "server_key": d / "server.key",
            "client_cert": d / "client.pem", "client_key": d / "client.key",
            "rogue_cert": d / "rogue.pem", "rogue_key": d / "rogue.key"}


def client_tls_context(pki: dict[str, Path], cert: str | None = None) -> ssl.SSLContext:
    """A client context trusting the test CA; with ``cert`` (``client`` or ``rogue``),
    presenting that certificate."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert is not None:
        ctx.load_cert_chain(str(pki[f"{cert}_cert"]), str(pki[f"{cert}_key"]))
    return ctx


MakeBroker = Callable[..., Awaitable[BrokerServer]]


@pytest.fixture
async def make_broker(tmp_path: Path) -> AsyncIterator[MakeBroker]:
    """Start brokers on ephemeral loopback ports over ``tmp_path/data``; all closed at the end.

    Keyword arguments are :class:`BrokerOptions` (and ``https_port``); the test
    defaults are 1 KiB messages and 4 KiB MPUB bodies.
    """
    servers: list[BrokerServer] = []

    async def make(*, https_port: int | None = None, **options: Any) -> BrokerServer:
        opts = {"max_msg_size": 1024, "max_body_size": 4096, **options}
        server = BrokerServer(tmp_path / "data", tcp_port=0, http_port=0, https_port=https_port,
                              options=BrokerOptions(**opts))
        servers.append(server)
        await server.start()
        return server

    try:
        yield make
    finally:
        for s in servers:
            await s.aclose()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The test PKI of :func:`make_pki`, made once per run."""
    return make_pki(tmp_path_factory.mktemp("pki"))


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
    """A byte-level protocol V2 client: write commands, read frames (heartbeats skipped).

    :meth:`start_tls`, :meth:`use_deflate` and :meth:`use_snappy` upgrade it as
    an NSQ client does after IDENTIFY.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._encode: Callable[[bytes], bytes] | None = None
        self._decode: Callable[[bytes], bytes] | None = None
        self._decoded = b""

    async def start_tls(self, ctx: ssl.SSLContext) -> None:
        """Upgrade the connection to TLS (the server's certificate is for localhost)."""
        await self.writer.start_tls(ctx, server_hostname="localhost")

    def use_deflate(self) -> None:
        """Raw deflate both ways from here on, each write flushed."""
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        decomp = zlib.decompressobj(-15)
        self._encode = lambda data: comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)
        self._decode = decomp.decompress

    def use_snappy(self) -> None:
        """Snappy framing both ways from here on: each write a whole framed stream
        (cramjam's), what arrives decoded chunk by chunk by cramjam."""
        import cramjam

        raw = bytearray()

        def decode(data: bytes) -> bytes:
            raw.extend(data)
            pos = 0
            while len(raw) - pos >= 4:  # complete chunks only
                n = int.from_bytes(raw[pos + 1:pos + 4], "little")
                if len(raw) - pos - 4 < n:
                    break
                pos += 4 + n
            chunks = bytes(raw[:pos])
            del raw[:pos]
            if chunks.startswith(SNAPPY_STREAM_ID):
                chunks = chunks[len(SNAPPY_STREAM_ID):]
            return bytes(cramjam.snappy.decompress(SNAPPY_STREAM_ID + chunks)) if chunks else b""

        self._encode = lambda data: bytes(cramjam.snappy.compress(data))
        self._decode = decode

    def write(self, data: bytes) -> None:
        """Write bytes as they are, through the compression if any."""
        self.writer.write(self._encode(data) if self._encode is not None else data)

    async def _readexactly(self, n: int) -> bytes:
        if self._decode is None:
            return await self.reader.readexactly(n)
        while len(self._decoded) < n:
            raw = await self.reader.read(65536)
            if not raw:
                raise asyncio.IncompleteReadError(self._decoded, n)
            self._decoded += self._decode(raw)
        data, self._decoded = self._decoded[:n], self._decoded[n:]
        return data

    @classmethod
    async def connect(cls, port: int, *, magic: bytes = MAGIC_V2) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(magic)
        return cls(reader, writer)

    def send(self, line: bytes, body: bytes | None = None) -> None:
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.write(data)

    async def identify(self, **fields: Any) -> Frame:
        self.send(b"IDENTIFY", json.dumps(fields).encode())
        return await self.read()

    async def read(self, *, skip_heartbeats: bool = True) -> Frame:
        while True:
            head = await asyncio.wait_for(self._readexactly(8), TIMEOUT)
            size, ftype = struct.unpack(">ii", head)
            data = await asyncio.wait_for(self._readexactly(size - 4), TIMEOUT)
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
