"""TLS as nsqd 1.3.0 does it: the upgrade after IDENTIFY, --tls-required, client
certificates, the HTTPS listener; with a PKI made by the openssl command at test time."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_broker_support import (
    TIMEOUT,
    MakeBroker,
    RawClient,
    broker,
    client_tls_context,
    connect,
    make_broker,
    pki,
    raw_clients,
)

from aiodiskqueue.broker import BrokerOptions, BrokerServer
from aiodiskqueue.broker.__main__ import options, parse_args

__all__ = ["broker", "make_broker", "pki", "raw_clients"]  # fixtures used by the tests below

PKI = dict[str, Path]


def tls_options(pki: PKI, **extra: Any) -> dict[str, Any]:
    return {"tls_cert": str(pki["server_cert"]), "tls_key": str(pki["server_key"]),
            "tls_root_ca_file": str(pki["ca"]), **extra}


async def tls_client(server: BrokerServer, clients: list[RawClient], pki: PKI,
                     cert: str | None = None, **identify: Any) -> tuple[RawClient, dict[str, Any]]:
    """A client that asked for tls_v1 and upgraded; with IDENTIFY's answer."""
    c = await connect(server.tcp_port, clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True, **identify)
    assert f.is_response, f
    answer = json.loads(f.data)
    assert answer["tls_v1"] is True
    await c.start_tls(client_tls_context(pki, cert))
    await c.expect_ok()  # nsqd's OK after the handshake, over TLS
    return c, answer


async def test_upgrade_after_identify_then_pub_sub_over_tls(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI
) -> None:
    server = await make_broker(**tls_options(pki))
    consumer, _ = await tls_client(server, raw_clients, pki)
    await consumer.sub("secure", "ch")
    producer, _ = await tls_client(server, raw_clients, pki)
    await producer.pub("secure", b"over tls")
    m = await consumer.read()
    assert m.is_message and m.body == b"over tls"
    assert consumer.writer.get_extra_info("ssl_object") is not None
    clients = server.broker.stats("secure", "ch")["topics"][0]["channels"][0]["clients"]
    (client,) = clients
    assert client["tls"] is True
    assert client["tls_version"] in ("TLS1.2", "TLS1.3")
    assert client["tls_cipher_suite"]


async def test_tls_v1_without_a_certificate_is_refused_and_the_client_stays_plain(
    broker: BrokerServer, raw_clients: list[RawClient]
) -> None:
    c = await connect(broker.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True)
    assert json.loads(f.data)["tls_v1"] is False
    await c.pub("plain", b"still plain")
    (conn,) = broker.tcp.connections.values()
    assert conn.ssl_object is None and conn.stats()["tls"] is False


@pytest.mark.parametrize("mode", ["true", "tcp-https"])
@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"PUB t\n", b"E_INVALID cannot PUB in current state (TLS required)"),
     (b"BOGUS\n", b"E_INVALID cannot BOGUS in current state (TLS required)"),
     (b"FIN 0123456789abcdef\n", b"E_INVALID cannot FIN in current state (TLS required)"),
     (b"IDENTIFY\n\x00\x00\x00\x02{}PUB t\n",
      b"E_INVALID cannot PUB in current state (TLS required)")],
    ids=["pub", "unknown", "fin", "identify-without-tls"],
)
async def test_tls_required_refuses_commands_before_the_upgrade(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI, mode: str,
    data: bytes, expected: bytes
) -> None:
    server = await make_broker(**tls_options(pki, tls_required=mode))
    c = await connect(server.tcp_port, raw_clients)
    c.write(data)
    f = await c.read()
    if data.startswith(b"IDENTIFY"):
        assert f.data == b"OK"
        f = await c.read()
    assert (f.is_error, f.data) == (True, expected)
    assert await c.closed_by_server()


async def test_tls_required_serves_a_client_once_upgraded(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI
) -> None:
    server = await make_broker(**tls_options(pki, tls_required="true"))
    c, _ = await tls_client(server, raw_clients, pki)
    await c.pub("req", b"ok")
    await c.sub("req", "ch")
    m = await c.read()
    c.send(b"FIN " + m.msg_id)
    await c.pub("req", b"after the FIN")


