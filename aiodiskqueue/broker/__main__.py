"""``python -m aiodiskqueue.broker --data-dir D --tcp-port P --http-port Q``.

``python -m aiodiskqueue.broker export-for-nsqd D`` hands a stopped broker's
directory back to nsqd (see :mod:`._export`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from ..errors import DiskQueueError
from ._app import BrokerServer
from ._export import export_for_nsqd
from ._options import BrokerOptions, split_host_port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (nsqd's flag names where one exists)."""
    p = argparse.ArgumentParser(
        prog="python -m aiodiskqueue.broker",
        description="An NSQ-protocol broker on aiodiskqueue.",
        epilog="python -m aiodiskqueue.broker export-for-nsqd DIR: move a stopped broker's "
               "in-flight and deferred messages into nsqd's disk queues (--help for more).")
    p.add_argument("--data-dir", required=True, help="directory for queues and metadata")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--tcp-port", type=int, default=4150, help="protocol V2 port (0: any free port)")
    p.add_argument("--http-port", type=int, default=4151, help="HTTP API port (0: any free port)")
    p.add_argument("--msg-timeout", type=float, default=60.0, help="default message timeout, s")
    p.add_argument("--max-attempts", type=int, default=0,
                   help="dead-letter a message after this many deliveries (0: never)")
    p.add_argument("--sync-every", type=int, default=2500, help="fsync every N operations")
    p.add_argument("--sync-interval", type=float, default=2.0, help="fsync at least every T s")
    p.add_argument("--max-msg-size", type=int, default=1 << 20, help="largest message, bytes")
    p.add_argument("--max-body-size", type=int, default=5 << 20, help="largest MPUB body, bytes")
    p.add_argument("--max-rdy-count", type=int, default=2500, help="largest RDY a client may set")
    p.add_argument("--max-req-timeout", type=float, default=3600.0,
                   help="longest REQ/DPUB delay, s")
    p.add_argument("--broadcast-address", default="",
                   help="address registered with lookupd and shown in /info "
                        "(default: the hostname)")
    p.add_argument("--lookupd-tcp-address", action="append", default=[],
                   help="nsqlookupd TCP address host:port to register with (repeatable)")
    p.add_argument("--https-address", default="",
                   help="host:port of an HTTPS listener for the HTTP API (needs --tls-cert)")
    p.add_argument("--tls-cert", default="", help="path to certificate file")
    p.add_argument("--tls-key", default="", help="path to key file")
    p.add_argument("--tls-root-ca-file", default="", help="path to certificate authority file")
    p.add_argument("--tls-client-auth-policy", default="",
                   choices=["", "require", "require-verify"],
                   help="client certificate auth policy ('require' or 'require-verify')")
    p.add_argument("--tls-required", nargs="?", const="true", default="false",
                   type=_tls_required,
                   help="require TLS for client connections (true, false, tcp-https)")
    p.add_argument("--tls-min-version", default="tls1.0",
                   choices=["tls1.0", "tls1.1", "tls1.2", "tls1.3"],
                   help="minimum TLS version (default tls1.0)")
    p.add_argument("--deflate", nargs="?", const="true", default="true", type=_bool,
                   help="enable deflate feature negotiation (default true)")
    p.add_argument("--max-deflate-level", type=int, default=6,
                   help="max deflate compression level a client can negotiate (1-9)")
    p.add_argument("--snappy", nargs="?", const="true", default="true", type=_bool,
                   help="enable snappy feature negotiation (default true; needs cramjam)")
    p.add_argument("--auth-http-address", action="append", default=[],
                   help="<addr>:<port> or a full url to query auth server (repeatable)")
    p.add_argument("--http-client-connect-timeout", type=float, default=2.0,
                   help="timeout for connecting to an auth server, s")
    p.add_argument("--http-client-request-timeout", type=float, default=5.0,
                   help="timeout for an auth server's answer, s")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop (the uvloop extra)")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def options(args: argparse.Namespace) -> BrokerOptions:
    """The broker options from the command line.

    Raises ValueError or TypeError naming a bad value.
    """
    return BrokerOptions(
        msg_timeout=args.msg_timeout,
        max_msg_timeout=max(15 * 60.0, args.msg_timeout),
        max_attempts=args.max_attempts,
        sync_every=args.sync_every,
        sync_interval=args.sync_interval,
        max_msg_size=args.max_msg_size,
        max_body_size=args.max_body_size,
        max_rdy_count=args.max_rdy_count,
        max_req_timeout=args.max_req_timeout,
        broadcast_address=args.broadcast_address,
        lookupd_tcp_addresses=tuple(args.lookupd_tcp_address),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_root_ca_file=args.tls_root_ca_file,
        tls_client_auth_policy=args.tls_client_auth_policy,
        tls_required=args.tls_required,
        tls_min_version=args.tls_min_version,
        deflate=args.deflate,
        max_deflate_level=args.max_deflate_level,
        snappy=args.snappy,
        auth_http_addresses=tuple(args.auth_http_address),
        http_client_connect_timeout=args.http_client_connect_timeout,
        http_client_request_timeout=args.http_client_request_timeout,
    )


