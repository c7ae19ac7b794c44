"""Validated broker options (nsqd's flags that this broker honours)."""

from __future__ import annotations

from dataclasses import dataclass

from .._core.options import DEFAULTS, MiB, integer, number
from .._format import nsq
from ..ack.options import ACK_DEFAULTS
from ._identify import Limits


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    """Limits and storage settings of a :class:`Broker`; times in seconds.

    Defaults are nsqd's: 1 MiB messages, 5 MiB MPUB bodies, RDY up to 2500,
    60 s message timeout (a client may ask for 1 s to 15 min), requeue and
    DPUB delays up to 1 hour, heartbeats every 30 s (a client may ask for
    1-60 s). ``max_attempts`` > 0 moves a message that was delivered that many
    times to the channel's dead-letter queue instead of delivering it again.
    ``sync_every``/``sync_interval`` are passed to every queue.
    ``broadcast_address`` is the host clients are told to connect to (in
    ``/info`` and to nsqlookupd; empty: the hostname, as nsqd);
    ``lookupd_tcp_addresses`` are the ``host:port`` of the nsqlookupd nodes
    to register with. ``http_read_timeout`` bounds how long an HTTP client
    may take to send its request headers (or stay idle between requests) and
    its request body; the connection is closed after it.

    Raises TypeError or ValueError naming the bad value.
    """

    max_msg_size: int = DEFAULTS.max_msg_size
    max_body_size: int = 5 * MiB
    max_rdy_count: int = 2500
    msg_timeout: float = ACK_DEFAULTS.msg_timeout
    max_msg_timeout: float = ACK_DEFAULTS.max_msg_timeout
    max_req_timeout: float = ACK_DEFAULTS.max_delay
    heartbeat_interval: float = 30.0
    max_heartbeat_interval: float = 60.0
    max_attempts: int = ACK_DEFAULTS.max_attempts
    sync_every: int = DEFAULTS.sync_every
    sync_interval: float = DEFAULTS.sync_interval
    max_bytes_per_file: int = DEFAULTS.max_bytes_per_file
    http_read_timeout: float = 60.0
    broadcast_address: str = ""
    lookupd_tcp_addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.broadcast_address, str):
            raise TypeError(f"broadcast_address must be a str, got "
                            f"{type(self.broadcast_address).__name__}")
        if not isinstance(self.lookupd_tcp_addresses, tuple):
            raise TypeError(f"lookupd_tcp_addresses must be a tuple, got "
                            f"{type(self.lookupd_tcp_addresses).__name__}")
        for addr in self.lookupd_tcp_addresses:
            split_host_port(addr)
        for name in ("max_body_size", "max_rdy_count", "sync_every", "max_bytes_per_file"):
            integer(name, getattr(self, name), 1)
        # A stored message is the body behind nsqd's header, in a record of at most 2**31-1.
        integer("max_msg_size", self.max_msg_size, 1, 2**31 - 1 - nsq.HEADER_SIZE)
        integer("max_attempts", self.max_attempts, 0, 65535)
        for name in ("msg_timeout", "max_msg_timeout", "max_req_timeout", "heartbeat_interval",
                     "max_heartbeat_interval", "sync_interval", "http_read_timeout"):
            number(name, getattr(self, name), positive=True)
        if self.msg_timeout > self.max_msg_timeout:
            raise ValueError(
                f"msg_timeout must be <= max_msg_timeout, got {self.msg_timeout} > "
                f"{self.max_msg_timeout}"
            )
        if self.heartbeat_interval > self.max_heartbeat_interval:
            raise ValueError(
                f"heartbeat_interval must be <= max_heartbeat_interval, got "
                f"{self.heartbeat_interval} > {self.max_heartbeat_interval}"
            )

    def limits(self) -> Limits:
        """The IDENTIFY negotiation limits, in milliseconds."""
        return Limits(
            msg_timeout_ms=round(self.msg_timeout * 1000),
            max_msg_timeout_ms=round(self.max_msg_timeout * 1000),
            heartbeat_interval_ms=round(self.heartbeat_interval * 1000),
            max_heartbeat_interval_ms=round(self.max_heartbeat_interval * 1000),
            max_rdy_count=self.max_rdy_count,
        )


def split_host_port(addr: object) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port`` too) as ``(host, port)``.

    Raises TypeError or ValueError naming the bad value.
    """
    if not isinstance(addr, str):
        raise TypeError(f"a lookupd address must be a str, got {type(addr).__name__}")
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a lookupd address must be host:port, got {addr!r}")
    return host, int(port)


__all__ = ["BrokerOptions", "split_host_port"]