@pytest.mark.parametrize("cert", [None, "rogue"], ids=["no-certificate", "not-signed-by-the-ca"])
async def test_require_verify_refuses_a_client_without_a_good_certificate(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI, cert: str | None,
    caplog: pytest.LogCaptureFixture
) -> None:
    server = await make_broker(**tls_options(pki, tls_client_auth_policy="require-verify"))
    keeper, _ = await tls_client(server, raw_clients, pki, cert="client")
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True)
    assert json.loads(f.data)["tls_v1"] is True

    async def handshake_and_read() -> None:
        # TLS 1.3: the client's handshake completes before the server refuses
        # its certificate; the refusal then ends the stream.
        await c.start_tls(client_tls_context(pki, cert))
        await c.read()

    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await handshake_and_read()
    await keeper.pub("verified", b"the verified client is served")
    assert "unexpected error" not in caplog.text


async def test_a_verified_client_certificate_is_accepted(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI
) -> None:
    server = await make_broker(**tls_options(pki, tls_client_auth_policy="require-verify"))
    c, _ = await tls_client(server, raw_clients, pki, cert="client")
    await c.pub("verified", b"hello")
    conn = next(iter(server.tcp.connections.values()))
    assert conn.ssl_object is not None
    cert = conn.ssl_object.getpeercert()
    assert cert is not None
    assert cert["subject"] == ((("commonName", "client-1"),),)


async def test_a_failed_handshake_closes_only_that_connection(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI,
    caplog: pytest.LogCaptureFixture
) -> None:
    server = await make_broker(**tls_options(pki))
    keeper, _ = await tls_client(server, raw_clients, pki)
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True)
    assert json.loads(f.data)["tls_v1"] is True
    c.writer.write(b"this is not a TLS ClientHello\n" * 10)
    assert await c.closed_by_server()
    await keeper.pub("after", b"served")
    assert "unexpected error" not in caplog.text


async def test_a_client_that_never_handshakes_is_closed(
    make_broker: MakeBroker, raw_clients: list[RawClient], pki: PKI,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiodiskqueue.broker._output.HANDSHAKE_TIMEOUT", 0.3)
    server = await make_broker(**tls_options(pki))
    c = await connect(server.tcp_port, raw_clients)
    f = await c.identify(feature_negotiation=True, tls_v1=True)
    assert json.loads(f.data)["tls_v1"] is True
    assert await c.closed_by_server()  # the handshake deadline passed
    # The connection's handler ends with it: closing the broker does not wait for its
    # 10 s grace (the stream under a failed upgrade never hears that its socket closed).
    async with asyncio.timeout(5):
        await server.aclose()


async def test_https_listener_and_tls_required_for_plain_http(
    make_broker: MakeBroker, pki: PKI
) -> None:
    server = await make_broker(https_port=0, **tls_options(pki, tls_required="true"))
    assert server.https_port
    ctx = client_tls_context(pki)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://localhost:{server.https_port}/ping", ssl=ctx) as r:
            assert (r.status, await r.text()) == (200, "OK")
        async with http.post(f"https://localhost:{server.https_port}/pub?topic=h",
                             data=b"x", ssl=ctx) as r:
            assert r.status == 200
        async with http.get(f"http://127.0.0.1:{server.http_port}/ping") as r:
            assert r.status == 403
            assert await r.text() == (
                f'{{"message": "TLS_REQUIRED", "https_port": {server.https_port}}}')


async def test_tcp_https_leaves_plain_http_open(make_broker: MakeBroker, pki: PKI) -> None:
    server = await make_broker(https_port=0, **tls_options(pki, tls_required="tcp-https"))
    async with (aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{server.http_port}/ping") as r):
        assert (r.status, await r.text()) == (200, "OK")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"tls_cert": "c.pem"}, "tls_cert and tls_key must be given together"),
     ({"tls_required": "true"}, "cannot require TLS client connections without TLS key and cert"),
     ({"tls_client_auth_policy": "require"},
      "cannot require TLS client connections without TLS key and cert"),
     ({"tls_client_auth_policy": "always"}, "tls_client_auth_policy must be"),
     ({"tls_min_version": "ssl3.0"}, "tls_min_version must be one of"),
     ({"tls_required": "maybe"}, "tls_required must be one of"),
     ({"max_deflate_level": 10}, "max_deflate_level"),
     ({"auth_http_addresses": ("nohost",)}, "an auth address must be host:port")],
    ids=["cert-without-key", "required-without-cert", "policy-without-cert", "bad-policy",
         "bad-version", "bad-required", "deflate-level", "bad-auth-address"],
)
def test_bad_security_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerOptions(**kwargs)


