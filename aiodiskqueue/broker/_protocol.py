"""NSQ TCP protocol V2 codec: frames, errors, names, IDENTIFY negotiation. Pure, no I/O.

Wire format (as nsqd speaks it):

* the client opens with the 4-byte magic ``b"  V2"``;
* a command is one line ``NAME[ PARAM...]\\n`` (a trailing ``\\r`` is dropped),
  followed for IDENTIFY, PUB, DPUB, MPUB and AUTH by a 4-byte big-endian
  signed length and that many body bytes;
* the server answers with frames: 4-byte size (of what follows), 4-byte frame
  type (0 response, 1 error, 2 message), then the data. A message frame's data
  is nsqd's message layout: 8-byte timestamp (ns), 2-byte attempts, 16-byte
  ASCII id, body.
"""

from __future__ import annotations

import re
import struct
from typing import Final

from .._format import nsq

MAGIC_V2: Final = b"  V2"

FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

OK: Final = b"OK"
HEARTBEAT: Final = b"_heartbeat_"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

MSG_ID_LENGTH: Final = 16
MESSAGE_HEADER_SIZE: Final = nsq.HEADER_SIZE

_I32: Final = struct.Struct(">i")
_FRAME_HEAD: Final = struct.Struct(">ii")
_MSG_HEAD: Final = struct.Struct(">ii" + nsq.FIELDS)  # size, frame type, nsqd message header

_NAME_RE: Final = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")

VERSION: Final = "1.3.0-aiodiskqueue"
"""The version reported to clients (IDENTIFY, /info, /stats); NSQ protocol V2."""


class ClientError(Exception):
    """An NSQ error answered to the client as an error frame: ``CODE description``.

    ``fatal`` errors close the connection after the frame is sent, as nsqd's
    ``FatalClientErr`` does; the others (E_FIN_FAILED, E_REQ_FAILED,
    E_TOUCH_FAILED) leave it open.
    """

    def __init__(self, code: str, description: str, *, fatal: bool = True) -> None:
        super().__init__(f"{code} {description}")
        self.code = code
        self.description = description
        self.fatal = fatal

    def frame(self) -> bytes:
        """The error frame to send (a parameter's bytes as the client sent them, see
        :func:`raw_param`)."""
        return frame(FRAME_ERROR,
                     f"{self.code} {self.description}".encode("utf-8", "surrogateescape"))


def frame(frame_type: int, data: bytes) -> bytes:
    """Return one framed response: size, frame type, data."""
    return _FRAME_HEAD.pack(len(data) + 4, frame_type) + data


