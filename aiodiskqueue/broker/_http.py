"""nsqd's HTTP API (the part clients and tools use), on aiohttp.

Responses follow nsqd's v1 conventions: success is ``200`` with a plain
``OK`` (publish), an empty body (create/empty/pause), or a JSON document
(``/stats?format=json``, ``/info``); errors are JSON ``{"message": "CODE"}``
with nsqd's status codes and codes (``MISSING_ARG_TOPIC``, ``INVALID_TOPIC``,
``MSG_TOO_BIG``, ``TOPIC_NOT_FOUND``, ...).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiodiskqueue.broker needs aiohttp for its HTTP API: "
        "pip install 'asyncio-diskqueue[broker]' (or pip install aiohttp)"
    ) from exc

from ..errors import DiskQueueError
from ._broker import Broker
from ._protocol import ClientError, is_valid_name, parse_int, parse_mpub
from ._topic import Channel, Topic

log = logging.getLogger(__name__)

_NSQ_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HTTPError(Exception):
    """An nsqd API error: status code and message code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status,
        content_type="application/json", charset="utf-8", headers=_NSQ_HEADERS,
    )


def _text(text: str) -> web.Response:
    return web.Response(text=text, headers=_NSQ_HEADERS)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPError as err:
        return _json({"message": err.message}, err.status)
    except web.HTTPNotFound:
        return _json({"message": "NOT_FOUND"}, 404)
    except web.HTTPMethodNotAllowed:
        return _json({"message": "METHOD_NOT_ALLOWED"}, 405)


