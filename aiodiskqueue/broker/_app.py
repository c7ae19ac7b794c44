"""A broker with its TCP and HTTP front ends, started and stopped together."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Self

from ._broker import Broker
from ._http import HTTPApi
from ._lookupd import LookupdPeer
from ._options import BrokerOptions
from ._tcp import TCPServer
from ._tls import server_context


class BrokerServer:
    """An NSQ-compatible broker serving protocol V2 on TCP and nsqd's HTTP API.

    ``async with BrokerServer(data_dir, tcp_port=4150, http_port=4151) as b:``
    opens every topic and channel of ``data_dir`` and listens; ``b.tcp_port``
    and ``b.http_port`` are the real ports (pass 0 for ephemeral ones).
    ``https_port`` adds nsqd's HTTPS listener (the options' certificate), on
    ``https_host`` (default: ``host``).
    Raises ValueError for an HTTPS port without a certificate, OSError or
    ssl.SSLError if the certificate, key or CA file cannot be loaded.
    Closing stops listening, requeues what connected clients had in flight,
    and syncs every queue.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        tcp_port: int = 4150,
        http_port: int = 4151,
        https_port: int | None = None,
        https_host: str | None = None,
        options: BrokerOptions | None = None,
    ) -> None:
        self.broker = Broker(data_dir, options)
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.https_port = https_port
        self.https_host = host if https_host is None else https_host
        # Built at once, so that a bad certificate fails here, before anything opens.
        self.tls_context = server_context(self.broker.options)
        if https_port is not None and self.tls_context is None:
            raise ValueError("an HTTPS listener needs tls_cert and tls_key")
        self.tcp = TCPServer(self.broker, tls_context=self.tls_context)
        self.http = HTTPApi(self.broker, self.tcp.producer_stats)
        self._started = False

    async def start(self) -> None:
        """Open the data directory and start listening.

        Raises OSError if a port is taken, QueueLocked if another process
        serves the same data directory.
        """
        await self.broker.start()
        self._started = True
        self.tcp_port = self.broker.tcp_port = await self.tcp.start(self.host, self.tcp_port)
        if self.https_port is not None:
            self.https_port = self.http.https_port = await self.http.start(
                self.https_host, self.https_port, ssl_context=self.tls_context)
        self.http_port = self.broker.http_port = await self.http.start(self.host, self.http_port)
        # Registered once the ports are known, as nsqd.
        self.broker.lookupd = [LookupdPeer(self.broker, a)
                               for a in self.broker.options.lookupd_tcp_addresses]
        for peer in self.broker.lookupd:
            peer.start()

    async def aclose(self) -> None:
        """Stop listening, close connections, sync and close every queue; idempotent."""
        if not self._started:
            return
        self._started = False
        for peer in self.broker.lookupd:
            await peer.aclose()
        await self.tcp.aclose()
        await self.http.aclose()
        await self.broker.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


__all__ = ["BrokerServer"]