def message_frame(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """Return a message frame for a delivery (``attempts`` is clamped to 65535)."""
    return message_frame_head(timestamp, attempts, msg_id, len(body)) + body


def message_frame_head(timestamp: int, attempts: int, msg_id: bytes, body_size: int) -> bytes:
    """The part of a message frame before its body (``attempts`` is clamped to 65535).

    Sent followed by the body, it is :func:`message_frame` without copying the body.
    """
    return _MSG_HEAD.pack(body_size + 4 + nsq.HEADER_SIZE, FRAME_MESSAGE, timestamp,
                          min(attempts, nsq.MAX_ATTEMPTS), msg_id)


def read_int32(data: bytes, offset: int = 0) -> int:
    """Decode a big-endian signed 32-bit integer at ``offset``."""
    return int(_I32.unpack_from(data, offset)[0])


def pack_int32(value: int) -> bytes:
    """Encode a big-endian signed 32-bit integer."""
    return _I32.pack(value)


def is_valid_name(name: str) -> bool:
    """True for a valid topic or channel name: 1-64 of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``.

    Names that are only dots are refused too: they would be ``.``/``..`` on disk.
    """
    if not 1 <= len(name) <= 64 or _NAME_RE.match(name) is None:
        return False
    return name.split("#", 1)[0].strip(".") != ""


def decode_name(raw: bytes) -> str | None:
    """Return ``raw`` as a valid topic or channel name, or None if it is not one."""
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return name if is_valid_name(name) else None


def parse_int(raw: bytes, *, signed: bool = True) -> int | None:
    """Parse a base-10 integer parameter; None if malformed.

    A leading ``-`` is accepted only if ``signed`` (nsqd parses RDY's count as a
    signed number but REQ's and DPUB's timeouts as digits only).
    """
    if not raw or len(raw) > 19:
        return None
    digits = raw[1:] if signed and raw[:1] == b"-" else raw
    if not digits.isdigit():
        return None
    return int(raw)


_U64: Final = 1 << 64


def base10(raw: bytes) -> int | None:
    """A command's number as nsqd's ``ByteToBase10`` reads it: digits only (None for
    anything else), the empty parameter is 0, and the value wraps at 2**64 (Go's
    uint64) however many digits there are."""
    if not raw:
        return 0
    if not raw.isdigit() or not raw.isascii():
        return None
    n = 0
    for i in range(0, len(raw), 18):  # Python refuses to convert > 4,300 digits at once
        chunk = raw[i:i + 18]
        n = (n * 10 ** len(chunk) + int(chunk)) % _U64
    return n


def int64(value: int) -> int:
    """``value`` wrapped to Go's int64, as a conversion or an overflowing product does."""
    value %= _U64
    return value - _U64 if value >= 1 << 63 else value


def check_message_id(raw: bytes) -> bytes:
    """Validate a message id parameter (exactly 16 bytes).

    Raises ClientError(E_INVALID) otherwise.
    """
    if len(raw) != MSG_ID_LENGTH:
        raise ClientError("E_INVALID", "invalid message ID")
    return raw


def raw_param(raw: bytes) -> str:
    """A parameter for an error message as nsqd's ``%s`` writes it: its bytes unchanged.

    Bytes that are not UTF-8 come back as surrogates, which
    :meth:`ClientError.frame` turns back into the same bytes.
    """
    return raw.decode("utf-8", "surrogateescape")


_GO_ESCAPES: Final = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                      "\t": "\\t", "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def go_quote(raw: bytes | str) -> str:
    """A parameter as nsqd's ``%q`` writes it (Go's ``strconv.Quote``).

    Printable characters stay, the usual backslash escapes, ``\\xNN`` for
    other ASCII controls and for bytes that are not UTF-8, ``\\uNNNN`` /
    ``\\UNNNNNNNN`` for other characters that are not printable.
    """
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    out = ['"']
    for ch in text:
        o = ord(ch)
        esc = _GO_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def parse_mpub(
    body: bytes, max_msg_size: int, *, code_prefix: str = "MPUB", max_body_size: int = 0
) -> list[bytes]:
    """Split an MPUB body (``count``, then ``count`` x (size, bytes)) into messages.

    A count above what ``max_body_size`` could hold (5 bytes a message, as
    nsqd reckons) is refused at once. Raises ClientError with nsqd's codes:
    E_BAD_BODY for a bad count or trailing garbage, E_BAD_MESSAGE for a bad,
    oversize or truncated message.
    """
    split = _split_mpub(body, max_msg_size, code_prefix, max_body_size, strict=True)
    assert split is not None  # strict: incomplete raises
    out, end = split
    if end != len(body):
        raise ClientError("E_BAD_BODY",
                          f"{code_prefix} body has {len(body) - end} bytes after {len(out)} "
                          "messages")
    return out


def split_mpub(body: bytes, max_msg_size: int, max_body_size: int
               ) -> tuple[list[bytes], int] | None:
    """The messages at the start of ``body`` and where they end, as nsqd reads an MPUB
    from the stream: what follows them is not part of it; None if they run past
    ``body`` (nsqd reads on). Raises ClientError for a bad count or message, as
    :func:`parse_mpub`.
    """
    return _split_mpub(body, max_msg_size, "MPUB", max_body_size, strict=False)


def check_mpub_count(count: int, max_body_size: int, code_prefix: str = "MPUB") -> None:
    """nsqd's bound on an MPUB's message count. Raises ClientError(E_BAD_BODY)."""
    if count <= 0 or (max_body_size and count > (max_body_size - 4) // 5):
        raise ClientError("E_BAD_BODY", f"{code_prefix} invalid message count {count}")


def check_mpub_size(i: int, size: int, max_msg_size: int, code_prefix: str = "MPUB") -> None:
    """nsqd's checks of an MPUB message's size. Raises ClientError(E_BAD_MESSAGE)."""
    if size <= 0:
        raise ClientError("E_BAD_MESSAGE", f"{code_prefix} invalid message({i}) body size {size}")
    if size > max_msg_size:
        raise ClientError("E_BAD_MESSAGE",
                          f"{code_prefix} message too big {size} > {max_msg_size}")


def _split_mpub(body: bytes, max_msg_size: int, code_prefix: str, max_body_size: int, *,
                strict: bool) -> tuple[list[bytes], int] | None:
    if len(body) < 4:
        if not strict:
            return None
        raise ClientError("E_BAD_BODY", f"{code_prefix} failed to read message count")
    count = read_int32(body)
    check_mpub_count(count, max_body_size, code_prefix)
    out: list[bytes] = []
    off = 4
    end = len(body)
    for i in range(count):
        if off + 4 > end:
            if not strict:
                return None
            raise ClientError("E_BAD_MESSAGE",
                              f"{code_prefix} failed to read message({i}) body size")
        size = read_int32(body, off)
        off += 4
        check_mpub_size(i, size, max_msg_size, code_prefix)
        if off + size > end:
            if not strict:
                return None
            raise ClientError("E_BAD_MESSAGE", f"{code_prefix} failed to read message body")
        out.append(body[off : off + size])
        off += size
    return out, off


__all__ = [
    "CLOSE_WAIT",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "MAGIC_V2",
    "OK",
    "ClientError",
    "base10",
    "check_message_id",
    "check_mpub_count",
    "check_mpub_size",
    "decode_name",
    "frame",
    "go_quote",
    "int64",
    "is_valid_name",
    "message_frame",
    "message_frame_head",
    "pack_int32",
    "parse_int",
    "parse_mpub",
    "raw_param",
    "read_int32",
    "split_mpub",
]