def test_a_client_auth_policy_implies_tls_required(pki: PKI) -> None:
    opts = BrokerOptions(**tls_options(pki, tls_client_auth_policy="require"))
    assert opts.tls_required_mode == "true"


def test_https_without_a_certificate_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="HTTPS listener needs tls_cert and tls_key"):
        BrokerServer(tmp_path, https_port=0)


@pytest.mark.parametrize(
    ("argv", "mode"),
    [([], "false"), (["--tls-required"], "true"), (["--tls-required=tcp-https"], "tcp-https"),
     (["--tls-required=false"], "false")],
    ids=["absent", "bare-flag", "tcp-https", "false"],
)
def test_cli_tls_required_as_nsqd_reads_it(argv: list[str], mode: str, pki: PKI) -> None:
    args = parse_args(["--data-dir", "d", "--tls-cert", str(pki["server_cert"]),
                       "--tls-key", str(pki["server_key"]), *argv])
    assert options(args).tls_required == mode


def test_cli_reads_compression_and_auth_flags() -> None:
    args = parse_args(["--data-dir", "d", "--deflate=false", "--max-deflate-level", "9",
                       "--snappy=false", "--auth-http-address", "127.0.0.1:4181",
                       "--auth-http-address", "https://auth.example/auth"])
    opts = options(args)
    assert (opts.deflate, opts.max_deflate_level, opts.snappy) == (False, 9, False)
    assert opts.auth_http_addresses == ("127.0.0.1:4181", "https://auth.example/auth")


logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # handshakes refused on purpose


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_tls_and_compression_under_uvloop(tmp_path: Path, pki: PKI, compression: str) -> None:
    # uvloop's transports are not asyncio's classes: the upgrade must not rely on them.
    import uvloop  # the uvloop extra: `bash dev.sh test` installs it

    async def scenario() -> bytes:
        opts = BrokerOptions(**tls_options(pki))
        async with BrokerServer(tmp_path / "data", tcp_port=0, http_port=0, options=opts) as s:
            c = await RawClient.connect(s.tcp_port)
            try:
                f = await c.identify(feature_negotiation=True, tls_v1=True, **{compression: True})
                assert json.loads(f.data)["tls_v1"] is True
                await c.start_tls(client_tls_context(pki))
                await c.expect_ok()
                c.use_snappy() if compression == "snappy" else c.use_deflate()
                await c.expect_ok()
                await c.sub("uv", "ch")
                await c.pub("uv", b"under uvloop")
                return (await c.read()).body
            finally:
                await c.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == b"under uvloop"


async def test_cli_serves_https_on_its_address(tmp_path: Path, pki: PKI) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiodiskqueue.broker", "--data-dir", str(tmp_path / "d"),
         "--tcp-port", "0", "--http-port", "0", "--https-address", "127.0.0.1:0",
         "--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"]),
         "--tls-required"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), TIMEOUT)
        fields = dict(kv.split("=") for kv in line.split()[1:])
        async with aiohttp.ClientSession() as http:
            url = f"https://localhost:{fields['https']}/ping"
            async with http.get(url, ssl=client_tls_context(pki)) as r:
                assert (r.status, await r.text()) == (200, "OK")
            async with http.get(f"http://127.0.0.1:{fields['http']}/ping") as r:
                assert r.status == 403  # --tls-required: plain HTTP is refused
    finally:
        proc.terminate()
        proc.wait(timeout=TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


def test_cli_refuses_a_bad_https_address(capsys: pytest.CaptureFixture[str]) -> None:
    from aiodiskqueue.broker.__main__ import main

    assert main(["--data-dir", "d", "--https-address", "nohost"]) == 2
    assert "an HTTPS address must be host:port" in capsys.readouterr().err
