"""The raw baseline: plain Python writing and reading the queue's record format.

Each record is a 4-byte big-endian signed length and the payload, exactly as
go-diskqueue and aiodiskqueue store it. Records are framed into a buffer and
written with one ``os.write`` per 1 MiB batch, optionally followed by one
``os.fdatasync`` per batch. Reading takes 1 MiB ``os.read`` chunks and slices
the records out into ``bytes`` objects. No event loop, no thread, no meta file,
no recovery: this is the ceiling for any Python implementation of the format.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence

BATCH_BYTES = 1 << 20
_LEN = struct.Struct(">i")


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_records(path: str, payloads: Sequence[bytes], *, sync: bool,
                  batch_bytes: int = BATCH_BYTES) -> float:
    """Append ``payloads`` as length-prefixed records to ``path``; return the seconds taken.

    One ``os.write`` per ``batch_bytes`` of framed records; with ``sync=True``
    each write is followed by ``os.fdatasync``. The file is closed outside the
    timed section.

    Raises OSError if the file cannot be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pack = _LEN.pack
        buf = bytearray()
        t0 = time.perf_counter()
        for p in payloads:
            buf += pack(len(p))
            buf += p
            if len(buf) >= batch_bytes:
                _write_all(fd, buf)
                if sync:
                    os.fdatasync(fd)
                buf.clear()
        if buf:
            _write_all(fd, buf)
            if sync:
                os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def read_records(path: str, *, chunk_bytes: int = BATCH_BYTES,
                 sink: Callable[[list[bytes]], None] | None = None) -> tuple[list[bytes], float]:
    """Read every record of ``path`` in ``chunk_bytes`` chunks; return them and the seconds taken.

    With ``sink``, the records of each chunk go to it instead, and the list returned
    is empty: nothing is kept, as in a consumer that handles each message.

    Raises OSError if the file cannot be read, ValueError on a negative length
    or a torn record at the end of the file.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        out: list[bytes] = []
        append = out.append
        unpack_from = _LEN.unpack_from
        rest = b""
        t0 = time.perf_counter()
        while True:
            chunk = os.read(fd, chunk_bytes)
            if not chunk:
                break
            data = rest + chunk if rest else chunk
            pos, end = 0, len(data)
            while pos + 4 <= end:
                (n,) = unpack_from(data, pos)
                if n < 0:
                    raise ValueError(f"{path}: negative record length {n} at offset {pos}")
                if pos + 4 + n > end:
                    break
                append(data[pos + 4:pos + 4 + n])
                pos += 4 + n
            rest = data[pos:]
            if sink is not None:
                sink(out)
                out.clear()
        elapsed = time.perf_counter() - t0
        if rest:
            raise ValueError(f"{path}: {len(rest)} bytes of a torn record at the end")
        return out, elapsed
    finally:
        os.close(fd)
