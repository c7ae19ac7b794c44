"""The protocol V2 listener: one :class:`~._server.Connection` task per accepted client."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from ._auth import AuthClient
from ._broker import Broker
from ._compress import snappy_available
from ._input import READ_SIZE
from ._server import Connection

log = logging.getLogger(__name__)


class TCPServer:
    """Accepts protocol V2 connections for a :class:`Broker`."""

    def __init__(self, broker: Broker, *, tls_context: ssl.SSLContext | None = None) -> None:
        self.broker = broker
        self.tls_context = tls_context
        """Clients that ask for ``tls_v1`` in IDENTIFY upgrade with it; None: no TLS."""
        if broker.options.snappy and not snappy_available():
            log.warning("snappy is on but the cramjam package is missing: clients that ask "
                        "for snappy get none (pip install 'asyncio-diskqueue[broker]')")
        self.auth = AuthClient(broker.options)
        """The auth servers' client, shared by the connections (unused without servers)."""
        self.connections: dict[int, Connection] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port); return the port."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=READ_SIZE)
        sock = self._server.sockets[0]
        real_port: int = sock.getsockname()[1]
        return real_port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self.broker, reader, writer, tls_context=self.tls_context,
                          auth=self.auth)
        self.connections[conn.id] = conn
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        finally:
            self.connections.pop(conn.id, None)
            if task is not None:
                self._tasks.discard(task)

    def producer_stats(self, topic: str = "") -> list[dict[str, Any]]:
        """nsqd's ``producers``: the stats of every client that published (their
        ``pub_counts`` only of ``topic`` if given)."""
        return [c.stats(topic) for _, c in sorted(self.connections.items()) if c.pub_counts]

    async def aclose(self) -> None:
        """Stop listening and close every connection (their in-flight messages are requeued)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            conn.close()
        if self._tasks:
            # Each handler sees its stream end and tears down (requeues) by itself.
            await asyncio.wait(list(self._tasks), timeout=10.0)
        if self._server is not None:
            await self._server.wait_closed()
        await self.auth.aclose()


__all__ = ["TCPServer"]
