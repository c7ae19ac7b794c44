"""Registration with nsqlookupd (--lookupd-tcp-address), against an in-process lookupd.

FakeLookupd speaks nsqlookupd's TCP protocol V1 and checks every frame the
broker sends against it (magic, IDENTIFY first with its required fields,
REGISTER/UNREGISTER with valid names, PING without parameters), answering
as nsqlookupd does. Its HTTP side serves ``/lookup?topic=`` from what was
registered, so that a pynsq Reader configured with lookupd_http_addresses
finds the broker and consumes from it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, web
from test_broker_support import TIMEOUT, MakeBroker, eventually, make_broker

from aiodiskqueue.broker._lookupd import LookupdPeer, command

__all__ = ["make_broker"]

_NAME = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")
_ids = itertools.count(1)


def _valid(name: bytes) -> bool:
    try:
        text = name.decode("ascii")
    except UnicodeDecodeError:
        return False
    return 1 <= len(text) <= 64 and _NAME.match(text) is not None


class FakeLookupd:
    """A strict nsqlookupd: records commands and registrations, lists protocol violations."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, tuple[str, ...]]] = []
        self.violations: list[str] = []
        self.peers: dict[int, dict[str, Any]] = {}
        self.registrations: dict[int, set[tuple[str, str]]] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.tcp_port = self.http_port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.tcp_port = self._server.sockets[0].getsockname()[1]
        app = web.Application()
        app.router.add_get("/lookup", self._lookup)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._runner is not None:
            await self._runner.cleanup()

    def drop_all(self) -> None:
        """Close every connection (the lookupd restarted)."""
        for w in list(self._writers.values()):
            w.close()

    def commands(self, name: str) -> list[tuple[int, tuple[str, ...]]]:
        return [(cid, params) for cid, cmd, params in self.events if cmd == name]

    def _violation(self, cid: int, text: str) -> None:
        self.violations.append(f"connection {cid}: {text}")

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(struct.pack(">i", len(data)) + data)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cid = next(_ids)
        self._writers[cid] = writer
        self.registrations[cid] = set()
        try:
            magic = await reader.readexactly(4)
            if magic != b"  V1":
                self._violation(cid, f"bad magic {magic!r}")
                return
            while True:
                line = await reader.readuntil(b"\n")
                parts = line[:-1].split(b" ")
                cmd, params = parts[0].decode(errors="replace"), parts[1:]
                self.events.append((cid, cmd, tuple(p.decode(errors="replace") for p in params)))
                if cmd == "IDENTIFY":
                    await self._identify(cid, reader, writer, params)
                elif cmd in ("REGISTER", "UNREGISTER"):
                    self._register(cid, writer, cmd, params)
                elif cmd == "PING":
                    if params:
                        self._violation(cid, f"PING with parameters {params!r}")
                    self._respond(writer, b"OK")
                else:
                    self._violation(cid, f"unknown command {cmd!r}")
                    self._respond(writer, b"E_INVALID invalid command")
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            # nsqlookupd forgets a producer's registrations with its connection.
            self.registrations.pop(cid, None)
            self.peers.pop(cid, None)
            self._writers.pop(cid, None)
            writer.close()

    async def _identify(self, cid: int, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, params: list[bytes]) -> None:
        if params:
            self._violation(cid, "IDENTIFY with parameters")
        if cid in self.peers:
            self._violation(cid, "IDENTIFY twice")
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        body = await reader.readexactly(size)
        try:
            info = json.loads(body)
        except ValueError:
            self._violation(cid, f"IDENTIFY body is not JSON: {body!r}")
            self._respond(writer, b"E_BAD_BODY IDENTIFY failed to decode JSON body")
            return
        for key, typ in (("broadcast_address", str), ("hostname", str), ("version", str),
                         ("tcp_port", int), ("http_port", int)):
            if not isinstance(info.get(key), typ) or not info[key]:
                self._violation(cid, f"IDENTIFY {key} missing or wrong: {info.get(key)!r}")
        self.peers[cid] = info
        self._respond(writer, json.dumps({"tcp_port": self.tcp_port, "http_port": self.http_port,
                                          "version": "1.3.0", "broadcast_address": "fake",
                                          "hostname": "fake"}).encode())

    def _register(self, cid: int, writer: asyncio.StreamWriter, cmd: str,
                  params: list[bytes]) -> None:
        if cid not in self.peers:
            self._violation(cid, f"{cmd} before IDENTIFY")
        if not 1 <= len(params) <= 2 or not all(_valid(p) for p in params):
            self._violation(cid, f"{cmd} with bad parameters {params!r}")
            self._respond(writer, b"E_INVALID bad parameters")
            return
        topic = params[0].decode()
        channel = params[1].decode() if len(params) == 2 else ""
        regs = self.registrations[cid]
        if cmd == "REGISTER":
            regs.add((topic, ""))
            if channel:
                regs.add((topic, channel))
        elif channel:
            regs.discard((topic, channel))
        else:
            regs -= {r for r in regs if r[0] == topic}
        self._respond(writer, b"OK")

    async def _lookup(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        producers, channels = [], set()
        for cid, regs in self.registrations.items():
            if (topic, "") in regs and cid in self.peers:
                producers.append(self.peers[cid])
                channels |= {c for t, c in regs if t == topic and c}
        if not producers:
            return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
        return web.json_response({"channels": sorted(channels), "producers": producers})


@pytest.fixture
async def lookupd() -> AsyncIterator[FakeLookupd]:
    fake = FakeLookupd()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.aclose()


async def _post(port: int, path: str, body: bytes = b"") -> int:
    async with ClientSession() as s, s.post(f"http://127.0.0.1:{port}{path}", data=body) as r:
        return r.status


async def test_identify_register_unregister_as_nsqd(make_broker: MakeBroker,
                                                    lookupd: FakeLookupd) -> None:
    server = await make_broker(lookupd_tcp_addresses=(f"127.0.0.1:{lookupd.tcp_port}",),
                               broadcast_address="node1.example")
    await eventually(lambda: bool(lookupd.peers))
    [info] = lookupd.peers.values()
    assert (info["broadcast_address"], info["tcp_port"], info["http_port"]) == (
        "node1.example", server.tcp_port, server.http_port)
    assert await _post(server.http_port, "/topic/create?topic=t") == 200
    assert await _post(server.http_port, "/channel/create?topic=t&channel=c") == 200
    await eventually(lambda: len(lookupd.commands("REGISTER")) == 2)
    assert await _post(server.http_port, "/channel/delete?topic=t&channel=c") == 200
    assert await _post(server.http_port, "/topic/delete?topic=t") == 200
    await eventually(lambda: len(lookupd.commands("UNREGISTER")) == 2)
    assert [(cmd, p) for _, cmd, p in lookupd.events] == [
        ("IDENTIFY", ()), ("REGISTER", ("t",)), ("REGISTER", ("t", "c")),
        ("UNREGISTER", ("t", "c")), ("UNREGISTER", ("t",))]
    assert lookupd.violations == []


async def test_sync_on_connect_ping_and_reconnect(make_broker: MakeBroker, lookupd: FakeLookupd,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aiodiskqueue.broker._lookupd.PING_INTERVAL", 0.2)
    first = await make_broker()
    await _post(first.http_port, "/topic/create?topic=lonely")
    await _post(first.http_port, "/topic/create?topic=busy")
    for ch in ("x", "y"):
        await _post(first.http_port, f"/channel/create?topic=busy&channel={ch}")
    await first.aclose()
    await make_broker(lookupd_tcp_addresses=(f"127.0.0.1:{lookupd.tcp_port}",))
    synced = {("busy", "x"), ("busy", "y"), ("lonely",)}
    await eventually(lambda: {p for _, p in lookupd.commands("REGISTER")} == synced)
    await eventually(lambda: len(lookupd.commands("PING")) >= 1)
    [cid1] = lookupd.peers
    lookupd.drop_all()  # the lookupd restarts: the broker connects again and registers all
    await eventually(lambda: any(cid != cid1 for cid in lookupd.peers))
    [cid2] = lookupd.peers
    await eventually(lambda: {p for c, p in lookupd.commands("REGISTER") if c == cid2} == synced)
    assert lookupd.registrations[cid2] == {("busy", ""), ("busy", "x"), ("busy", "y"),
                                           ("lonely", "")}
    assert lookupd.violations == []


READER = r'''
import json, sys
import nsq
import tornado.ioloop

lookupd_http, topic, channel, expect, limit = sys.argv[1:6]
loop = tornado.ioloop.IOLoop.current()
got = []

def stop():
    print(json.dumps(got), flush=True)
    loop.stop()

loop.call_later(float(limit), stop)

def handler(msg):
    got.append(msg.body.decode())
    if len(got) >= int(expect):
        loop.add_callback(stop)
    return True

nsq.Reader(topic=topic, channel=channel, message_handler=handler,
           lookupd_http_addresses=[lookupd_http], lookupd_poll_interval=1,
           lookupd_poll_jitter=0.0, max_in_flight=10)
loop.start()
'''


async def test_pynsq_reader_finds_the_broker_through_lookupd(make_broker: MakeBroker,
                                                             lookupd: FakeLookupd) -> None:
    server = await make_broker(lookupd_tcp_addresses=(f"127.0.0.1:{lookupd.tcp_port}",),
                               broadcast_address="127.0.0.1")
    assert await _post(server.http_port, "/topic/create?topic=found") == 200
    assert await _post(server.http_port, "/channel/create?topic=found&channel=c") == 200
    assert await _post(server.http_port, "/mpub?topic=found", b"one\ntwo\nthree") == 200
    await eventually(lambda: ("found", "") in set().union(*lookupd.registrations.values()))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER, f"http://127.0.0.1:{lookupd.http_port}", "found", "c",
        "3", str(TIMEOUT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    assert sorted(json.loads(out.decode().strip().splitlines()[-1])) == ["one", "three", "two"]
    assert lookupd.violations == []


async def test_a_close_is_not_lost_when_a_response_lands_with_it() -> None:
    """Closing cancels the registration task. A response landing in the same loop
    iteration must not swallow that cancellation: on Python 3.11 ``asyncio.wait_for``
    did (its inner read was done, so it returned the read instead), and ``aclose()``
    then waited for ever on a task that went on pinging."""
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[bytes] = loop.create_future()

    class Reader:
        async def readexactly(self, n: int) -> bytes:
            return await gate if n else b""

    class Writer:
        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            pass

    peer = LookupdPeer(None, "127.0.0.1:4160")  # type: ignore[arg-type]  # no broker needed
    peer._reader, peer._writer = Reader(), Writer()  # type: ignore[assignment]
    task = loop.create_task(peer._command(command("PING")))
    await asyncio.sleep(0)  # the task now waits for the response's first bytes
    gate.set_result(b"\0\0\0\0")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
