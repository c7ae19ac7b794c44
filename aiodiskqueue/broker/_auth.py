"""AUTH as nsqd 1.3.0 does it: an auth server says what a client's secret allows.

The broker asks ``GET http://<address>/auth?common_name=&remote_ip=&secret=&tls=``
(or the address itself when it is a URL) of each ``auth_http_addresses``
entry in turn, starting at a random one, until one answers. The answer is
JSON: ``identity``, ``identity_url``, ``ttl`` (seconds, > 0) and
``authorizations``, each a ``topic`` regular expression, ``channels``
regular expressions and ``permissions`` (``subscribe``, ``publish``). As in
nsqd the expressions match anywhere in a name unless anchored (Go's regexp
syntax mostly agrees with Python's ``re``); publishing needs a channel
expression that matches the empty name. The answer holds for ``ttl`` seconds,
then the next check asks again.
"""

from __future__ import annotations

import json
import logging
import random
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, final
from urllib.parse import urlencode

import aiohttp

from ._options import BrokerOptions
from ._protocol import ClientError, go_quote
from ._tls import client_context

log = logging.getLogger(__name__)

_PERMISSIONS = frozenset({"subscribe", "publish"})


class AuthError(Exception):
    """No auth server gave a usable answer (the message says why, for the log)."""


@dataclass(frozen=True, slots=True)
class Authorization:
    """One entry of an auth server's ``authorizations``."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        """nsqd's check: subscribe for a channel, publish without one; both names match."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self.channels)


@dataclass(frozen=True, slots=True)
class AuthState:
    """What an auth server answered for a client's secret."""

    identity: str
    identity_url: str
    authorizations: tuple[Authorization, ...]
    expires: float
    """``time.monotonic()`` after which the server is asked again."""

    def allows(self, topic: str, channel: str) -> bool:
        """True if any authorization allows ``topic`` (and ``channel``; "" to publish)."""
        return any(a.allows(topic, channel) for a in self.authorizations)

    @property
    def expired(self) -> bool:
        """The answer's TTL has passed."""
        return time.monotonic() > self.expires


