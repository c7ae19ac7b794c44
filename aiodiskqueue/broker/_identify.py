"""IDENTIFY: the client's JSON body judged as nsqd 1.3.0 judges it, and the answer.

nsqd decodes the body with Go's ``encoding/json`` into a fixed struct, so
this module follows Go's rules rather than Python's ``json``: a body of
``null`` is an empty identify; a field with the wrong JSON type (a string or
a float for an integer, a number for a string or a bool, an integer out of
range) fails the whole body; ``NaN``/``Infinity`` are not JSON; field names
match case-insensitively, the last one wins; unknown fields are skipped
however deeply they nest, up to Go's 10,000 levels. Every failure is a fatal
``E_BAD_BODY`` with nsqd's wording. The parser is iterative, so no body
reaches Python's recursion limit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # not in typeshed
from typing import Any, Final

from ._protocol import OK, VERSION, ClientError

MAX_NESTING: Final = 10_000
"""Go's encoding/json nesting limit (objects and arrays)."""

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS: Final = {"true": True, "false": False, "null": None}


class _Nested:
    """An array or object value (below the top level: never a valid IDENTIFY field)."""


class _Float(str):
    """A JSON number with a fraction or an exponent (never a valid Go int)."""


class _Int(str):
    """A JSON integer literal, kept as text until its field's range is known."""


_NESTED: Final = _Nested()


def _skip(text: str, pos: int) -> int:
    """The position after the JSON whitespace at ``pos``."""
    m = _WS.match(text, pos)
    return m.end() if m is not None else pos
_BAD_JSON: Final = "IDENTIFY failed to decode JSON body"

Scalar = str | _Int | _Float | bool | None | _Nested


def _bad() -> ClientError:
    return ClientError("E_BAD_BODY", _BAD_JSON)


def parse_top(text: str) -> list[tuple[str, Scalar]] | Scalar:
    """Validate ``text`` as JSON; return the top-level object's pairs in order, or the scalar.

    Containers below the top level come back as a marker, their content
    validated but not kept. Raises ClientError(E_BAD_BODY) for invalid JSON
    or nesting deeper than :data:`MAX_NESTING`.
    """
    n = len(text)
    pos = _skip(text, 0)
    stack: list[str] = []
    pairs: list[tuple[str, Scalar]] | None = None
    key: str | None = None
    top: Any = None
    while True:
        # ---- one value at pos
        if pos >= n:
            raise _bad()
        c = text[pos]
        value: Scalar
        if c in "{[":
            if len(stack) >= MAX_NESTING:
                raise _bad()
            stack.append(c)
            if len(stack) == 1 and c == "{":
                pairs = []
            pos = _skip(text, pos + 1)
            close = "}" if c == "{" else "]"
            if pos < n and text[pos] == close:
                stack.pop()
                pos += 1
                value = _NESTED
            elif c == "{":
                pos, k = _key(text, pos, len(stack) == 1)
                if k is not None:
                    key = k
                continue
            else:
                continue
        elif c == '"':
            try:
                value, pos = scanstring(text, pos + 1, True)
            except ValueError:
                raise _bad() from None
        elif c == "-" or c.isdigit():
            m = _NUMBER.match(text, pos)
            if m is None:
                raise _bad()
            value = _Float(m.group()) if m.group(1) or m.group(2) else _Int(m.group())
            pos = m.end()
        else:
            for word, lit in _LITERALS.items():
                if text.startswith(word, pos):
                    value, pos = lit, pos + len(word)
                    break
            else:
                raise _bad()
        # ---- a value is complete: close what it completes, find the next one
        while True:
            depth = len(stack)
            if depth == 0:
                top = value
                if _skip(text, pos) != n:
                    raise _bad()
                return pairs if pairs is not None else top
            if depth == 1 and stack[0] == "{" and key is not None and pairs is not None:
                pairs.append((key, value))
                key = None
            pos = _skip(text, pos)
            if pos >= n:
                raise _bad()
            c = text[pos]
            if c == ",":
                pos = _skip(text, pos + 1)
                if stack[-1] == "{":
                    pos, k = _key(text, pos, depth == 1)
                    if k is not None:
                        key = k
                break
            if c == ("}" if stack[-1] == "{" else "]"):
                stack.pop()
                pos += 1
                value = _NESTED
                continue
            raise _bad()