class HTTPApi:
    """The HTTP routes of a :class:`Broker`."""

    def __init__(self, broker: Broker,
                 producers: Callable[[str], list[dict[str, Any]]] | None = None) -> None:
        self.broker = broker
        self._producers = producers
        """The stats of the TCP clients that published (nsqd's ``producers``)."""
        self.https_port = 0
        """The HTTPS listener's port, told to plain HTTP clients when TLS is required."""
        app = web.Application(middlewares=[self._tls_policy, _errors],
                              client_max_size=broker.options.max_body_size + 1)
        r = app.router
        r.add_get("/ping", self.ping)
        r.add_get("/info", self.info)
        r.add_get("/stats", self.stats)
        r.add_post("/pub", self.pub)
        r.add_post("/mpub", self.mpub)
        r.add_post("/topic/create", self.topic_create)
        r.add_post("/topic/delete", self.topic_delete)
        r.add_post("/topic/empty", self.topic_empty)
        r.add_post("/topic/pause", self.topic_pause)
        r.add_post("/topic/unpause", self.topic_pause)
        r.add_post("/channel/create", self.channel_create)
        r.add_post("/channel/delete", self.channel_delete)
        r.add_post("/channel/empty", self.channel_empty)
        r.add_post("/channel/pause", self.channel_pause)
        r.add_post("/channel/unpause", self.channel_pause)
        self.app = app
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, *,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Serve on ``host:port`` (0 picks a free port), over TLS with ``ssl_context``;
        return the port. Called again, it adds a listener (the HTTPS one)."""
        if self._runner is None:
            # The keep-alive timer runs from the connection's start and from each
            # response until a request's headers are complete: it bounds a client
            # sending headers a byte at a time as much as an idle one.
            self._runner = web.AppRunner(
                self.app, access_log=None,
                keepalive_timeout=self.broker.options.http_read_timeout)
            await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        real_port: int = sockets[0].getsockname()[1]
        return real_port

    async def aclose(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _tls_policy(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """``tls_required="true"``: plain HTTP is refused, as nsqd refuses it."""
        if not request.secure and self.broker.options.tls_required_mode == "true":
            return _json({"message": "TLS_REQUIRED", "https_port": self.https_port}, 403)
        return await handler(request)

    # ------------------------------------------------------------------ helpers

    def _topic_name(self, request: web.Request) -> str:
        name = request.query.get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return name

    def _existing(self, request: web.Request) -> tuple[Topic, str]:
        tname = self._topic_name(request)
        cname = request.query.get("channel")
        if cname is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(cname):
            raise HTTPError(400, "INVALID_CHANNEL")
        topic = self.broker.topics.get(tname)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, cname

    def _existing_channel(self, request: web.Request) -> Channel:
        topic, cname = self._existing(request)
        ch = topic.channels.get(cname)
        if ch is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return ch

    async def _read_limited(self, request: web.Request, limit: int, code: str) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, code)
        body = bytearray()
        try:
            async with asyncio.timeout(self.broker.options.http_read_timeout):
                async for chunk in request.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > limit:
                        raise HTTPError(413, code)
        except TimeoutError:
            log.info("HTTP client %s: request body not received in time, closing",
                     request.remote)
            if request.transport is not None:
                request.transport.close()
            raise HTTPError(408, "REQUEST_TIMEOUT") from None
        return bytes(body)

    async def _publish(self, tname: str, bodies: list[bytes], delay: float = 0.0) -> None:
        try:
            topic = await self.broker.get_topic(tname)
            await topic.publish(bodies, delay)
        except (DiskQueueError, OSError) as exc:
            log.error("HTTP publish to %s failed: %s", tname, exc)
            raise HTTPError(503, "EXITING") from None

    # ------------------------------------------------------------------ routes

    async def ping(self, request: web.Request) -> web.Response:
        """``GET /ping``: ``OK`` while the broker is healthy."""
        return _text("OK")

    async def info(self, request: web.Request) -> web.Response:
        """``GET /info``: version, ports, start time."""
        return _json(self.broker.info())

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /stats?format=json[&topic=T[&channel=C]]`` (text without ``format=json``)."""
        q = request.query
        include_clients = _BOOL_PARAMS.get(q.get("include_clients", ""), True)
        include_mem = _BOOL_PARAMS.get(q.get("include_mem", ""), True)
        topic = q.get("topic", "")
        producers = (self._producers(topic)
                     if include_clients and self._producers is not None else None)
        data = self.broker.stats(topic, q.get("channel", ""), include_clients=include_clients,
                                 memory=memory_stats() if include_mem else None,
                                 producers=producers)
        if q.get("format") == "json":
            return _json(data)
        return _text(_format_text(data))

    async def pub(self, request: web.Request) -> web.Response:
        """``POST /pub?topic=T[&defer=MS]``: publish the request body."""
        mx = self.broker.options.max_msg_size
        body = await self._read_limited(request, mx, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        tname = self._topic_name(request)
        delay = 0.0
        if "defer" in request.query:
            ms = parse_int(request.query["defer"].encode())
            if ms is None or ms < 0 or ms > self.broker.options.max_req_timeout * 1000:
                raise HTTPError(400, "INVALID_DEFER")
            delay = ms / 1000
        await self._publish(tname, [body], delay)
        return _text("OK")

    async def mpub(self, request: web.Request) -> web.Response:
        """``POST /mpub?topic=T[&binary=true]``: newline-separated or binary MPUB body."""
        opts = self.broker.options
        if request.content_length is not None and request.content_length > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        tname = self._topic_name(request)
        body = await self._read_limited(request, opts.max_body_size, "BODY_TOO_BIG")
        if "binary" in request.query:
            try:
                bodies = parse_mpub(body, opts.max_msg_size)
            except ClientError as err:
                raise HTTPError(413, err.code[2:]) from None
        else:
            bodies = [b for b in body.split(b"\n") if b]
            for b in bodies:
                if len(b) > opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
        if bodies:
            await self._publish(tname, bodies)
        return _text("OK")

    async def topic_create(self, request: web.Request) -> web.Response:
        """``POST /topic/create?topic=T``."""
        await self.broker.get_topic(self._topic_name(request))
        return _text("")

    async def topic_delete(self, request: web.Request) -> web.Response:
        """``POST /topic/delete?topic=T``: the topic, its channels and all their messages."""
        name = request.query.get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not await self.broker.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return _text("")

    async def topic_empty(self, request: web.Request) -> web.Response:
        """``POST /topic/empty?topic=T``: drop what waits in the topic, ready or deferred
        (not its channels)."""
        topic = self.broker.topics.get(self._topic_name(request))
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        await topic.backlog.empty()
        return _text("")

    async def topic_pause(self, request: web.Request) -> web.Response:
        """``POST /topic/pause`` and ``/topic/unpause``: hold messages in the topic."""
        topic = self.broker.topics.get(self._topic_name(request))
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        topic.paused = not request.path.endswith("unpause")
        if topic.paused:
            await topic.stop_pump()
        else:
            topic.start_pump()
        await self.broker.persist_meta()
        return _text("")

    async def channel_create(self, request: web.Request) -> web.Response:
        """``POST /channel/create?topic=T&channel=C`` (the topic must exist, as in nsqd)."""
        topic, cname = self._existing(request)
        await self.broker.get_channel(topic, cname)
        return _text("")

    async def channel_delete(self, request: web.Request) -> web.Response:
        """``POST /channel/delete?topic=T&channel=C``: its clients are disconnected, its
        messages dropped."""
        topic, cname = self._existing(request)
        if not await self.broker.delete_channel(topic, cname):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return _text("")

    async def channel_empty(self, request: web.Request) -> web.Response:
        """``POST /channel/empty?topic=T&channel=C``: drop its in-flight, ready and
        deferred messages."""
        ch = self._existing_channel(request)
        await ch.empty()
        return _text("")

    async def channel_pause(self, request: web.Request) -> web.Response:
        """``POST /channel/pause`` and ``/channel/unpause``: stop or resume deliveries."""
        ch = self._existing_channel(request)
        ch.set_paused(not request.path.endswith("unpause"))
        await self.broker.persist_meta()
        return _text("")


_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
"""nsqd's values of ``include_clients`` and ``include_mem`` (anything else: the default)."""


def memory_stats() -> dict[str, int]:
    """nsqd's ``memory`` object, from what Python can tell: ``heap_objects`` are the
    memory blocks Python's allocator holds (``sys.getallocatedblocks``, cheap to read,
    unlike a walk over every object), ``heap_in_use_bytes`` the resident set,
    ``gc_total_runs`` the collections of every generation. Go's other figures have
    no counterpart and are 0."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        resident = 0
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": resident,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(g["collections"] for g in gc.get_stats()),
    }


def _format_text(data: dict[str, Any]) -> str:
    lines = [f"nsqd v{data['version']} (aiodiskqueue broker)", f"start_time {data['start_time']}"]
    if not data["topics"]:
        lines.append("\nNO_TOPICS")
    for t in data["topics"]:
        lines.append(
            f"\n[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: {t['backend_depth']:<5} "
            f"msgs: {t['message_count']:<8}"
        )
        for c in t["channels"]:
            lines.append(
                f"    [{c['channel_name']:<25}] depth: {c['depth']:<5} "
                f"inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8}"
            )
    return "\n".join(lines) + "\n"


__all__ = ["HTTPApi"]
