"""AUTH as nsqd 1.3.0 does it, against an auth server the tests run on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_broker_support import (
    MakeBroker,
    RawClient,
    broker,
    client_tls_context,
    connect,
    make_broker,
    pki,
    raw_clients,
)

from aiodiskqueue.broker import BrokerServer
from aiodiskqueue.broker._auth import AuthError, parse_answer

__all__ = ["broker", "make_broker", "pki", "raw_clients"]  # fixtures used by the tests below

GRANTS: dict[str, dict[str, Any]] = {
    "pub-orders": {"identity": "alice", "identity_url": "https://id.example/alice", "ttl": 3600,
                   "authorizations": [{"topic": "^orders$", "channels": [".*"],
                                       "permissions": ["publish"]}]},
    "sub-orders": {"identity": "bob", "ttl": 3600,
                   "authorizations": [{"topic": "orders", "channels": ["^billing$"],
                                       "permissions": ["subscribe"]}]},
    "nothing": {"identity": "eve", "ttl": 3600, "authorizations": []},
    "short": {"identity": "tmp", "ttl": 1,
              "authorizations": [{"topic": ".*", "channels": [".*"],
                                  "permissions": ["publish", "subscribe"]}]},
}


class AuthServer:
    """An nsq auth server: answers ``GET /auth`` from :data:`GRANTS` by secret.

    ``mode`` makes it misbehave: ``slow`` (answers after 10 s), ``garbage`` (not
    JSON), ``error`` (HTTP 500), ``bad-permission``, ``bad-regex``, ``bad-ttl``.
    """

    def __init__(self) -> None:
        self.queries: list[dict[str, str]] = []
        self.mode = ""
        self.grants = dict(GRANTS)
        self.port = 0
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        if self.mode == "slow":
            # 10 s, or until the server closes (its clean-up waits for this handler).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), 10)
        if self.mode == "garbage":
            return web.Response(body=b"<html>not json</html>")
        if self.mode == "error":
            return web.Response(status=500, text="boom")
        answer = self.grants.get(request.query.get("secret", ""))
        if answer is None:
            return web.Response(status=403, text="NOT_AUTHORIZED")
        answer = json.loads(json.dumps(answer))
        if self.mode == "bad-permission":
            answer["authorizations"][0]["permissions"] = ["admin"]
        elif self.mode == "bad-regex":
            answer["authorizations"][0]["topic"] = "(["
        elif self.mode == "bad-ttl":
            answer["ttl"] = 0
        return web.json_response(answer)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/auth", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def authd() -> AsyncIterator[AuthServer]:
    server = AuthServer()
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


async def authed_broker(make_broker: MakeBroker, authd: AuthServer, **extra: Any) -> BrokerServer:
    return await make_broker(auth_http_addresses=(f"127.0.0.1:{authd.port}",),
                             http_client_request_timeout=0.5, **extra)


async def auth(c: RawClient, secret: bytes) -> tuple[bool, bytes]:
    c.send(b"AUTH", secret)
    f = await c.read()
    return f.is_response, f.data


async def test_identify_says_auth_required_and_auth_answers_identity(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True)
    assert json.loads(f.data)["auth_required"] is True
    assert await auth(c, b"pub-orders") == (
        True, b'{"identity":"alice","identity_url":"https://id.example/alice",'
              b'"permission_count":1}')
    (query,) = authd.queries
    assert query == {"remote_ip": "127.0.0.1", "tls": "false", "secret": "pub-orders",
                     "common_name": ""}
    await c.pub("orders", b"allowed")
    (conn,) = server.tcp.connections.values()
    stats = conn.stats()
    assert (stats["authed"], stats["auth_identity"], stats["auth_identity_url"]) == (
        True, "alice", "https://id.example/alice")


@pytest.mark.parametrize(
    ("secret", "command", "expected"),
    [(b"pub-orders", b"PUB other\n\x00\x00\x00\x01x",
      b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'),
     (b"pub-orders", b"MPUB other\n", b'E_UNAUTHORIZED AUTH failed for MPUB on "other" ""'),
     (b"pub-orders", b"DPUB other 10\n\x00\x00\x00\x01x",
      b'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'),
     (b"pub-orders", b"SUB orders billing\n",
      b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "billing"'),
     (b"sub-orders", b"SUB orders shipping\n",
      b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "shipping"'),
     (b"sub-orders", b"PUB orders\n\x00\x00\x00\x01x",
      b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'),
     (None, b"PUB orders\n\x00\x00\x00\x01x", b"E_AUTH_FIRST AUTH required before PUB"),
     (None, b"SUB orders billing\n", b"E_AUTH_FIRST AUTH required before SUB"),
     (None, b"MPUB orders\n", b"E_AUTH_FIRST AUTH required before MPUB")],
    ids=["pub-other-topic", "mpub-other-topic", "dpub-other-topic", "sub-without-subscribe",
         "sub-other-channel", "pub-without-publish", "pub-before-auth", "sub-before-auth",
         "mpub-before-auth"],
)
async def test_commands_without_permission_are_refused(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer,
    secret: bytes | None, command: bytes, expected: bytes
) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    if secret is not None:
        assert (await auth(c, secret))[0]
    c.write(command)
    f = await c.read()
    assert (f.is_error, f.data) == (True, expected)
    assert await c.closed_by_server()
    assert "orders" not in server.broker.topics or command.startswith(b"SUB")


async def test_a_subscriber_with_permission_gets_messages(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    consumer = await connect(server.tcp_port, raw_clients)
    assert (await auth(consumer, b"sub-orders"))[0]
    await consumer.sub("orders", "billing")
    producer = await connect(server.tcp_port, raw_clients)
    assert (await auth(producer, b"pub-orders"))[0]
    await producer.pub("orders", b"invoice")
    assert (await consumer.read()).body == b"invoice"


@pytest.mark.parametrize(
    ("secret", "expected"),
    [(b"nothing", b"E_UNAUTHORIZED AUTH no authorizations found"),
     (b"unknown-secret", b"E_AUTH_FAILED AUTH failed")],
    ids=["no-authorizations", "refused-by-the-server"],
)
async def test_auth_refused(make_broker: MakeBroker, raw_clients: list[RawClient],
                            authd: AuthServer, secret: bytes, expected: bytes) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    assert await auth(c, secret) == (False, expected)
    assert await c.closed_by_server()


@pytest.mark.parametrize("mode", ["slow", "garbage", "error", "bad-permission", "bad-regex",
                                  "bad-ttl", "down"])
async def test_an_auth_server_that_fails_is_e_auth_failed_and_disturbs_nothing_else(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer, mode: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    server = await authed_broker(make_broker, authd)
    keeper = await connect(server.tcp_port, raw_clients)
    assert (await auth(keeper, b"pub-orders"))[0]
    authd.mode = mode
    if mode == "down":
        await authd.aclose()
    c = await connect(server.tcp_port, raw_clients)
    start = time.monotonic()
    assert await auth(c, b"pub-orders") == (False, b"E_AUTH_FAILED AUTH failed")
    assert time.monotonic() - start < 5  # bounded by the request timeout (0.5 s here)
    assert await c.closed_by_server()
    assert "AUTH failed failed to auth against 127.0.0.1:" in caplog.text
    assert "unexpected error" not in caplog.text
    await keeper.pub("orders", b"the other client is served")


async def test_the_next_server_is_asked_when_one_fails(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    down = AuthServer()
    await down.start()
    await down.aclose()  # a port nothing listens on any more
    server = await make_broker(auth_http_addresses=(f"127.0.0.1:{down.port}",
                                                    f"http://127.0.0.1:{authd.port}/auth"))
    for _ in range(4):  # the first one asked is random: both orders are met
        c = await connect(server.tcp_port, raw_clients)
        assert (await auth(c, b"pub-orders"))[0]


async def test_auth_is_asked_again_after_its_ttl(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    assert (await auth(c, b"short"))[0]
    await c.pub("anything", b"within the ttl")
    assert len(authd.queries) == 1
    await asyncio.sleep(1.1)  # the answer's ttl is 1 s: the next check asks again
    authd.grants["short"] = GRANTS["pub-orders"]  # now only publish to orders
    await c.pub("orders", b"asked again")
    assert len(authd.queries) == 2
    c.send(b"PUB anything", b"x")
    f = await c.read()
    assert f.data == b'E_UNAUTHORIZED AUTH failed for PUB on "anything" ""'


async def test_a_failed_refresh_is_e_auth_failed(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    assert (await auth(c, b"short"))[0]
    await asyncio.sleep(1.1)
    authd.mode = "garbage"
    c.send(b"PUB t", b"x")
    f = await c.read()
    assert f.data == b"E_AUTH_FAILED AUTH failed"


async def test_auth_twice_is_e_invalid(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    c = await connect(server.tcp_port, raw_clients)
    assert (await auth(c, b"pub-orders"))[0]
    assert await auth(c, b"pub-orders") == (False, b"E_INVALID AUTH already set")


async def test_auth_over_tls_tells_the_server_the_certificate_name(
    make_broker: MakeBroker, raw_clients: list[RawClient], authd: AuthServer,
    pki: dict[str, Path]
) -> None:
    server = await authed_broker(
        make_broker, authd, tls_cert=str(pki["server_cert"]), tls_key=str(pki["server_key"]),
        tls_root_ca_file=str(pki["ca"]))
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True)
    assert json.loads(f.data)["tls_v1"] is True
    await c.start_tls(client_tls_context(pki, "client"))
    await c.expect_ok()
    assert (await auth(c, b"pub-orders"))[0]
    assert (authd.queries[0]["tls"], authd.queries[0]["common_name"]) == ("true", "client-1")


async def test_without_auth_servers_auth_is_disabled(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients, feature_negotiation=True)
    assert await auth(c, b"secret") == (False, b"E_AUTH_DISABLED AUTH disabled")


async def test_the_http_api_is_not_subject_to_auth_as_in_nsqd(
    make_broker: MakeBroker, authd: AuthServer
) -> None:
    server = await authed_broker(make_broker, authd)
    async with (aiohttp.ClientSession() as http,
                http.post(f"http://127.0.0.1:{server.http_port}/pub?topic=open",
                          data=b"x") as r):
        assert (r.status, await r.text()) == (200, "OK")
    assert authd.queries == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [(b"[]", "not a JSON object"), (b'{"ttl": "60"}', "field ttl has the wrong JSON type (str)"),
     (b'{"ttl": 60, "authorizations": [{"permissions": ["read"]}]}', "unknown permission read"),
     (b'{"ttl": 60, "authorizations": [{"topic": "(", "permissions": []}]}',
      'unable to compile topic "("'),
     (b'{"ttl": -1}', "invalid TTL -1 (must be >0)")],
    ids=["array", "ttl-string", "permission", "regex", "ttl"],
)
def test_bad_answers_are_refused_with_nsqds_reason(answer: bytes, message: str) -> None:
    with pytest.raises(AuthError, match=re.escape(message)):
        parse_answer(answer)


def test_authorization_matches_as_nsqds_regexps() -> None:
    state = parse_answer(json.dumps(GRANTS["sub-orders"]).encode())
    assert state.allows("orders", "billing")
    assert state.allows("old-orders-2", "billing")  # unanchored, as Go's MatchString
    assert not state.allows("orders", "billing-eu")
    assert not state.allows("orders", "")  # no publish permission