def _key(text: str, pos: int, keep: bool) -> tuple[int, str | None]:
    """Read ``"key" :`` at ``pos``; return the position of the value and the key (if kept)."""
    if pos >= len(text) or text[pos] != '"':
        raise _bad()
    try:
        key, pos = scanstring(text, pos + 1, True)
    except ValueError:
        raise _bad() from None
    pos = _skip(text, pos)
    if pos >= len(text) or text[pos] != ":":
        raise _bad()
    pos = _skip(text, pos + 1)
    return pos, key if keep else None


# ---------------------------------------------------------------------- nsqd's struct

_INT_FIELDS: Final = {"heartbeat_interval": 63, "output_buffer_size": 63,
                      "output_buffer_timeout": 63, "deflate_level": 63, "msg_timeout": 63,
                      "sample_rate": 31}
_STR_FIELDS: Final = ("client_id", "hostname", "user_agent")
_BOOL_FIELDS: Final = ("feature_negotiation", "tls_v1", "deflate", "snappy")


def decode_identify(body: bytes) -> dict[str, Any]:
    """nsqd's identify struct from ``body``: every field present, Go's zero value if absent.

    Raises ClientError(E_BAD_BODY) where Go's ``json.Unmarshal`` fails.
    """
    # Go keeps bytes that are not UTF-8 (as U+FFFD) rather than failing.
    try:
        parsed = parse_top(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError, MemoryError):  # never an error the client cannot see
        raise _bad() from None
    out: dict[str, Any] = dict.fromkeys(_INT_FIELDS, 0)
    out.update(dict.fromkeys(_STR_FIELDS, ""))
    out.update(dict.fromkeys(_BOOL_FIELDS, False))
    if parsed is None:
        return out
    if not isinstance(parsed, list):
        raise _bad()  # a string, number, bool or array is not an object
    fields = {k.lower(): k for k in out}
    failed = False
    for raw_key, value in parsed:
        name = fields.get(raw_key) or fields.get(raw_key.lower())
        if name is None or value is None:
            continue  # unknown field, or null: left as it is
        if name in _INT_FIELDS:
            bits = _INT_FIELDS[name]
            # The length first: Python refuses to convert a string of more than
            # 4,300 digits, and no 64-bit integer has more than 20 characters.
            if (type(value) is _Int and len(value) <= 20
                    and -(1 << bits) <= int(value) < (1 << bits)):
                out[name] = int(value)
                continue
        elif name in _STR_FIELDS:
            if type(value) is str:
                out[name] = value
                continue
        elif isinstance(value, bool):
            out[name] = value
            continue
        failed = True  # Go carries on with the other fields, then fails the body
    if failed:
        raise _bad()
    return out


# ---------------------------------------------------------------------- negotiation


