"""TLS for the broker: the server context built from nsqd's flags, and what a
connection negotiated (for ``/stats`` and the auth server)."""

from __future__ import annotations

import ssl
import warnings
from typing import Any

from ._options import TLS_VERSIONS, BrokerOptions

HANDSHAKE_TIMEOUT = 5.0
"""Seconds a client has to finish its TLS handshake (nsqd's deadline)."""


def server_context(opts: BrokerOptions) -> ssl.SSLContext | None:
    """The server-side TLS context of ``opts``; None without a certificate.

    As nsqd: with no client auth policy a client certificate is asked for and
    verified if given; ``require`` and ``require-verify`` refuse a client
    without one. Python's ssl module verifies every certificate it accepts, so
    ``require`` verifies too (nsqd's accepts any certificate). Certificates are
    checked against ``tls_root_ca_file``, or the system's CAs without it.

    Raises OSError or ssl.SSLError if a file cannot be read or does not fit.
    """
    if not opts.tls_enabled:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _set_minimum(ctx, opts)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    if opts.tls_root_ca_file:
        ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
    else:
        ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    ctx.verify_mode = ssl.CERT_REQUIRED if opts.tls_client_auth_policy else ssl.CERT_OPTIONAL
    return ctx


def client_context(opts: BrokerOptions) -> ssl.SSLContext:
    """The context for the broker's own HTTPS requests (to auth servers): the
    root CA file if given, else the system's CAs."""
    ctx = ssl.create_default_context(cafile=opts.tls_root_ca_file or None)
    _set_minimum(ctx, opts)
    return ctx


def _set_minimum(ctx: ssl.SSLContext, opts: BrokerOptions) -> None:
    """``tls_min_version`` (nsqd's default, TLS 1.0, is deprecated in Python: set without
    the warning; OpenSSL's security level may still refuse versions below 1.2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion[TLS_VERSIONS[opts.tls_min_version]]


_VERSION_NAMES = {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2",
                  "TLSv1.3": "TLS1.3"}
"""OpenSSL's version names as nsqd writes them."""


def connection_info(ssl_object: ssl.SSLObject | None) -> dict[str, Any]:
    """nsqd's ``tls_*`` client stats fields for a connection (empty values without TLS)."""
    if ssl_object is None:
        return {"tls": False, "tls_cipher_suite": "", "tls_version": "",
                "tls_negotiated_protocol": "", "tls_negotiated_protocol_is_mutual": False}
    cipher = ssl_object.cipher()
    version = ssl_object.version() or ""
    alpn = ssl_object.selected_alpn_protocol() or ""
    return {
        "tls": True,
        "tls_cipher_suite": cipher[0] if cipher else "",  # OpenSSL's name of the suite
        "tls_version": _VERSION_NAMES.get(version, version),
        "tls_negotiated_protocol": alpn,
        "tls_negotiated_protocol_is_mutual": True,  # Go's field is always true
    }


def peer_common_name(ssl_object: ssl.SSLObject | None) -> str:
    """The common name of the client certificate's subject, or ``""``."""
    if ssl_object is None:
        return ""
    cert: dict[str, Any] = dict(ssl_object.getpeercert() or {})
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


__all__ = ["HANDSHAKE_TIMEOUT", "client_context", "connection_info", "peer_common_name",
           "server_context"]
