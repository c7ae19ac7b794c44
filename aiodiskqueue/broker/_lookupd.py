"""Registration with nsqlookupd, as nsqd does it (``--lookupd-tcp-address``).

One :class:`LookupdPeer` per nsqlookupd speaks its TCP protocol V1: the
magic ``"  V1"``, then ``IDENTIFY`` with a JSON body (broadcast address,
hostname, TCP and HTTP ports, version), then ``REGISTER topic [channel]`` for
every topic (a topic with channels: one per channel, which registers the
topic too) and ``PING`` every 15 s. Topics and channels created or deleted
later are sent as ``REGISTER``/``UNREGISTER``. Every command gets one
response, a 4-byte big-endian size and that many bytes (``OK``, the
lookupd's JSON for ``IDENTIFY``, or an error text). A lost connection is
made again at the next ping tick, and everything registered again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from typing import TYPE_CHECKING

from ._options import split_host_port
from ._protocol import VERSION
from ._tasks import cancel_and_wait

if TYPE_CHECKING:
    from ._broker import Broker

log = logging.getLogger(__name__)

PING_INTERVAL = 15.0
"""Seconds between PINGs, and between attempts to reconnect (nsqd's 15 s)."""

_IO_TIMEOUT = 5.0
_MAX_RESPONSE = 1 << 20
_MAGIC_V1 = b"  V1"


class LookupdError(Exception):
    """A lookupd answered a command with an error, or the connection failed."""


def command(name: str, *params: str) -> bytes:
    """A lookupd command line without a body (``REGISTER t c``, ``PING``)."""
    return " ".join((name, *params)).encode() + b"\n"


def register_commands(broker: Broker) -> list[bytes]:
    """``REGISTER`` for every topic and channel of ``broker``, as nsqd syncs a new connection."""
    out = []
    for tname in sorted(broker.topics):
        topic = broker.topics[tname]
        if not topic.channels:
            out.append(command("REGISTER", tname))
        out += [command("REGISTER", tname, c) for c in sorted(topic.channels)]
    return out


class LookupdPeer:
    """The registration of a broker with one nsqlookupd (``host:port`` of its TCP port)."""

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.address = address
        self.host, self.port = split_host_port(address)
        self.connected = False
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def start(self) -> None:
        """Connect in the background (and keep reconnecting)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lookupd-{self.address}")

    def notify(self, cmd: bytes) -> None:
        """Send ``cmd`` (a REGISTER or UNREGISTER) when connected; a reconnect re-registers all."""
        if self.connected:
            self._queue.put_nowait(cmd)

    async def aclose(self) -> None:
        """Stop and close the connection (nsqlookupd drops the registrations with it)."""
        t, self._task = self._task, None
        await cancel_and_wait(t)
        self._close()

    def _close(self) -> None:
        self.connected = False
        w, self._writer = self._writer, None
        if w is not None:
            w.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._connect()
                next_ping = loop.time() + PING_INTERVAL
                while True:
                    try:
                        async with asyncio.timeout_at(next_ping):
                            cmd = await self._queue.get()
                    except TimeoutError:
                        cmd = command("PING")
                        next_ping = loop.time() + PING_INTERVAL
                    await self._command(cmd)
            except (OSError, LookupdError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.warning("lookupd %s: %s; retrying in %g s", self.address, exc or
                            type(exc).__name__, PING_INTERVAL)
                self._close()
            await asyncio.sleep(PING_INTERVAL)

    async def _connect(self) -> None:
        async with asyncio.timeout(_IO_TIMEOUT):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        self._reader, self._writer = reader, writer
        writer.write(_MAGIC_V1)
        b = self.broker
        body = json.dumps({
            "broadcast_address": b.broadcast_address,
            "hostname": socket.gethostname(),
            "tcp_port": b.tcp_port,
            "http_port": b.http_port,
            "version": VERSION,
        }).encode()
        resp = await self._command(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        log.info("lookupd %s: identified: %s", self.address, resp[:200].decode(errors="replace"))
        # Commands queued before this point are covered by the full sync below.
        while not self._queue.empty():
            self._queue.get_nowait()
        self.connected = True
        for cmd in register_commands(b):
            await self._command(cmd)

    async def _command(self, cmd: bytes) -> bytes:
        """Send ``cmd`` and read its response. Raises LookupdError for an error answer."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(cmd)
        async with asyncio.timeout(_IO_TIMEOUT):
            await self._writer.drain()
        async with asyncio.timeout(_IO_TIMEOUT):
            head = await self._reader.readexactly(4)
        (size,) = struct.unpack(">i", head)
        if not 0 <= size <= _MAX_RESPONSE:
            raise LookupdError(f"bad response size {size}")
        async with asyncio.timeout(_IO_TIMEOUT):
            resp = await self._reader.readexactly(size)
        if resp.startswith(b"E_"):
            raise LookupdError(f"{cmd.split(b' ')[0].strip().decode()} failed: "
                               f"{resp[:200].decode(errors='replace')}")
        return resp


__all__ = ["PING_INTERVAL", "LookupdError", "LookupdPeer", "command", "register_commands"]
