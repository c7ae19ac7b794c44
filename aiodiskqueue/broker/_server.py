"""The NSQ TCP protocol V2 server: one :class:`Connection` per client, on asyncio streams."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from ..errors import DiskQueueError, MessageNotInFlight
from ._auth import AuthClient, ClientAuth
from ._backend import PER_DELIVERY_TIMEOUT, Delivery
from ._broker import Broker
from ._compress import deflate_codec, snappy_codec
from ._delivery import DeliveryPump
from ._identify import ClientConfig, negotiate
from ._input import LINE_LIMIT, BadStream, CommandReader
from ._output import WRITE_HIGH_WATER, Reply
from ._protocol import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    MSG_ID_LENGTH,
    OK,
    ClientError,
    base10,
    check_message_id,
    decode_name,
    frame,
    go_quote,
    int64,
    raw_param,
    read_int32,
    split_mpub,
)
from ._tls import connection_info, peer_common_name
from ._topic import Channel

log = logging.getLogger(__name__)

_MAX_PENDING_REPLIES = 256
"""Publishes in progress per connection before the next command waits for the oldest."""

_ids = itertools.count(1)

_HEARTBEAT_FRAME = frame(FRAME_RESPONSE, HEARTBEAT)
_OK_FRAME = frame(FRAME_RESPONSE, OK)


class ClientState(enum.IntEnum):
    """nsqd's client states (the numbers appear in /stats: nsqd 1.3.0's constants)."""

    INIT = 0
    SUBSCRIBED = 3
    CLOSING = 4


# Named once for each FIN's check: a member looked up through its class costs ~0.1 us.
_SUBSCRIBED = ClientState.SUBSCRIBED


class Connection(DeliveryPump):
    """One client connection speaking protocol V2.

    Commands are read and handled in order, as nsqd does, with one
    difference: while a ``PUB``/``MPUB``/``DPUB`` is being stored the next
    command is already read, so pipelined publishes share a write batch.
    Replies still go out in command order, and an ``OK`` only once the
    message is stored in every channel (an error frame after the replies of
    the commands before it). While
    subscribed, a pump task takes messages from the channel's store whenever
    the client's in-flight count is below its ``RDY`` count and writes them
    out. Frames produced in one event loop iteration go out in one write.
    When the connection ends, every message still in flight for it is
    requeued at once (nsqd waits for the message timeout instead).
    """

    def __init__(
        self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        *, tls_context: ssl.SSLContext | None = None, auth: AuthClient | None = None,
    ) -> None:
        super().__init__(writer)
        self.broker = broker
        self.reader = CommandReader(reader)
        self.id = next(_ids)
        opts = broker.options
        self._tls_context = tls_context
        self._tls_required = opts.tls_required_mode != "false"
        self.ssl_object: ssl.SSLObject | None = None
        """The TLS session once the client upgraded (IDENTIFY ``tls_v1``)."""
        self.authz = (ClientAuth(auth, self._peer)
                      if auth is not None and auth.enabled else None)
        """AUTH and its checks; None without auth servers (everything allowed)."""
        self.config = ClientConfig(
            heartbeat_interval_ms=round(opts.heartbeat_interval * 1000),
            msg_timeout_ms=round(opts.msg_timeout * 1000),
        )
        self.msg_timeout: float | None = None
        """The client's IDENTIFY ``msg_timeout`` in seconds; None: the broker's applies."""
        self.state = ClientState.INIT
        self.channel: Channel | None = None
        self.rdy = 0
        self.in_flight: dict[bytes, Delivery] = {}
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        """Messages this client published, by topic (a producer in /stats)."""
        self.connect_ts = int(time.time())
        peer = writer.get_extra_info("peername")
        self.remote_address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._pump: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._next_prune = 0.0
        self._getting = False
        """The pump waits in ``store.get()`` (no message is ready)."""
        self._last_active = 0.0
        self._ordering: asyncio.Task[bytes] | None = None
        """The last publish that later ones must wait for (see :meth:`_publish`)."""
        self._last_topic: tuple[bytes | None, str] = (None, "")
        """The raw and decoded topic parameter of the last publish that passed the checks."""
        self._pub_batch: tuple[str, list[bytes], asyncio.Task[bytes]] | None = None
        """Topic, bodies and task of the last PUB while its store has not started:
        pipelined PUBs to the same topic join it (see :meth:`_pub`)."""
        self._handlers: dict[bytes, Callable[[list[bytes]], Awaitable[Reply]]] = {
            b"IDENTIFY": self._identify,
            b"SUB": self._sub,
            b"RDY": self._rdy,
            b"REQ": self._req,
            b"TOUCH": self._touch,
            b"PUB": self._pub,
            b"MPUB": self._mpub,
            b"DPUB": self._dpub,
            b"NOP": self._nop,
            b"CLS": self._cls,
            b"AUTH": self._auth,
        }

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        """Serve the connection until the client leaves or a fatal error."""
        try:
            loop = asyncio.get_running_loop()
            try:
                timeout = 2 * self.config.heartbeat_interval_ms / 1000
                async with asyncio.timeout(timeout):
                    magic = await self.reader.readexactly(4)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            if magic != MAGIC_V2:
                # nsqd's frame is the bare code; the magic goes to the log.
                log.info("client %s: bad protocol magic %r", self, magic)
                self.send(frame(FRAME_ERROR, b"E_BAD_PROTOCOL"))
                return
            self._heartbeat = loop.create_task(self._run_heartbeat())
            transport = self.writer.transport
            in_flight = self.in_flight
            reader = self.reader
            while True:
                line = reader.line_nowait()  # FIN lines arrive many at a time
                if line is None:
                    self._last_active = loop.time()
                    try:
                        line = await reader.readline()
                    except BadStream as exc:
                        log.info("client %s: %s, closing", self, exc)
                        return
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    except asyncio.LimitOverrunError:
                        # As nsqd when a line does not fit its read buffer: no answer.
                        log.info("client %s: command line longer than %d bytes, closing",
                                 self, LINE_LIMIT)
                        return
                if line[-1:] == b"\r":
                    line = line[:-1]
                self._last_active = loop.time()
                params = line.split(b" ")
                try:
                    if params[0] == b"FIN":
                        # The consumer's per-message command, without a handler
                        # coroutine; it sends nothing, so the checks after a reply
                        # do not apply. The usual case (subscribed, one 16-byte id
                        # in flight) skips the checks' calls; anything else gets them.
                        d = (in_flight.pop(params[1], None)
                             if len(params) == 2 and self.state is _SUBSCRIBED
                             and len(params[1]) == MSG_ID_LENGTH else None)
                        if d is None:
                            d = self._fin(params)
                        else:
                            self.wake()
                        try:
                            await d.finish()
                        except DiskQueueError as exc:  # not in flight, or closing
                            raise _settle_failed("FIN", d.id, exc) from None
                        self.finish_count += 1
                        if self._failed:
                            return
                        continue
                    if self._tls_required and self.ssl_object is None:
                        self._check_tls(params[0])
                    handler = self._handlers.get(params[0])
                    if handler is None:
                        raise ClientError("E_INVALID", f"invalid command {raw_param(params[0])}")
                    resp = await handler(params)
                except ClientError as err:
                    log.info("client %s: %s", self, err)
                    self._reply(err)
                    if err.fatal:
                        return
                    continue
                except BadStream as exc:
                    log.info("client %s: %s, closing", self, exc)
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if resp is not None:
                    self._reply(resp)
                transport = self.writer.transport  # a TLS upgrade replaces it
                if self._failed:
                    return
                if len(self._replies) > _MAX_PENDING_REPLIES:
                    head = self._replies[0]
                    if isinstance(head, asyncio.Task):
                        await asyncio.wait((head,))
                if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                    await self._drain_if_needed()
        except Exception:
            log.exception("client %s: unexpected error", self)
        finally:
            await self._teardown()

    async def _teardown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        storing = [r for r in self._replies if isinstance(r, asyncio.Task)]
        if storing:
            # Publishes already started complete (their messages are stored);
            # their replies go out if the client is still there.
            await asyncio.wait(storing)
            self._send_replies()
        await self._stop_pump()
        ch = self.channel
        if ch is not None:
            ch.clients.pop(self.id, None)
        pending = list(self.in_flight.values())
        self.in_flight.clear()
        for d in pending:
            with contextlib.suppress(DiskQueueError):
                await d.requeue(0.0)
        if ch is not None and ch.ephemeral and not ch.clients and not self.broker.closing:
            # nsqd deletes an ephemeral channel when its last client leaves.
            try:
                await self.broker.delete_channel(ch.topic, ch.name)
            except (DiskQueueError, OSError) as exc:
                log.error("deleting ephemeral channel %s failed: %s", ch.queue_name, exc)
        self._flush()
        self._closed = True
        with contextlib.suppress(Exception):
            await self.wait_closed()

    def _run_heartbeat(self) -> Coroutine[Any, Any, None]:
        return _run_heartbeat(self)

    # ------------------------------------------------------------------ body helpers

    async def _read_body(
        self, what: str, code: str, limit: int, *, size_word: str = "body size"
    ) -> bytes:
        n = read_int32(await self.reader.readexactly(4))
        if n <= 0:
            raise ClientError(code, f"{what} invalid {size_word} {n}")
        if n > limit:
            kind = "message" if code == "E_BAD_MESSAGE" else "body"
            raise ClientError(code, f"{what} {kind} too big {n} > {limit}")
        return await self.reader.readexactly(n)

    async def _topic_param(self, params: list[bytes], cmd: str, nparams: int) -> str:
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        raw = params[1]
        if raw == self._last_topic[0]:
            return self._last_topic[1]  # a publisher mostly repeats its topic
        name = decode_name(raw)
        if name is None:
            # nsqd's MPUB repeats the code in its description.
            prefix = "E_BAD_TOPIC " if cmd == "MPUB" else ""
            raise ClientError("E_BAD_TOPIC",
                              f"{prefix}{cmd} topic name {go_quote(raw)} is not valid")
        self._last_topic = (raw, name)
        return name

    # ------------------------------------------------------------------ commands

    async def _identify(self, params: list[bytes]) -> Reply:
        if self.state is not ClientState.INIT:
            raise ClientError("E_INVALID", "cannot IDENTIFY in current state")
        body = await self._read_body("IDENTIFY", "E_BAD_BODY", self.broker.options.max_body_size)
        opts = self.broker.options
        limits = opts.limits()
        if limits.tls != (self._tls_context is not None):
            limits = replace(limits, tls=self._tls_context is not None)
        self.config, resp = negotiate(body, limits, client_msg_timeout=PER_DELIVERY_TIMEOUT)
        ms = self.config.msg_timeout_ms
        # The broker's own value exactly when the client asked for none (or for
        # it); never past the store's maximum, whatever the rounding to ms.
        self.msg_timeout = (None if ms == limits.msg_timeout_ms
                            else min(ms / 1000, opts.max_msg_timeout))
        if self._heartbeat is not None:
            # Restart the ticker with the negotiated interval.
            self._heartbeat.cancel()
            self._heartbeat = asyncio.get_running_loop().create_task(self._run_heartbeat())
        cfg = self.config
        if cfg.tls_v1 or cfg.snappy or cfg.deflate:
            await self._upgrade(frame(FRAME_RESPONSE, resp))
            return None
        return frame(FRAME_RESPONSE, resp)

    def _check_tls(self, cmd: bytes) -> None:
        """``--tls-required``: every command but IDENTIFY waits for the upgrade (nsqd's words)."""
        if cmd != b"IDENTIFY":
            raise ClientError("E_INVALID",
                              f"cannot {raw_param(cmd)} in current state (TLS required)")

    async def _upgrade(self, answer: bytes) -> None:
        """Send IDENTIFY's ``answer``, then upgrade the stream as nsqd: TLS (answered
        ``OK`` once the handshake is done), then compression (``OK``, compressed).

        Raises BadStream if the TLS handshake fails (the connection is closed, no
        frame: the stream is neither plain nor TLS any more).
        """
        await self.wait_replies()  # the replies of publishes before IDENTIFY go out first
        cfg = self.config
        if cfg.tls_v1:
            assert self._tls_context is not None  # negotiate grants TLS only with it
            self.ssl_object = await self.start_tls(self._tls_context, answer)
            log.info("client %s: upgraded to TLS", self)
            self.send(_OK_FRAME)
        else:
            self.send(answer)
        if cfg.snappy or cfg.deflate:
            encode, decode = (snappy_codec() if cfg.snappy
                              else deflate_codec(cfg.deflate_level))
            self.set_encoder(encode)
            self.reader.set_decoder(decode)
            log.info("client %s: upgraded to %s", self, "snappy" if cfg.snappy else
                     f"deflate (level {cfg.deflate_level})")
            self.send(_OK_FRAME)

    async def _auth(self, params: list[bytes]) -> Reply:
        if self.state is not ClientState.INIT:
            raise ClientError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise ClientError("E_INVALID", "AUTH invalid number of parameters")
        body = await self._read_body("AUTH", "E_BAD_BODY", self.broker.options.max_body_size)
        if self.authz is None:
            raise ClientError("E_AUTH_DISABLED", "AUTH disabled")
        return frame(FRAME_RESPONSE, await self.authz.auth(body))

    def _peer(self) -> tuple[str, bool, str]:
        """What the auth server is told of this client: IP, TLS, certificate name."""
        peer = self.writer.get_extra_info("peername")
        return (peer[0] if isinstance(peer, tuple) else "", self.ssl_object is not None,
                peer_common_name(self.ssl_object))

    async def _sub(self, params: list[bytes]) -> Reply:
        if self.state is not ClientState.INIT:
            raise ClientError("E_INVALID", "cannot SUB in current state")
        if self.config.heartbeat_interval_ms <= 0:
            raise ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ClientError("E_INVALID", "SUB insufficient number of parameters")
        tname = decode_name(params[1])
        if tname is None:
            raise ClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        cname = decode_name(params[2])
        if cname is None:
            raise ClientError("E_BAD_CHANNEL",
                              f"SUB channel name {go_quote(params[2])} is not valid")
        if self.authz is not None:
            await self.authz.check("SUB", tname, cname)
        topic = await self.broker.get_topic(tname)
        ch = await self.broker.get_channel(topic, cname)
        ch.clients[self.id] = self
        self.channel = ch
        self.state = ClientState.SUBSCRIBED
        return _OK_FRAME

    async def _rdy(self, params: list[bytes]) -> Reply:
        if self.state is ClientState.CLOSING:
            return None
        if self.state is not ClientState.SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = base10(params[1])
            if parsed is None:
                raise ClientError("E_INVALID", f"RDY could not parse count {raw_param(params[1])}")
            count = int64(parsed)
        mx = self.broker.options.max_rdy_count
        if count < 0 or count > mx:
            raise ClientError("E_INVALID", f"RDY count {count} out of range 0-{mx}")
        if count != self.rdy:
            self.rdy = count
            await self._stop_pump()
            if count > 0:
                self._start_pump()
        return None

    def _settle_params(self, params: list[bytes], cmd: str, nparams: int) -> bytes:
        """The message id of a FIN, REQ or TOUCH (nsqd's checks, in nsqd's order)."""
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise ClientError("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of params")
        return check_message_id(params[1])

    def _in_flight(self, msg_id: bytes, cmd: str) -> Delivery:
        d = self.in_flight.get(msg_id)
        if d is None:
            code = {"FIN": "E_FIN_FAILED", "REQ": "E_REQ_FAILED", "TOUCH": "E_TOUCH_FAILED"}[cmd]
            raise ClientError(code, f"{cmd} {raw_param(msg_id)} failed ID not in flight",
                              fatal=False)
        return d

    def _fin(self, params: list[bytes]) -> Delivery:
        """FIN's checks (not a coroutine); :meth:`run` finishes the message in the store."""
        if self._tls_required and self.ssl_object is None:
            self._check_tls(params[0])
        d = self._in_flight(self._settle_params(params, "FIN", 2), "FIN")
        del self.in_flight[d.id]
        self.wake()
        return d

    async def _req(self, params: list[bytes]) -> Reply:
        msg_id = self._settle_params(params, "REQ", 3)
        parsed = base10(params[2])
        if parsed is None:
            raise ClientError("E_INVALID", f"REQ could not parse timeout {raw_param(params[2])}")
        # As nsqd: a delay out of range is clamped (pynsq's backoff passes 1 h
        # from its 41st attempt), not an error; nsqd's nanoseconds wrap as Go's int64.
        ns = int64(parsed * 1_000_000)
        mx = round(self.broker.options.max_req_timeout * 1e9)
        clamped = min(max(ns, 0), mx)
        if clamped != ns:
            log.info("client %s: REQ timeout %d out of range 0-%d, using %d", self, ns, mx, clamped)
        ms = clamped // 1_000_000
        d = self._in_flight(msg_id, "REQ")
        del self.in_flight[d.id]
        self.wake()
        try:
            await d.requeue(ms / 1000)
        except DiskQueueError as exc:
            raise _settle_failed("REQ", d.id, exc) from None
        self.requeue_count += 1
        return None

    async def _touch(self, params: list[bytes]) -> Reply:
        d = self._in_flight(self._settle_params(params, "TOUCH", 2), "TOUCH")
        try:
            await d.touch()
        except DiskQueueError as exc:
            self.in_flight.pop(d.id, None)
            self.wake()
            raise _settle_failed("TOUCH", d.id, exc) from None
        return None

    async def _nop(self, params: list[bytes]) -> Reply:
        return None

    async def _cls(self, params: list[bytes]) -> Reply:
        if self.state is not ClientState.SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot CLS in current state")
        self.state = ClientState.CLOSING
        self.rdy = 0
        await self._stop_pump()
        return frame(FRAME_RESPONSE, CLOSE_WAIT)

    async def _pub(self, params: list[bytes]) -> Reply:
        tname = await self._topic_param(params, "PUB", 2)
        body = await self._read_body("PUB", "E_BAD_MESSAGE", self.broker.options.max_msg_size,
                                     size_word="message body size")
        if self.authz is not None:
            await self.authz.check("PUB", tname)
        batch = self._pub_batch
        if batch is not None and batch[0] == tname:
            # A PUB to the same topic whose store has not started yet: one write,
            # one reply per PUB when it is done (see _publish).
            batch[1].append(body)
            return batch[2]
        bodies = [body]
        task = self._publish("E_PUB_FAILED", "PUB", tname, bodies)
        self._pub_batch = (tname, bodies, task)
        return task

    async def _dpub(self, params: list[bytes]) -> Reply:
        tname = await self._topic_param(params, "DPUB", 3)
        ms = base10(params[2])
        if ms is None:
            raise ClientError("E_INVALID", f"DPUB could not parse timeout {raw_param(params[2])}")
        ns = int64(ms * 1_000_000)  # nsqd's time.Duration, wrapping as Go's int64
        mx = round(self.broker.options.max_req_timeout * 1000)
        if ns < 0 or ns > mx * 1_000_000:
            raise ClientError("E_INVALID", f"DPUB timeout {ms} out of range 0-{mx}")
        ms = ns // 1_000_000
        body = await self._read_body("DPUB", "E_BAD_MESSAGE", self.broker.options.max_msg_size,
                                     size_word="message body size")
        if self.authz is not None:
            await self.authz.check("DPUB", tname)
        return self._publish("E_DPUB_FAILED", "DPUB", tname, [body], ms / 1000)

    async def _mpub(self, params: list[bytes]) -> Reply:
        tname = await self._topic_param(params, "MPUB", 2)
        if self.authz is not None:  # before the body, as nsqd
            await self.authz.check("MPUB", tname)
        opts = self.broker.options
        body = await self._read_body("MPUB", "E_BAD_BODY", opts.max_body_size)
        # nsqd reads the messages from the stream: its body size bounds nothing. What
        # follows them is the next command; messages longer than it are read on.
        split = split_mpub(body, opts.max_msg_size, opts.max_body_size)
        if split is None:
            self.reader.unread(body)
            bodies = await self.reader.read_mpub(opts.max_msg_size, opts.max_body_size)
        else:
            bodies, end = split
            if end < len(body):
                self.reader.unread(body[end:])
        return self._publish("E_MPUB_FAILED", "MPUB", tname, bodies)

    def _publish(self, code: str, cmd: str, tname: str, bodies: list[bytes],
                 delay: float = 0.0) -> asyncio.Task[bytes]:
        """Start storing ``bodies``; the task's result is the ``OK`` frame.

        The next command is read while this one is stored, so a client that
        pipelines PUBs has them written in one batch; replies stay in order
        (see :meth:`_reply`). Message order: tasks start in command order and
        each put is queued before its first wait, except when a topic must be
        created first. Such a publish, and every later one of this connection
        until it is done, waits for the one before it. PUBs to the same topic
        read before the task of the first one starts are stored by that task,
        as one batch (:meth:`_pub`).
        """
        self._pub_batch = None  # a PUB after this one must not be stored before it
        prev = self._ordering
        if prev is not None and prev.done():
            prev = None
        task = asyncio.get_running_loop().create_task(
            self._store(code, cmd, tname, bodies, delay, prev))
        if prev is not None or tname not in self.broker.topics:
            self._ordering = task
        return task

    async def _store(self, code: str, cmd: str, tname: str, bodies: list[bytes],
                     delay: float, after: asyncio.Task[bytes] | None) -> bytes:
        batch = self._pub_batch
        if batch is not None and batch[1] is bodies:
            self._pub_batch = None  # started: later PUBs make a new batch
        if after is not None:
            await asyncio.wait((after,))
        try:
            topic = await self.broker.get_topic(tname)
            await topic.publish(bodies, delay)
        except (DiskQueueError, OSError) as exc:
            log.error("client %s: %s to %s failed: %s", self, cmd, tname, exc)
            raise ClientError(code, f"{cmd} failed {exc}") from None
        self.pub_counts[tname] = self.pub_counts.get(tname, 0) + len(bodies)
        return _OK_FRAME

    def stats(self, topic: str = "") -> dict[str, Any]:
        """nsqd's client stats object (``pub_counts`` only of ``topic`` if given)."""
        return _client_stats(self, topic)

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote_address} state={self.state.name}>"