def _field(data: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """A field of the answer with Go's decoding rules: absent or null is the zero value,
    another JSON type fails the whole answer."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AuthError(f"field {name} has the wrong JSON type ({type(value).__name__})")
    return value


def _compile(what: str, pattern: object) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise AuthError(f"{what} is not a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AuthError(f"unable to compile {what} {go_quote(pattern)} {exc}") from None


def parse_answer(body: bytes) -> AuthState:
    """An auth server's answer, checked as nsqd checks it.

    Raises AuthError for JSON that is not an answer, an unknown permission, a
    regular expression that does not compile, a TTL that is not > 0.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise AuthError(f"the answer is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AuthError("the answer is not a JSON object")
    auths: list[Authorization] = []
    for entry in _field(data, "authorizations", list, []):
        if not isinstance(entry, dict):
            raise AuthError("an authorization is not a JSON object")
        perms = _field(entry, "permissions", list, [])
        for p in perms:
            if p not in _PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        topic = _compile("topic", _field(entry, "topic", str, ""))
        channels = tuple(_compile("channel", c) for c in _field(entry, "channels", list, []))
        auths.append(Authorization(topic, channels, frozenset(perms)))
    ttl = _field(data, "ttl", int, 0)
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(
        identity=_field(data, "identity", str, ""),
        identity_url=_field(data, "identity_url", str, ""),
        authorizations=tuple(auths),
        expires=time.monotonic() + ttl,
    )


@final
class AuthClient:
    """Asks the configured auth servers; one HTTP session for the whole broker."""

    def __init__(self, options: BrokerOptions) -> None:
        self.addresses = options.auth_http_addresses
        self._timeout = aiohttp.ClientTimeout(
            total=options.http_client_connect_timeout + options.http_client_request_timeout,
            sock_connect=options.http_client_connect_timeout,
            sock_read=options.http_client_request_timeout)
        self._ssl: ssl.SSLContext = client_context(options)
        self._session: aiohttp.ClientSession | None = None

    @property
    def enabled(self) -> bool:
        """Auth servers are configured: clients must AUTH before SUB and publishing."""
        return bool(self.addresses)

    async def query(self, *, remote_ip: str, tls: bool, common_name: str,
                    secret: str) -> AuthState:
        """Ask each auth server in turn, from a random one, until one answers.

        Raises AuthError naming every server's failure.
        """
        params = urlencode(sorted({"remote_ip": remote_ip, "tls": "true" if tls else "false",
                                   "secret": secret, "common_name": common_name}.items()))
        n = len(self.addresses)
        start = random.randrange(n)
        failures: list[str] = []
        for i in range(n):
            addr = self.addresses[(start + i) % n]
            url = f"{addr}?{params}" if "://" in addr else f"http://{addr}/auth?{params}"
            try:
                return await self._get(url)
            except AuthError as exc:
                failures.append(f"failed to auth against {addr} - {exc}")
        raise AuthError("; ".join(failures))

    async def _get(self, url: str) -> AuthState:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(url, ssl=self._ssl) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise AuthError(f"got response {resp.status} {go_quote(body[:200])}")
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise AuthError(f"{type(exc).__name__}: {exc}") from None
        return parse_answer(body)

    async def aclose(self) -> None:
        """Close the HTTP session; idempotent."""
        if self._session is not None:
            await self._session.close()
            self._session = None


Peer = Callable[[], tuple[str, bool, str]]
"""A connection's remote IP, whether it is on TLS, its certificate's common name."""


@final
class ClientAuth:
    """One connection's AUTH: its secret and what the auth server answered (nsqd's
    ``AUTH`` command and ``CheckAuth``, with nsqd's error frames)."""

    def __init__(self, client: AuthClient, peer: Peer) -> None:
        self._client = client
        self._peer = peer
        self._secret = ""
        self.state: AuthState | None = None

    @property
    def authorized(self) -> bool:
        """The auth server granted at least one authorization."""
        return self.state is not None and bool(self.state.authorizations)

    async def auth(self, secret: bytes) -> bytes:
        """``AUTH``: ask the auth servers about ``secret``; return the answer's payload.

        Raises ClientError: E_INVALID if already authorized, E_AUTH_FAILED if no
        server answered, E_UNAUTHORIZED if it granted nothing.
        """
        if self.authorized:
            raise ClientError("E_INVALID", "AUTH already set")
        # Go keeps the secret's bytes as they are; the query carries them as UTF-8.
        self._secret = secret.decode("utf-8", "replace")
        state = await self._query()
        if not state.authorizations:
            raise ClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        return json.dumps({"identity": state.identity, "identity_url": state.identity_url,
                           "permission_count": len(state.authorizations)},
                          separators=(",", ":"), ensure_ascii=False).encode()

    async def check(self, cmd: str, topic: str, channel: str = "") -> None:
        """nsqd's CheckAuth: AUTH first, asked again once its TTL passed, then allowed.

        Raises ClientError (E_AUTH_FIRST, E_AUTH_FAILED, E_UNAUTHORIZED), all fatal.
        """
        state = self.state
        if state is None or not state.authorizations:
            raise ClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expired:
            state = await self._query()
        if not state.allows(topic, channel):
            raise ClientError("E_UNAUTHORIZED",
                              f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}")

    async def _query(self) -> AuthState:
        remote_ip, tls, common_name = self._peer()
        try:
            self.state = await self._client.query(remote_ip=remote_ip, tls=tls,
                                                  common_name=common_name, secret=self._secret)
        except AuthError as exc:
            log.warning("AUTH failed %s", exc)
            raise ClientError("E_AUTH_FAILED", "AUTH failed") from None
        return self.state

    def stats(self) -> dict[str, Any]:
        """nsqd's ``authed``, ``auth_identity``, ``auth_identity_url`` (left out when empty,
        as nsqd's ``omitempty``)."""
        state = self.state
        if state is None or not state.authorizations:
            return {}
        out: dict[str, Any] = {"authed": True}
        if state.identity:
            out["auth_identity"] = state.identity
        if state.identity_url:
            out["auth_identity_url"] = state.identity_url
        return out


__all__ = ["AuthClient", "AuthError", "AuthState", "Authorization", "ClientAuth", "Peer",
           "parse_answer"]
