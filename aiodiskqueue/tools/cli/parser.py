"""The argument parser of the ``aiodiskqueue`` command: every command, its options and
their checks."""

from __future__ import annotations

import argparse

from ... import __version__
from ..._core.options import check_mode
from .commands import cmd_inspect, cmd_ls, cmd_repair, cmd_stats, cmd_verify
from .dump import cmd_dump


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _pos_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _file_mode(text: str) -> int:
    try:
        v = int(text.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an octal mode such as 600, got {text!r}"
                                         ) from None
    try:
        return check_mode("--file-mode", v, 0o600)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--file-mode ")) from None


def _pos_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aiodiskqueue`` command."""
    parser = argparse.ArgumentParser(
        prog="aiodiskqueue",
        description="Inspect, dump, verify and repair go-diskqueue compatible queues.",
        epilog="Exit codes: 0 ok, 1 problems found or repairs needed, 2 error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def queue_cmd(name: str, help_: str, json_help: str = "machine-readable output",
                  progress: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("directory", metavar="DIR", help="directory holding the queue's files")
        p.add_argument("name", metavar="NAME",
                       help="queue name (the file name prefix); stats, inspect and verify "
                            "also take a queue group's name")
        p.add_argument("--json", action="store_true", help=json_help)
        p.add_argument("--min-msg-size", type=_nonneg_int, default=0, metavar="N",
                       help="smallest valid message, as the queue was opened (default 0)")
        p.add_argument("--max-msg-size", type=_nonneg_int, default=1 << 20, metavar="N",
                       help="largest valid message, as the queue was opened (default 1048576)")
        if progress:
            p.add_argument("--no-progress", action="store_true",
                           help="no progress bar, even on a terminal")
        return p

    p = sub.add_parser("ls", help="list the queues and queue groups in a directory",
                       description="List every queue in a directory, and every queue group "
                                   "(NAME.group/) as one entry with its shards.")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--json", action="store_true", help="a JSON list of objects")
    p.set_defaults(func=cmd_ls)

    queue_cmd("inspect", "meta file, segments with record counts and byte ranges, "
              "read and unread, depth against a scan").set_defaults(func=cmd_inspect)

    p = queue_cmd("dump", "print messages without consuming them, oldest unread first",
                  "one JSON object per line (same as --format json, or nsq fields with "
                  "--format nsq)", progress=False)
    p.add_argument("--from", dest="from_", type=_nonneg_int, default=0, metavar="N",
                   help="skip the first N unread messages")
    p.add_argument("--limit", type=_nonneg_int, default=None, metavar="K",
                   help="print at most K messages (with --follow: stop after K)")
    p.add_argument("--format", choices=("raw", "hex", "json", "nsq"), default="raw",
                   help="raw: payload per line; hex: index, file, offset, length, hex; "
                        "json: object per line; nsq: decode nsqd's id, timestamp, attempts")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing messages as they are written, like tail -f")
    p.add_argument("--interval", type=_pos_float, default=0.5, metavar="SECONDS",
                   help="poll interval for --follow (default 0.5)")
    p.add_argument("--quarantined", action="store_true",
                   help="instead, the records still readable in the quarantined .bad files "
                        "(each up to its first damage), to salvage them")
    p.set_defaults(func=cmd_dump, no_progress=True)

    queue_cmd("verify", "scan every record; exit 1 listing each problem with file and "
              "byte offset").set_defaults(func=cmd_verify)

    p = queue_cmd("repair", "truncate torn tails, quarantine bad segments, index unindexed "
                  "records, rewrite a consistent meta")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be done and change nothing; exit 1 if repairs "
                        "are needed")
    p.add_argument("--file-mode", type=_file_mode, default=None, metavar="MODE",
                   help="octal mode of the files the repair creates, e.g. 660 (default: "
                        "the mode of the queue's meta or lock file, else "
                        "600); a .bad copy always gets the mode of the segment it copies")
    p.set_defaults(func=cmd_repair)

    p = queue_cmd("stats", "depth and put/get rates from the files", "one JSON object per "
                  "sample", progress=False)
    p.add_argument("--watch", action="store_true", help="keep sampling (Ctrl-C to stop)")
    p.add_argument("--interval", type=_pos_float, default=1.0, metavar="SECONDS",
                   help="seconds between samples (default 1)")
    p.add_argument("--count", type=_pos_int, default=None, metavar="N",
                   help="stop after N samples")
    p.set_defaults(func=cmd_stats)

    return parser
