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
        the stream raises on a broken connection.
        """
        while True:
            line = self.line_nowait()
            if line is not None:
                return line
            end = self._buf.find(b"\n", self._pos)
            if (len(self._buf) if end < 0 else end) - self._pos > self._limit:
                raise asyncio.LimitOverrunError("command line longer than the limit",
                                                len(self._buf) - self._pos)
            await self._fill()

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes, waiting for them.

        Raises IncompleteReadError if the stream ends first, what the stream
        raises on a broken connection.
        """
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have >= n:
            self._pos = pos + n
            return buf[pos:pos + n]
        head = buf[pos:]
        self._buf, self._pos = b"", 0
        try:
            return head + await self._stream.readexactly(n - have)
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(head + exc.partial, n) from None

    async def _fill(self) -> None:
        data = await self._stream.read(self._limit)
        if not data:
            raise asyncio.IncompleteReadError(self._buf[self._pos:], None)
        self._buf = self._buf[self._pos:] + data if self._pos < len(self._buf) else data
        self._pos = 0


__all__ = ["LINE_LIMIT", "CommandReader"]