def _settle_failed(cmd: str, msg_id: bytes, exc: DiskQueueError) -> ClientError:
    """The error frame of a FIN, REQ or TOUCH that the store refused, in nsqd's words."""
    reason = "ID not in flight" if isinstance(exc, MessageNotInFlight) else str(exc)
    return ClientError(f"E_{cmd}_FAILED", f"{cmd} {raw_param(msg_id)} failed {reason}",
                       fatal=False)


async def _run_heartbeat(conn: Connection) -> None:
    """Send ``_heartbeat_`` every interval; close a client silent for two intervals.

    As nsqd's read deadline: the client must send something (a NOP answers
    a heartbeat) at least every two intervals. Waiting here rather than
    around each read keeps the read path free of timers.
    """
    loop = asyncio.get_running_loop()
    while True:
        hb = conn.config.heartbeat_interval_ms / 1000
        if hb <= 0:
            return
        await asyncio.sleep(hb)
        if loop.time() - conn._last_active > 2 * hb:
            log.info("client %s: nothing received for two heartbeat intervals, closing", conn)
            conn.close()
            return
        conn.send(_HEARTBEAT_FRAME)


def _client_stats(conn: Connection, topic: str) -> dict[str, Any]:
    """nsqd's client stats object."""
    cfg = conn.config
    pubs = [{"topic": t, "count": n} for t, n in sorted(conn.pub_counts.items())
            if not topic or t == topic]
    return {
        "client_id": cfg.client_id,
        "hostname": cfg.hostname,
        "version": "V2",
        "remote_address": conn.remote_address,
        "state": int(conn.state),
        "ready_count": conn.rdy,
        # Not len(): deliveries the store took back at their deadline are gone.
        "in_flight_count": sum(1 for d in conn.in_flight.values() if d.in_flight),
        "message_count": conn.message_count,
        "finish_count": conn.finish_count,
        "requeue_count": conn.requeue_count,
        "connect_ts": conn.connect_ts,
        "sample_rate": cfg.sample_rate,
        "deflate": cfg.deflate,
        "snappy": cfg.snappy,
        "user_agent": cfg.user_agent,
        **connection_info(conn.ssl_object),
        **(conn.authz.stats() if conn.authz is not None else {}),
        **({"pub_counts": pubs} if pubs else {}),
        "msg_timeout": cfg.msg_timeout_ms,
    }

__all__ = ["ClientState", "Connection"]
