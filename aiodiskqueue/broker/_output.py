"""The output side of a protocol V2 connection: batched writes and in-order replies."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast

from ._input import BadStream
from ._protocol import ClientError
from ._tls import HANDSHAKE_TIMEOUT

log = logging.getLogger(__name__)

Reply = bytes | ClientError | asyncio.Task[bytes] | None
"""What a command handler returns: a frame, an error, a reply still being stored, nothing."""

WRITE_HIGH_WATER = 1 << 20
"""Bytes buffered for a client's socket above which the writer waits for it to drain."""


class ReplyWriter:
    """Frames for one client: everything queued in one loop iteration goes out in one write.

    A reply is sent at once or, while a publish before it is still being
    stored, queued behind it, so replies leave in command order. A fatal
    error frame goes out last and closes the connection.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._closed = False
        self._failed = False
        self._replies: deque[bytes | ClientError | asyncio.Task[bytes]] = deque()
        """Replies not sent yet, in command order: a publish's reply waits for its store."""
        self._held = False
        """Frames stay queued, unwritten: the stream is being upgraded to TLS."""
        self._encode: Callable[[bytes], bytes] | None = None
        """The connection's compression, applied to each write."""
        self._orphaned = False
        """A failed TLS upgrade closed the socket behind the stream's back: the stream
        is never told, so waiting for it to close would wait forever."""

    def hold(self) -> None:
        """Write nothing until :meth:`release` (a TLS handshake runs on the stream)."""
        self._flush()
        self._held = True

    def release(self) -> None:
        """Write what was queued while held, and everything after it, again."""
        self._held = False
        self._flush()

    async def wait_replies(self) -> None:
        """Wait until the replies queued so far are sent (their publishes stored).

        Raises ConnectionError if one of them failed the connection.
        """
        storing = [r for r in self._replies if isinstance(r, asyncio.Task)]
        if storing:
            await asyncio.wait(storing)  # each one's callback sends its reply first
        if self._failed:
            raise ConnectionError("closed by a failed publish")

    async def start_tls(self, ctx: ssl.SSLContext, answer: bytes) -> ssl.SSLObject:
        """Send ``answer`` in the clear, then take the server side of a TLS handshake on
        the same stream; return the session. Frames queued meanwhile go out after it.

        Raises BadStream if the handshake fails or takes more than
        :data:`HANDSHAKE_TIMEOUT` (the stream is then neither plain nor TLS: no frame
        can be sent).
        """
        # Stop reading first: the client's handshake must reach TLS, not the stream's
        # buffer. A stream's transport reads too (uvloop's is no asyncio.ReadTransport).
        cast(asyncio.Transport, self.writer.transport).pause_reading()
        self.send(answer)
        self.hold()
        try:
            await self.writer.start_tls(ctx, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            self._orphaned = True
            raise BadStream(f"TLS handshake failed: {exc}") from None
        session: ssl.SSLObject = self.writer.get_extra_info("ssl_object")
        self.release()
        return session

    def set_encoder(self, encode: Callable[[bytes], bytes]) -> None:
        """Pass every write from here on through ``encode`` (what is queued goes out first,
        as it was)."""
        self._flush()
        self._encode = encode

    def close(self) -> None:
        """Close the connection from the server side."""
        self.writer.close()

    async def wait_closed(self) -> None:
        """Close the connection and wait until its socket is closed."""
        self.writer.close()
        if not self._orphaned:
            await self.writer.wait_closed()

    def send(self, data: bytes) -> None:
        """Queue ``data`` for the socket; everything queued in one loop iteration is one write."""
        if self._closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def send_parts(self, parts: list[bytes]) -> None:
        """Queue ``parts`` for the socket, in order, as :meth:`send` queues one frame."""
        if self._closed or not parts:
            return
        self._out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self._closed and not self._held:
            out, self._out = self._out, []
            data = b"".join(out) if len(out) > 1 else out[0]
            if self._encode is not None:
                data = self._encode(data)
            self.writer.write(data)

    async def _drain_if_needed(self) -> None:
        transport = self.writer.transport
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self._flush()
            await self.writer.drain()

    def _reply(self, item: Reply) -> None:
        """Send a reply now, or queue it behind replies still waiting for their store."""
        if item is None:
            return
        if isinstance(item, asyncio.Task):
            replies = self._replies
            if not replies or replies[-1] is not item:
                # One callback per task: a task may stand for several replies in a row
                # (pipelined PUBs stored together), all sent by that one call.
                item.add_done_callback(self._send_replies)
            replies.append(item)
        elif self._replies:
            self._replies.append(item)
        elif isinstance(item, ClientError):
            self._send_reply(item)
        else:
            self.send(item)

    def _send_replies(self, _task: object = None) -> None:
        """Send the replies at the head of the queue that are ready, in order."""
        replies = self._replies
        while replies and not self._failed:
            head = replies[0]
            if isinstance(head, asyncio.Task):
                if not head.done():
                    return
                replies.popleft()
                if head.cancelled():
                    continue
                exc = head.exception()
                if exc is None:
                    self.send(head.result())
                    continue
                if not isinstance(exc, ClientError):
                    log.error("client %s: publish failed", self, exc_info=exc)
                    exc = ClientError("E_PUB_FAILED", f"PUB failed {exc}")
                self._send_reply(exc)
            else:
                replies.popleft()
                if isinstance(head, ClientError):
                    self._send_reply(head)
                else:
                    self.send(head)

    def _send_reply(self, err: ClientError) -> None:
        self.send(err.frame())
        if err.fatal:
            # Like nsqd: the error frame goes out, then the connection closes.
            self._failed = True
            self._replies.clear()
            self._flush()
            self.close()


def wake_future(fut: asyncio.Future[None]) -> None:
    """Complete ``fut`` unless it is done already (a timer callback)."""
    if not fut.done():
        fut.set_result(None)


__all__ = ["WRITE_HIGH_WATER", "Reply", "ReplyWriter", "wake_future"]
