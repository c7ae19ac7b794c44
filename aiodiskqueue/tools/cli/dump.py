"""``dump``: print a queue's messages without consuming them, in raw, hex, JSON or nsq form."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from ..._format import nsq
from ..follow import Follower, StoredMessage, iter_messages, iter_quarantined
from ..inspect import Problem
from .output import EXIT_OK, CliError
from .target import find_queue


def _text(data: bytes) -> tuple[str, str]:
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _nsq_fields(payload: bytes) -> dict[str, Any] | None:
    if len(payload) < nsq.HEADER_SIZE:
        return None
    ts, attempts, msg_id, raw = nsq.decode(payload)
    body, enc = _text(raw)
    secs, ns = divmod(ts, 10**9)  # integer maths: a float would round the nanoseconds
    when = dt.datetime.fromtimestamp(secs, tz=dt.UTC) + dt.timedelta(microseconds=ns // 1000)
    return {"id": msg_id.decode("ascii", "replace"), "timestamp_ns": ts,
            "timestamp": when.isoformat().replace("+00:00", "Z"), "attempts": attempts,
            "body": body, "encoding": enc}


def _emit(msg: StoredMessage, fmt: str, as_json: bool, out: IO[bytes]) -> None:
    p = msg.payload
    if fmt == "nsq":
        fields = _nsq_fields(p)
        where = {"index": msg.seq, "file": msg.file, "offset": msg.offset}
        if fields is None:
            line = json.dumps({**where, "error": f"{len(p)} bytes: too short for an nsq message"})
            if not as_json:
                line = (f"{msg.file}@{msg.offset}: {len(p)} bytes, too short for an nsq "
                        "message")
        elif as_json:
            line = json.dumps({**where, **fields}, separators=(",", ":"))
        else:
            body = fields["body"] if fields["encoding"] == "utf-8" else "base64:" + fields["body"]
            line = (f"{fields['id']} {fields['timestamp']} attempts={fields['attempts']} "
                    f"{body}")
        out.write(line.encode("utf-8", "backslashreplace") + b"\n")
    elif fmt == "json" or as_json:
        text, enc = _text(p)
        obj = {"index": msg.seq, "file": msg.file, "offset": msg.offset, "length": len(p),
               "payload": text, "encoding": enc}
        out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    elif fmt == "hex":
        out.write(f"{msg.seq}\t{msg.file}\t{msg.offset}\t{len(p)}\t{p.hex()}\n".encode())
    else:
        out.write(p + b"\n")


def cmd_dump(args: argparse.Namespace) -> int:
    """Print messages oldest unread first without consuming them; ``--follow`` waits for more."""
    lay = find_queue(args)
    out = sys.stdout.buffer
    skip = args.from_
    left = args.limit

    def on_problem(p: Problem) -> None:
        sys.stderr.write(f"aiodiskqueue: {p}\n")

    def take(msgs: Iterator[StoredMessage] | list[StoredMessage]) -> bool:
        """Print; return False once the limit is reached."""
        nonlocal skip, left
        raw = args.format == "raw" and not args.json
        write = out.write
        for m in msgs:
            if skip > 0:
                skip -= 1
                continue
            if left is not None:
                if left <= 0:
                    return False
                left -= 1
            if raw:
                write(m.payload)
                write(b"\n")
            else:
                _emit(m, args.format, args.json, out)
        out.flush()
        return left is None or left > 0

    if args.quarantined:
        if args.follow:
            raise CliError("--quarantined and --follow do not go together")
        take(iter_quarantined(lay, args.min_msg_size, args.max_msg_size))
        return EXIT_OK
    if not args.follow:
        take(iter_messages(lay, args.min_msg_size, args.max_msg_size, on_problem=on_problem))
        return EXIT_OK
    follower = Follower(lay, args.min_msg_size, args.max_msg_size)
    while True:
        more = take(follower.poll())
        for p in follower.problems:
            on_problem(p)
        follower.problems.clear()
        if not more:
            return EXIT_OK
        time.sleep(args.interval)
