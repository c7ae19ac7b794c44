"""The input side of a protocol V2 connection: command lines and bodies."""

from __future__ import annotations

import asyncio

LINE_LIMIT = 64 * 1024
"""The longest command line a client may send (nsqd's reader buffer)."""


class CommandReader:
    """Command lines and bodies from a client's stream, in the order they were sent.

    Everything the stream has received is taken in one piece; the command lines
    already in it are then handed out by :meth:`line_nowait` without a coroutine
    or a search per line (a consumer sends one ``FIN`` line per message, and
    many arrive together). Bodies and lines not received yet are awaited.
    """

    def __init__(self, stream: asyncio.StreamReader, limit: int = LINE_LIMIT) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = b""
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

    async def readline(self) -> bytes:
        """The next command line (without its ``\\n``), waiting for it.

        Raises IncompleteReadError if the stream ends first, LimitOverrunError if
        the line is longer than the limit (as ``StreamReader.readuntil``), what
        the stream raises on a broken connection. Cancelling it takes nothing.
        """
        line = self.line_nowait()
        if line is not None:
            return line
        if self._pos == len(self._buf):  # nothing left over: take all that arrives next
            data = await self._stream.read(self._limit)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            self._buf, self._pos = data, 0
            line = self.line_nowait()
            if line is not None:
                return line
        # Part of a line is here: the stream finds the rest (its search does not start
        # over with each piece that arrives).
        head = self._buf[self._pos:]
        if len(head) > self._limit:
            raise asyncio.LimitOverrunError("command line longer than the limit", len(head))
        try:
            rest = await self._stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(head + exc.partial, None) from None
        self._buf, self._pos = b"", 0
        line = head + rest[:-1]
        if len(line) > self._limit:
            raise asyncio.LimitOverrunError("command line longer than the limit", len(line))
        return line

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes, waiting for them.

        Raises IncompleteReadError if the stream ends first, what the stream
        raises on a broken connection. Cancelling it takes nothing.
        """
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have >= n:
            self._pos = pos + n
            return buf[pos:pos + n]
        head = buf[pos:]
        try:
            rest = await self._stream.readexactly(n - have)
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(head + exc.partial, n) from None
        self._buf, self._pos = b"", 0
        return head + rest


__all__ = ["LINE_LIMIT", "CommandReader"]