@dataclass(frozen=True, slots=True)
class Limits:
    """Server-side limits that IDENTIFY negotiates against (all times in ms), nsqd's defaults."""

    msg_timeout_ms: int = 60_000
    max_msg_timeout_ms: int = 15 * 60_000
    heartbeat_interval_ms: int = 30_000
    max_heartbeat_interval_ms: int = 60_000
    max_rdy_count: int = 2500
    output_buffer_size: int = 16 * 1024
    max_output_buffer_size: int = 64 * 1024
    output_buffer_timeout_ms: int = 250
    min_output_buffer_timeout_ms: int = 25
    max_output_buffer_timeout_ms: int = 30_000
    max_deflate_level: int = 6
    tls: bool = False
    """A certificate is configured: a client may ask for ``tls_v1``."""
    deflate: bool = False
    snappy: bool = False
    auth: bool = False
    """Auth servers are configured (``auth_required`` in the answer)."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What a client negotiated with IDENTIFY (or the defaults without it)."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    heartbeat_interval_ms: int = 30_000
    """0 means heartbeats disabled (the client sent -1)."""
    msg_timeout_ms: int = 60_000
    feature_negotiation: bool = False
    sample_rate: int = 0
    output_buffer_size: int = 16 * 1024
    output_buffer_timeout_ms: int = 250
    tls_v1: bool = False
    """Upgrade to TLS after the answer."""
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False


def _invalid(what: str, value: int) -> ClientError:
    return ClientError("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")


def negotiate(
    body: bytes, limits: Limits, *, client_msg_timeout: bool = True
) -> tuple[ClientConfig, bytes]:
    """Apply an IDENTIFY body; return the client's config and the response payload.

    The response is ``OK`` unless the client asked for ``feature_negotiation``,
    then a JSON object with nsqd's fields (``max_rdy_count``, ``version``,
    ``max_msg_timeout``, ``msg_timeout``, ``output_buffer_size``, ...). TLS,
    snappy and deflate are granted when asked for and allowed by ``limits``
    (only with feature negotiation, as nsqd); the caller then upgrades the
    stream: TLS first, then the compression. With ``client_msg_timeout=False`` a valid
    ``msg_timeout`` is accepted but the server's applies, and the response
    says so.

    Raises ClientError(E_BAD_BODY) for a body nsqd refuses, with nsqd's wording,
    ClientError(E_IDENTIFY_FAILED) for both deflate and snappy.
    """
    d = decode_identify(body)

    hb = d["heartbeat_interval"]
    if hb == -1:
        heartbeat = 0
    elif hb == 0:
        heartbeat = limits.heartbeat_interval_ms
    elif 1000 <= hb <= limits.max_heartbeat_interval_ms:
        heartbeat = hb
    else:
        raise _invalid("heartbeat interval", hb)

    obt = d["output_buffer_timeout"]
    buf_timeout = limits.output_buffer_timeout_ms
    if obt == -1:
        buf_timeout = 0
    elif obt != 0:
        if not limits.min_output_buffer_timeout_ms <= obt <= limits.max_output_buffer_timeout_ms:
            raise _invalid("output buffer timeout", obt)
        buf_timeout = obt
    obs = d["output_buffer_size"]
    buf_size = limits.output_buffer_size
    if obs == -1:
        buf_size, buf_timeout = 1, 0  # no buffering
    elif obs != 0:
        if not 64 <= obs <= limits.max_output_buffer_size:
            raise _invalid("output buffer size", obs)
        buf_size = obs

    sample = d["sample_rate"]
    if not 0 <= sample <= 99:
        raise _invalid("sample rate", sample)

    mt = d["msg_timeout"]
    if mt == 0 or (1000 <= mt <= limits.max_msg_timeout_ms and not client_msg_timeout):
        msg_timeout = limits.msg_timeout_ms
    elif 1000 <= mt <= limits.max_msg_timeout_ms:
        msg_timeout = mt
    else:
        raise _invalid("msg timeout", mt)

    tls_v1 = deflate = snappy = False
    level = 6
    if d["feature_negotiation"]:
        tls_v1 = limits.tls and d["tls_v1"]
        deflate = limits.deflate and d["deflate"]
        if deflate and d["deflate_level"] > 0:
            level = d["deflate_level"]
        level = min(level, limits.max_deflate_level)
        snappy = limits.snappy and d["snappy"]
        if deflate and snappy:
            raise ClientError("E_IDENTIFY_FAILED",
                              "cannot enable both deflate and snappy compression")
    cfg = ClientConfig(
        tls_v1=tls_v1,
        deflate=deflate,
        deflate_level=level,
        snappy=snappy,
        client_id=d["client_id"],
        hostname=d["hostname"],
        user_agent=d["user_agent"],
        heartbeat_interval_ms=heartbeat,
        msg_timeout_ms=msg_timeout,
        feature_negotiation=d["feature_negotiation"],
        sample_rate=sample,
        output_buffer_size=buf_size,
        output_buffer_timeout_ms=buf_timeout,
    )
    if not cfg.feature_negotiation:
        return cfg, OK
    resp = {
        "max_rdy_count": limits.max_rdy_count,
        "version": VERSION,
        "max_msg_timeout": limits.max_msg_timeout_ms,
        "msg_timeout": msg_timeout,
        # Not in nsqd's answer; clients ignore unknown fields, and it tells the
        # client which interval (ms, -1 = disabled) was applied.
        "heartbeat_interval": heartbeat if heartbeat > 0 else -1,
        "tls_v1": tls_v1,
        "deflate": deflate,
        # For a client that gets no deflate: nsqd's default level, capped.
        "deflate_level": level,
        "max_deflate_level": limits.max_deflate_level,
        "snappy": snappy,
        "sample_rate": sample,
        "auth_required": limits.auth,
        "output_buffer_size": buf_size,
        "output_buffer_timeout": buf_timeout,
    }
    return cfg, json.dumps(resp, separators=(",", ":")).encode()


__all__ = ["MAX_NESTING", "ClientConfig", "Limits", "decode_identify", "negotiate", "parse_top"]
