"""Record codec: pure functions over bytes, no I/O.

A record is a 4-byte big-endian *signed* int32 length N followed by N payload
bytes, exactly as go-diskqueue writes it. Files have no header and no padding.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import chain
from typing import Any, Final

HEADER: Final = struct.Struct(">i")
HEADER_SIZE: Final = 4

_pack = HEADER.pack
_unpack_from = HEADER.unpack_from


def frame(payloads: list[bytes], lens: list[int] | None = None) -> bytes:
    """Return the records for ``payloads`` concatenated into one buffer.

    ``lens`` are the payload lengths, when the caller has them already.
    """
    if lens is None:
        lens = list(map(len, payloads))
    return b"".join(chain.from_iterable(zip(map(_pack, lens), payloads, strict=True)))


class ParseResult:
    """What :func:`parse` found in a buffer.

    ``records`` are ``(payload, file_num, end_offset)`` triples, where
    ``end_offset`` is the file offset just past the record. ``stop`` is the offset
    (from ``base``) where parsing stopped. ``bad_length`` is the length field
    found at ``stop`` when it is outside the allowed range, else ``None``.
    """

    __slots__ = ("bad_length", "records", "stop")

    def __init__(self, records: list[tuple[bytes, int, int]], stop: int,
                 bad_length: int | None) -> None:
        self.records = records
        self.stop = stop
        self.bad_length = bad_length


#: ``split(buf, base, file_num, min_size, max_size, max_records, positions) -> (records,
#: stop, bad_length)``: a faster implementation of :func:`parse_py`'s rule.
Splitter = Callable[[bytes | memoryview, int, int, int, int, int, bool],
                    tuple[list[Any], int, int | None]]

_split: Splitter | None = None


def use_splitter(split: Splitter | None) -> None:
    """Make :func:`parse` use ``split`` (the native ``split_records``, installed by
    ``aiodiskqueue._core`` where it is built), or the Python loop again with None.

    ``split`` must follow :func:`split_py`'s rule exactly (a property test compares
    them on random, truncated and corrupt buffers).
    """
    global _split
    _split = split


def parse(
    buf: bytes | memoryview, base: int, file_num: int, min_size: int, max_size: int,
    max_records: int = -1
) -> ParseResult:
    """Parse whole records from ``buf``, which starts at file offset ``base``.

    Parsing stops at the first record that does not fit in ``buf`` (an
    incomplete tail: the caller decides whether more bytes may follow), at a
    length outside ``[min_size, max_size]`` (reported in ``bad_length``), or
    after ``max_records`` records when that is not negative. ``min_size`` must
    not be negative.
    """
    split = _split or split_py
    return ParseResult(*split(buf, base, file_num, min_size, max_size, max_records, True))


def parse_payloads(buf: bytes | memoryview, base: int, min_size: int,
                   max_size: int) -> tuple[list[bytes], int, int | None]:
    """:func:`parse` without positions: ``(payloads, stop, bad_length)``.

    The whole records found lie back to back from ``base`` to ``stop``, so their
    positions follow from the payloads' lengths: the read-ahead keeps that span
    instead of a position per message.
    """
    split = _split or split_py
    return split(buf, base, 0, min_size, max_size, -1, False)


def parse_py(
    buf: bytes | memoryview, base: int, file_num: int, min_size: int, max_size: int,
    max_records: int = -1
) -> ParseResult:
    """:func:`parse` in Python: what runs where the native module is not built or
    ``AIODISKQUEUE_PURE_PYTHON=1``."""
    return ParseResult(*split_py(buf, base, file_num, min_size, max_size, max_records, True))


def split_py(
    buf: bytes | memoryview, base: int, file_num: int, min_size: int, max_size: int,
    max_records: int = -1, positions: bool = True
) -> tuple[list[Any], int, int | None]:
    """The rule of :func:`parse`, in Python: ``(records, stop, bad_length)``, where the
    records are ``(payload, file_num, end_offset)``, or the payloads alone when
    ``positions`` is false."""
    if type(buf) is not bytes:
        buf = bytes(buf)  # payloads are bytes, never views of a buffer reused later
    records: list[Any] = []
    append = records.append
    unpack = _unpack_from
    h = HEADER_SIZE
    off = 0
    limit = len(buf) - h
    left = max_records
    while off <= limit and left != 0:
        (n,) = unpack(buf, off)
        if n < min_size or n > max_size:
            return records, base + off, n
        start = off + h
        off = start + n
        if off > limit + h:
            off = start - h
            break
        append((buf[start:off], file_num, base + off) if positions else buf[start:off])
        left -= 1
    return records, base + off, None
