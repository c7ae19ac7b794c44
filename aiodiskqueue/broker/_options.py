"""Validated broker options (nsqd's flags that this broker honours)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core.options import DEFAULTS, MiB, integer, number
from .._format import nsq
from ..ack.options import ACK_DEFAULTS, AckOptions
from ._compress import snappy_available
from ._identify import Limits

TLS_VERSIONS = {"tls1.0": "TLSv1", "tls1.1": "TLSv1_1", "tls1.2": "TLSv1_2", "tls1.3": "TLSv1_3"}
"""nsqd's ``--tls-min-version`` values and the :class:`ssl.TLSVersion` each names."""
UNBOUNDED_IN_FLIGHT = 1 << 40
"""A channel's AckQueue bound on messages out: none (each client's RDY is the bound)."""
TLS_REQUIRED_MODES = ("false", "true", "tcp-https")
"""nsqd's ``--tls-required``: no; TCP and HTTP clients; TCP clients only (HTTP stays open)."""


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

    Security, with nsqd's flags: ``tls_cert`` and ``tls_key`` let clients
    upgrade to TLS after IDENTIFY (and serve the HTTPS listener);
    ``tls_root_ca_file`` holds the CAs client certificates must chain to;
    ``tls_client_auth_policy`` ``"require"`` or ``"require-verify"`` refuses a
    client without a verified certificate and implies ``tls_required="true"``;
    ``tls_required`` ``"true"`` makes TCP clients upgrade before any command
    but IDENTIFY and the plain HTTP API answer 403 ``TLS_REQUIRED``,
    ``"tcp-https"`` the TCP clients only; ``tls_min_version`` is ``tls1.0`` to
    ``tls1.3``. ``deflate`` (up to ``max_deflate_level``) and ``snappy`` (with
    the ``cramjam`` package) may be negotiated, as nsqd by default.
    ``auth_http_addresses`` are auth servers (``host:port`` or a URL) asked,
    with the two HTTP client timeouts, for what an ``AUTH`` secret allows.

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
    tls_cert: str = ""
    tls_key: str = ""
    tls_root_ca_file: str = ""
    tls_client_auth_policy: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    auth_http_addresses: tuple[str, ...] = ()
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0

    def __post_init__(self) -> None:
        self._check_storage()
        self._check_security()
        self.queue_options()  # what the queues would refuse, refused now

    @property
    def tls_enabled(self) -> bool:
        """True when a certificate and key are given: clients may upgrade to TLS."""
        return bool(self.tls_cert or self.tls_key)

    @property
    def tls_required_mode(self) -> str:
        """``"false"``, ``"true"`` or ``"tcp-https"``; a client auth policy implies
        ``"true"`` unless set otherwise, as in nsqd."""
        if self.tls_client_auth_policy and self.tls_required == "false":
            return "true"
        return self.tls_required

    def _check_security(self) -> None:
        for name in ("tls_cert", "tls_key", "tls_root_ca_file", "tls_client_auth_policy",
                     "tls_required", "tls_min_version"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        if self.tls_client_auth_policy not in ("", "require", "require-verify"):
            raise ValueError("tls_client_auth_policy must be '', 'require' or 'require-verify', "
                             f"got {self.tls_client_auth_policy!r}")
        if self.tls_required not in TLS_REQUIRED_MODES:
            raise ValueError(f"tls_required must be one of {TLS_REQUIRED_MODES}, "
                             f"got {self.tls_required!r}")
        if self.tls_min_version not in TLS_VERSIONS:
            raise ValueError(f"tls_min_version must be one of {tuple(TLS_VERSIONS)}, "
                             f"got {self.tls_min_version!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together, got "
                             f"tls_cert={self.tls_cert!r} tls_key={self.tls_key!r}")
        if self.tls_required_mode != "false" and not self.tls_enabled:
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        for name in ("deflate", "snappy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        integer("max_deflate_level", self.max_deflate_level, 1, 9)
        if not isinstance(self.auth_http_addresses, tuple):
            raise TypeError(f"auth_http_addresses must be a tuple, got "
                            f"{type(self.auth_http_addresses).__name__}")
        for addr in self.auth_http_addresses:
            if not isinstance(addr, str) or not addr:
                raise ValueError(f"an auth address must be host:port or a URL, got {addr!r}")
            if "://" not in addr:
                split_host_port(addr, "an auth")
        for name in ("http_client_connect_timeout", "http_client_request_timeout"):
            number(name, getattr(self, name), positive=True)

    def _check_storage(self) -> None:
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

    def queue_options(self, *, dead_letters: bool = True) -> dict[str, Any]:
        """The keywords every channel's AckQueue is opened with (``format="nsq"``): the one
        mapping of the broker's settings onto the queue options, checked by
        :class:`~aiodiskqueue.ack.options.AckOptions`.

        With ``dead_letters`` the broker's ``max_attempts`` applies; without, attempts
        are unlimited. Raises TypeError or ValueError naming a bad value.
        """
        return AckOptions.from_keywords("BrokerOptions", {
            "msg_timeout": self.msg_timeout,
            "max_msg_timeout": self.max_msg_timeout,
            "max_delay": self.max_req_timeout,
            "max_in_flight": UNBOUNDED_IN_FLIGHT,
            "max_attempts": self.max_attempts if dead_letters else 0,
            "format": "nsq",
            # A stored message is nsqd's header and the body.
            "max_msg_size": self.max_msg_size + nsq.HEADER_SIZE,
            "max_bytes_per_file": self.max_bytes_per_file,
            "sync_every": self.sync_every,
            "sync_interval": self.sync_interval,
        }).keywords()

    def limits(self) -> Limits:
        """The IDENTIFY negotiation limits, in milliseconds."""
        return Limits(
            msg_timeout_ms=round(self.msg_timeout * 1000),
            max_msg_timeout_ms=round(self.max_msg_timeout * 1000),
            heartbeat_interval_ms=round(self.heartbeat_interval * 1000),
            max_heartbeat_interval_ms=round(self.max_heartbeat_interval * 1000),
            max_rdy_count=self.max_rdy_count,
            max_deflate_level=self.max_deflate_level,
            tls=self.tls_enabled,
            deflate=self.deflate,
            snappy=self.snappy and snappy_available(),
            auth=bool(self.auth_http_addresses),
        )


def split_host_port(addr: object, what: str = "a lookupd", *,
                    listen: bool = False) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port`` too) as ``(host, port)``; port 0 (any free
    one) only for an address to ``listen`` on.

    Raises TypeError or ValueError naming the bad value.
    """
    if not isinstance(addr, str):
        raise TypeError(f"{what} address must be a str, got {type(addr).__name__}")
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not (0 if listen else 1) <= int(port) < 65536:
        raise ValueError(f"{what} address must be host:port, got {addr!r}")
    return host, int(port)


__all__ = ["TLS_REQUIRED_MODES", "TLS_VERSIONS", "UNBOUNDED_IN_FLIGHT", "BrokerOptions",
           "split_host_port"]