_TRUE = ("1", "t", "true", "yes")
_FALSE = ("0", "f", "false", "no")


def _bool(text: str) -> bool:
    """A boolean flag's value, as Go's flag package reads one."""
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _tls_required(text: str) -> str:
    """``--tls-required``'s value as nsqd reads it: a boolean or ``tcp-https``."""
    if text.lower() == "tcp-https":
        return "tcp-https"
    return "true" if _bool(text) else "false"


def https_address(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """The host and port of ``--https-address`` (None, None without it).

    Raises ValueError for an address that is not host:port.
    """
    if not args.https_address:
        return None, None
    return split_host_port(args.https_address, "an HTTPS", listen=True)


async def serve(args: argparse.Namespace, opts: BrokerOptions) -> None:
    """Run the broker until SIGINT or SIGTERM; print the ports once listening."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with BrokerServer(args.data_dir, host=args.host, tcp_port=args.tcp_port,
                            http_port=args.http_port, https_host=https_address(args)[0],
                            https_port=https_address(args)[1],
                            options=opts) as server:
        extra = f" https={server.https_port}" if server.https_port is not None else ""
        print(f"LISTENING tcp={server.tcp_port} http={server.http_port}{extra}", flush=True)
        await stop.wait()


def export_main(argv: list[str]) -> int:
    """``export-for-nsqd DIR``: hand a stopped broker's directory to nsqd; returns the
    exit status."""
    p = argparse.ArgumentParser(
        prog="python -m aiodiskqueue.broker export-for-nsqd",
        description="Move every in-flight, requeued and deferred message of a stopped "
                    "broker's data directory into its nsqd disk queue, attempts kept.")
    p.add_argument("data_dir", help="the broker's --data-dir")
    p.add_argument("--max-msg-size", type=int, default=1 << 20,
                   help="the broker's --max-msg-size, bytes")
    args = p.parse_args(argv)
    try:
        opts = BrokerOptions(max_msg_size=args.max_msg_size)
        moved = asyncio.run(export_for_nsqd(args.data_dir, opts))
    except (DiskQueueError, OSError, ValueError, TypeError) as exc:
        print(f"export-for-nsqd: error: {exc}", file=sys.stderr)
        return 1
    for name, n in moved.items():
        print(f"{name}: {n} message(s) moved to the disk queue")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export-for-nsqd"]:
        return export_main(argv[1:])
    args = parse_args(argv)
    try:
        opts = options(args)
        https_address(args)
    except (ValueError, TypeError) as exc:
        print(f"python -m aiodiskqueue.broker: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.uvloop:
        import uvloop

        uvloop.run(serve(args, opts))
    else:
        asyncio.run(serve(args, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
