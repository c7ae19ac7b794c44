"""The NSQ protocol V2 codec of the broker: frames, names, MPUB bodies, IDENTIFY."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from aiodiskqueue.broker._identify import Limits, negotiate
from aiodiskqueue.broker._options import BrokerOptions
from aiodiskqueue.broker._protocol import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    ClientError,
    base10,
    check_message_id,
    decode_name,
    frame,
    go_quote,
    int64,
    is_valid_name,
    message_frame,
    parse_int,
    parse_mpub,
    raw_param,
)


def test_response_frame_layout() -> None:
    # size (4) counts the frame type (4) and the data: 4 + 2 = 6.
    assert frame(FRAME_RESPONSE, b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def test_error_frame_from_client_error() -> None:
    err = ClientError("E_BAD_TOPIC", 'PUB topic name "a b" is not valid')
    data = err.frame()
    size, ftype = struct.unpack(">ii", data[:8])
    assert (size, ftype) == (len(data) - 4, FRAME_ERROR)
    assert data[8:] == b'E_BAD_TOPIC PUB topic name "a b" is not valid'
    assert err.fatal


def test_message_frame_is_nsqd_message_layout() -> None:
    data = message_frame(1_700_000_000_123_456_789, 3, b"0123456789abcdef", b"hello")
    size, ftype, ts, attempts = struct.unpack(">iiqH", data[:18])
    assert size == len(data) - 4 == 4 + 26 + 5
    assert ftype == FRAME_MESSAGE
    assert ts == 1_700_000_000_123_456_789
    assert attempts == 3
    assert data[18:34] == b"0123456789abcdef"
    assert data[34:] == b"hello"


def test_message_frame_clamps_attempts_to_uint16() -> None:
    data = message_frame(0, 70_000, b"0" * 16, b"x")
    assert struct.unpack(">H", data[16:18])[0] == 0xFFFF


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("events", True),
        ("a", True),
        ("a.b_c-D9", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("has space", False),
        ("slash/no", False),
        ("colon:no", False),
        ("tmp#ephemeral", True),
        ("#ephemeral", False),
        ("..", False),
        ("utf8-é", False),
    ],
    ids=lambda v: repr(v) if isinstance(v, str) and len(v) < 20 else None,
)
def test_name_validation(name: str, ok: bool) -> None:
    assert is_valid_name(name) is ok


@pytest.mark.parametrize("name", ["workers", "x.dead", "x.dead#ephemeral", "dead", "x.deadline"])
def test_channel_names_ending_in_dead_are_valid_as_in_nsqd(name: str) -> None:
    # Dead letters live in a subdirectory: no valid name is reserved for them.
    assert is_valid_name(name)
    assert decode_name(name.encode()) == name


def test_decode_name_rejects_non_ascii_bytes() -> None:
    assert decode_name(b"ok_topic") == "ok_topic"
    assert decode_name(b"\xff\xfe") is None


@pytest.mark.parametrize(
    ("raw", "value"),
    [(b"0", 0), (b"2500", 2500), (b"-1", -1), (b"", None), (b"12a", None), (b"-", None),
     (b"1" * 30, None)],
    ids=["zero", "2500", "minus-one", "empty", "junk", "bare-minus", "too-long"],
)
def test_parse_int(raw: bytes, value: int | None) -> None:
    assert parse_int(raw) == value


def test_parse_int_unsigned_refuses_a_sign() -> None:
    assert parse_int(b"-5", signed=False) is None
    assert parse_int(b"5", signed=False) == 5


def test_message_id_must_be_16_bytes() -> None:
    assert check_message_id(b"0123456789abcdef") == b"0123456789abcdef"
    with pytest.raises(ClientError) as ei:
        check_message_id(b"short")
    assert ei.value.code == "E_INVALID"


def _mpub(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)


def test_parse_mpub_round_trip() -> None:
    assert parse_mpub(_mpub(b"a", b"bc", b"def"), 10) == [b"a", b"bc", b"def"]


@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        (b"\x00\x00", "E_BAD_BODY", "MPUB failed to read message count"),
        (struct.pack(">i", 0), "E_BAD_BODY", "MPUB invalid message count 0"),
        (struct.pack(">ii", 1, 0), "E_BAD_MESSAGE", "MPUB invalid message(0) body size 0"),
        (struct.pack(">ii", 1, 11) + b"x" * 11, "E_BAD_MESSAGE", "MPUB message too big 11 > 10"),
        (struct.pack(">ii", 1, 5) + b"abc", "E_BAD_MESSAGE", "MPUB failed to read message body"),
        (struct.pack(">i", 2) + struct.pack(">i", 1) + b"a", "E_BAD_MESSAGE",
         "MPUB failed to read message(1) body size"),
        (_mpub(b"a") + b"junk", "E_BAD_BODY", "MPUB body has 4 bytes after 1 messages"),
    ],
    ids=["short-count", "zero-count", "zero-size", "too-big", "truncated", "missing-size",
         "trailing-bytes"],
)
def test_parse_mpub_errors(body: bytes, code: str, text: str) -> None:
    with pytest.raises(ClientError) as ei:
        parse_mpub(body, 10)
    assert (ei.value.code, ei.value.description) == (code, text)


def test_identify_without_negotiation_answers_ok() -> None:
    cfg, resp = negotiate(b'{"client_id": "c1", "hostname": "h", "heartbeat_interval": 5000}',
                          Limits())
    assert resp == b"OK"
    assert (cfg.client_id, cfg.hostname, cfg.heartbeat_interval_ms) == ("c1", "h", 5000)
    assert cfg.msg_timeout_ms == 60_000


def test_identify_feature_negotiation_json() -> None:
    limits = BrokerOptions(msg_timeout=30.0, max_rdy_count=100).limits()
    cfg, resp = negotiate(
        json.dumps({"feature_negotiation": True, "msg_timeout": 2000, "tls_v1": True,
                    "snappy": True, "heartbeat_interval": -1}).encode(),
        limits,
    )
    data = json.loads(resp)
    assert data["msg_timeout"] == 2000
    assert data["max_rdy_count"] == 100
    assert data["max_msg_timeout"] == 15 * 60_000
    # No certificate: no TLS. Snappy is on by default, as in nsqd.
    assert data["tls_v1"] is False and data["snappy"] is True and data["deflate"] is False
    assert (cfg.tls_v1, cfg.snappy, cfg.deflate) == (False, True, False)
    assert data["auth_required"] is False
    assert cfg.msg_timeout_ms == 2000
    assert cfg.heartbeat_interval_ms == 0  # -1 disables heartbeats
    assert data["heartbeat_interval"] == -1


@pytest.mark.parametrize(
    ("asked", "max_level", "enabled", "granted", "level"),
    [({"deflate": True}, 6, True, True, 6),
     ({"deflate": True, "deflate_level": 3}, 6, True, True, 3),
     ({"deflate": True, "deflate_level": 9}, 5, True, True, 5),
     ({"deflate_level": 9}, 4, True, False, 4),
     ({"deflate": True}, 6, False, False, 6)],
    ids=["default-level", "asked-level", "capped", "not-asked", "disabled"],
)
def test_identify_deflate_level_as_nsqd(asked: dict[str, object], max_level: int, enabled: bool,
                                        granted: bool, level: int) -> None:
    limits = BrokerOptions(max_deflate_level=max_level, deflate=enabled).limits()
    cfg, resp = negotiate(json.dumps({"feature_negotiation": True, **asked}).encode(), limits)
    data = json.loads(resp)
    assert (data["deflate"], data["deflate_level"], data["max_deflate_level"]) == (
        granted, level, max_level)
    assert (cfg.deflate, cfg.deflate_level) == (granted, level)


def test_identify_both_compressions_is_e_identify_failed() -> None:
    with pytest.raises(ClientError) as err:
        negotiate(b'{"feature_negotiation": true, "deflate": true, "snappy": true}',
                  BrokerOptions().limits())
    assert err.value.frame()[8:] == (
        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    assert err.value.fatal


def test_identify_upgrades_only_with_feature_negotiation() -> None:
    cfg, resp = negotiate(b'{"deflate": true, "tls_v1": true}',
                          replace(BrokerOptions().limits(), tls=True))
    assert resp == b"OK" and not (cfg.deflate or cfg.tls_v1 or cfg.snappy)


def test_identify_defaults_when_zero() -> None:
    limits = BrokerOptions(msg_timeout=30.0, heartbeat_interval=10.0).limits()
    cfg, _ = negotiate(b'{"msg_timeout": 0, "heartbeat_interval": 0}', limits)
    assert (cfg.msg_timeout_ms, cfg.heartbeat_interval_ms) == (30_000, 10_000)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"not json", "IDENTIFY failed to decode JSON body"),
        (b"[1, 2]", "IDENTIFY failed to decode JSON body"),
        (b'{"heartbeat_interval": 999}', "IDENTIFY heartbeat interval (999) is invalid"),
        (b'{"heartbeat_interval": 60001}', "IDENTIFY heartbeat interval (60001) is invalid"),
        (b'{"msg_timeout": 500}', "IDENTIFY msg timeout (500) is invalid"),
        (b'{"msg_timeout": 900001}', "IDENTIFY msg timeout (900001) is invalid"),
        (b'{"msg_timeout": "soon"}', "IDENTIFY failed to decode JSON body"),
        (b'{"sample_rate": 100}', "IDENTIFY sample rate (100) is invalid"),
    ],
    ids=["not-json", "not-object", "heartbeat-low", "heartbeat-high", "timeout-low",
         "timeout-high", "timeout-type", "sample-rate"],
)
def test_identify_errors(body: bytes, text: str) -> None:
    with pytest.raises(ClientError) as ei:
        negotiate(body, Limits())
    assert (ei.value.code, ei.value.description, ei.value.fatal) == ("E_BAD_BODY", text, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"msg_timeout": 0}, "msg_timeout must be a finite number > 0, got 0"),
        ({"msg_timeout": 20.0, "max_msg_timeout": 10.0},
         "msg_timeout must be <= max_msg_timeout, got 20.0 > 10.0"),
        ({"max_attempts": -1}, "max_attempts must be in [0, 65535], got -1"),
        ({"max_rdy_count": 0}, "max_rdy_count must be >= 1, got 0"),
    ],
    ids=["zero-timeout", "timeout-over-max", "negative-attempts", "zero-rdy"],
)
def test_options_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as ei:
        BrokerOptions(**kwargs)  # type: ignore[arg-type]
    assert str(ei.value) == message


def test_identify_msg_timeout_not_honoured_reports_server_value() -> None:
    limits = BrokerOptions(msg_timeout=30.0).limits()
    cfg, resp = negotiate(b'{"feature_negotiation": true, "msg_timeout": 2000}', limits,
                          client_msg_timeout=False)
    assert json.loads(resp)["msg_timeout"] == 30_000
    assert cfg.msg_timeout_ms == 30_000
    with pytest.raises(ClientError):  # still validated
        negotiate(b'{"msg_timeout": 10}', limits, client_msg_timeout=False)


def test_command_line_rejects_a_bad_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiodiskqueue.broker.__main__ import main

    assert main(["--data-dir", str(tmp_path), "--msg-timeout", "0"]) == 2
    assert "msg_timeout must be a finite number > 0, got 0.0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing was created


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [(b"a b", '"a b"'), (b'q"\\', '"q\\"\\\\"'), (b"\n\t\x00\x7f", '"\\n\\t\\x00\\x7f"'),
     (b"\xff\xfe", '"\\xff\\xfe"'), ("é".encode(), '"é"'), ("\u2028".encode(), '"\\u2028"'),
     ("\U000e0001".encode(), '"\\U000e0001"')],
    ids=["plain", "quote-backslash", "controls", "not-utf8", "printable-unicode",
         "line-separator", "astral-format"],
)
def test_go_quote_writes_what_go_strconv_quote_writes(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


def test_raw_param_keeps_every_byte_in_the_error_frame() -> None:
    cmd = b"B\xffD"
    err = ClientError("E_INVALID", "invalid command " + raw_param(cmd))
    assert err.frame()[8:] == b"E_INVALID invalid command B\xffD"


@pytest.mark.parametrize(
    ("raw", "value"),
    [(b"0", 0), (b"", 0), (b"2500", 2500), (b"-1", None), (b"+1", None), (b"1 ", None),
     (b"\xd9\xa3", None), (b"18446744073709551617", 1), (b"9" * 5000, (10**5000 - 1) % 2**64)],
    ids=["zero", "empty-is-zero", "2500", "sign", "plus", "space", "arabic-digit",
         "wraps-at-2-64", "5000-digits"],
)
def test_base10_reads_as_nsqds_byte_to_base10(raw: bytes, value: int | None) -> None:
    assert base10(raw) == value


def test_int64_wraps_as_go() -> None:
    assert int64(2**63 - 1) == 2**63 - 1
    assert int64(2**63) == -(2**63)
    assert int64(2**64 - 1) == -1
    assert int64(2**64 + 5) == 5
