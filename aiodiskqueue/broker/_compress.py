"""The compression layers IDENTIFY can put on a connection: deflate and snappy.

As nsqd: deflate is a raw DEFLATE stream (no zlib header) in each direction,
flushed (a sync flush) with every write; snappy is the snappy *framing format*
(a stream identifier, then checksummed chunks of at most 64 KiB), written as
Go's snappy library writes it. Snappy's chunks are compressed and checked by
``cramjam`` (the ``broker`` extra); the framing is read here, chunk by chunk,
so that a stream can be decoded as its bytes arrive.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from typing import Any

from ._input import BadStream, Decoder

Encoder = Callable[[bytes], bytes]
"""Turns protocol bytes into the bytes to send (one call per write, flushed)."""

_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
_MAX_BLOCK = 65536
"""The most uncompressed bytes in one snappy chunk."""
_MAX_CHUNK = 4 + 32 + _MAX_BLOCK + _MAX_BLOCK // 6
"""The longest chunk body a snappy writer produces (checksum and a worst-case block)."""


@functools.cache
def snappy_available() -> bool:
    """True if the snappy framing format can be used (``cramjam`` is installed)."""
    try:
        import cramjam  # noqa: F401
    except ImportError:
        return False
    return True


def deflate_codec(level: int) -> tuple[Encoder, Decoder]:
    """A raw-deflate encoder at ``level`` and decoder for one connection."""
    comp = zlib.compressobj(level, zlib.DEFLATED, -15)
    decomp = zlib.decompressobj(-15)

    def encode(data: bytes) -> bytes:
        return comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)

    def decode(data: bytes) -> bytes:
        try:
            out = decomp.decompress(data)
        except zlib.error as exc:
            raise BadStream(f"deflate: {exc}") from None
        if decomp.eof:  # the client ended its stream: nothing more can follow
            raise BadStream("deflate: the stream ended")
        return out

    return encode, decode


def snappy_codec() -> tuple[Encoder, Decoder]:
    """A snappy-framing encoder and decoder for one connection.

    Raises ImportError if ``cramjam`` is not installed.
    """
    from cramjam import DecompressionError, snappy

    started = False

    def encode(data: bytes) -> bytes:
        nonlocal started
        # cramjam writes a whole stream: its identifier, then chunks split and
        # chosen (compressed or not) as Go's writer does. The identifier goes
        # out once, at the start, as Go's writer sends it.
        framed = bytes(snappy.compress(data))
        if started:
            return framed[len(_STREAM_ID):]
        started = True
        return framed

    return encode, _SnappyDecoder(snappy.decompress, DecompressionError)


class _SnappyDecoder:
    """Decodes the snappy framing format as it arrives (a :data:`Decoder`)."""

    def __init__(self, decompress: Callable[[bytes], Any],
                 error: type[Exception]) -> None:
        self._decompress = decompress
        self._error = error
        self._buf = bytearray()
        self._started = False

    def __call__(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        while len(buf) - pos >= 4:
            ctype = buf[pos]
            n = int.from_bytes(buf[pos + 1:pos + 4], "little")
            if n > _MAX_CHUNK and ctype < 0x80:
                raise BadStream(f"snappy: chunk of {n} bytes is too long")
            if len(buf) - pos - 4 < n:
                break
            body = bytes(buf[pos + 4:pos + 4 + n])
            pos += 4 + n
            if ctype == 0xFF:
                if body != _STREAM_ID[4:]:
                    raise BadStream("snappy: bad stream identifier")
                self._started = True
            elif not self._started:
                raise BadStream("snappy: the stream does not start with its identifier")
            elif ctype in (0x00, 0x01):
                # One chunk behind an identifier is a whole stream to cramjam,
                # which checks its checksum and its length.
                try:
                    block = self._decompress(_STREAM_ID + _chunk_head(ctype, n) + body)
                except self._error as exc:
                    raise BadStream(f"snappy: bad chunk: {exc}") from None
                decoded = bytes(block)
                if len(decoded) > _MAX_BLOCK:
                    raise BadStream("snappy: chunk decodes to more than 64 KiB")
                out.append(decoded)
            elif ctype < 0x80:
                raise BadStream(f"snappy: unsupported chunk type {ctype:#x}")
            # 0x80-0xfe: padding and skippable chunks
        del buf[:pos]
        return b"".join(out)


def _chunk_head(ctype: int, n: int) -> bytes:
    """A snappy chunk header: type and 24-bit little-endian length."""
    return bytes((ctype,)) + n.to_bytes(3, "little")


__all__ = ["Encoder", "deflate_codec", "snappy_available", "snappy_codec"]
