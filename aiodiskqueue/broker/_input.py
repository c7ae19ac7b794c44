"""The input side of a protocol V2 connection: command lines and bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ._protocol import check_mpub_count, check_mpub_size, read_int32

LINE_LIMIT = 16 * 1024 - 1
"""The longest command line a client may send, without its newline: nsqd reads
commands through a 16 KiB buffer that must hold the line and its ``\\n``, and
closes the connection when a line does not fit."""

READ_SIZE = 64 * 1024
"""Bytes taken from the stream at a time (also the stream's own buffer limit)."""

Decoder = Callable[[bytes], bytes]
"""Turns bytes off the wire into protocol bytes (a compression layer); may return
``b""`` while a chunk is incomplete. Raises BadStream for bytes it cannot decode."""


class BadStream(ConnectionError):
    """The client's bytes cannot be decoded (its compression layer is broken): as nsqd,
    the connection ends like a broken one, without an answer."""


class CommandReader:
    """Command lines and bodies from a client's stream, in the order they were sent.

    Everything the stream has received is taken in one piece; the command lines
    already in it are then handed out by :meth:`line_nowait` without a coroutine
    or a search per line (a consumer sends one ``FIN`` line per message, and
    many arrive together). Bodies and lines not received yet are awaited. Once
    :meth:`set_decoder` is called every byte that follows goes through the
    decoder (IDENTIFY's compression). A cancelled read takes nothing: what it
    read so far is kept for the next one.
    """

    def __init__(self, stream: asyncio.StreamReader, limit: int = LINE_LIMIT) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = b""
        self._pos = 0
        self._pending: list[bytes] = []
        """Bytes read after ``_buf`` that are not part of it yet (a line without its
        newline so far, or part of a body)."""
        self._pending_len = 0
        self._decode: Decoder | None = None

    def set_decoder(self, decode: Decoder) -> None:
        """Decode everything from here on (bytes already read but not used too)."""
        rest = self._buf[self._pos:] + b"".join(self._pending)
        self._pending.clear()
        self._pending_len = 0
        self._buf, self._pos = (decode(rest) if rest else b""), 0
        self._decode = decode

    def unread(self, data: bytes) -> None:
        """Put ``data`` (already decoded) back in front of what is still to be read."""
        self._fold()
        self._buf = data + self._buf[self._pos:]
        self._pos = 0

    def line_nowait(self) -> bytes | None:
        """The next command line if all of it has arrived (without its ``\\n``), else None
        (also for a line longer than the limit: :meth:`readline` raises for it)."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos)
        if end < 0 or end - pos > self._limit:
            return None
        self._pos = end + 1
        return buf[pos:end]

    def _fold(self) -> None:
        """Make the pending bytes part of the buffer (after a cancelled read)."""
        if self._pending:
            self._buf = self._buf[self._pos:] + b"".join(self._pending)
            self._pos = 0
            self._pending.clear()
            self._pending_len = 0

    async def _read(self) -> bytes:
        """The next bytes that arrive, decoded; never empty.

        Raises IncompleteReadError (with everything unused) if the stream ends.
        """
        while True:
            data = await self._stream.read(READ_SIZE)
            if not data:
                partial = self._buf[self._pos:] + b"".join(self._pending)
                raise asyncio.IncompleteReadError(partial, None)
            if self._decode is not None:
                data = self._decode(data)
            if data:
                return data

    async def readline(self) -> bytes:
        """The next command line (without its ``\\n``), waiting for it.

        Raises IncompleteReadError if the stream ends first, LimitOverrunError as
        soon as more than the limit has arrived without a newline, BadStream
        from the decoder, what the stream raises on a broken connection.
        """
        self._fold()
        line = self.line_nowait()
        if line is not None:
            return line
        if self._pos < len(self._buf):
            self._pending.append(self._buf[self._pos:])
            self._pending_len += len(self._buf) - self._pos
        self._buf, self._pos = b"", 0
        while True:
            if self._pending_len > self._limit:
                raise asyncio.LimitOverrunError("command line longer than the limit",
                                                self._pending_len)
            data = await self._read()
            end = data.find(b"\n")  # each piece is searched once, as it arrives
            if end < 0:
                self._pending.append(data)
                self._pending_len += len(data)
                continue
            line = b"".join(self._pending) + data[:end]
            self._pending.clear()
            self._pending_len = 0
            self._buf, self._pos = data, end + 1
            if len(line) > self._limit:
                raise asyncio.LimitOverrunError("command line longer than the limit", len(line))
            return line

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes, waiting for them.

        Raises IncompleteReadError if the stream ends first, BadStream from the
        decoder, what the stream raises on a broken connection.
        """
        self._fold()
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have >= n:
            self._pos = pos + n
            return buf[pos:pos + n]
        if self._decode is None:
            head = buf[pos:]
            try:
                rest = await self._stream.readexactly(n - have)
            except asyncio.IncompleteReadError as exc:
                raise asyncio.IncompleteReadError(head + exc.partial, n) from None
            self._buf, self._pos = b"", 0
            return head + rest
        while have + self._pending_len < n:
            data = await self._read()
            self._pending.append(data)
            self._pending_len += len(data)
        self._fold()
        self._pos = n
        return self._buf[:n]

    async def read_mpub(self, max_msg_size: int, max_body_size: int) -> list[bytes]:
        """An MPUB's count and messages, read one by one as nsqd reads them from the
        stream (not bounded by the body size the client gave).

        Raises ClientError with nsqd's codes for a bad count or message, what
        :meth:`readexactly` raises.
        """
        count = read_int32(await self.readexactly(4))
        check_mpub_count(count, max_body_size)
        bodies: list[bytes] = []
        for i in range(count):
            size = read_int32(await self.readexactly(4))
            check_mpub_size(i, size, max_msg_size)
            bodies.append(await self.readexactly(size))
        return bodies


__all__ = ["LINE_LIMIT", "READ_SIZE", "BadStream", "CommandReader", "Decoder"]
