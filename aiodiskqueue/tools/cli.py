"""The ``aiodiskqueue`` command: look at, check and repair queues on disk.

Every command works on the files alone, so it also works on queues written by
go-diskqueue / nsqd. Read-only commands (``ls``, ``inspect``, ``dump``,
``verify``, ``stats``) never change a file and take ``--json``. ``repair``
refuses to run while a live process has the queue open.

Exit codes: 0 success (``verify``: sound; ``repair --dry-run``: nothing to do),
1 problems found or repairs needed, 2 usage or operational error (no such queue,
queue locked, unreadable directory), 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from .. import __version__
from .._core.options import check_mode
from .._format import nsq
from .._format.access import as_queue_error, check_dir, queue_modes
from .._format.group import group_names
from .._format.layout import Layout, queue_names
from .._format.lock import lock_holder
from .._format.meta import load_meta
from ..errors import GroupNameConflict, QueueLocked, QueueNotFound
from .follow import (
    Follower,
    StoredMessage,
    Watcher,
    iter_messages,
    iter_quarantined,
    quarantine_summary,
)
from .group import GroupFiles, check_one_kind, conflict_message, group_files
from .inspect import (
    ERROR,
    Problem,
    QueueReport,
    RolesState,
    analyze,
    analyze_live,
    holder,
    queue_exists,
    roles_state,
    total_bytes,
    unindexed_tail,
)
from .repair import plan_repair, repair

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error reported to the user as one line on stderr, exit code 2."""


# ---------------------------------------------------------------------- output helpers


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _json_line(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")


def _json_doc(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _table(rows: list[list[str]], right: frozenset[int] = frozenset()) -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        _out("  ".join(cells).rstrip())


@contextlib.contextmanager
def _progress(total: int, enabled: bool, label: str) -> Iterator[Callable[[int], None] | None]:
    """A byte progress bar on stderr when it is a terminal and tqdm is installed."""
    if not enabled or total <= 0 or not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        yield None
        return
    bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
               file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield bar.update
    finally:
        bar.close()


def _group(args: argparse.Namespace) -> GroupFiles | None:
    """The group ``args.name`` names in ``args.directory``, or None for a plain queue.

    Raises CliError if the directory is missing or the name is both a queue and a group.
    """
    directory = args.directory
    check_dir(directory, os.R_OK | os.X_OK)  # else a queue it may not see looks like none
    if not os.path.isdir(directory):
        raise CliError(f"not a directory: {directory}")
    try:
        check_one_kind(directory, args.name)
    except GroupNameConflict:
        raise CliError(conflict_message(directory, args.name)) from None
    return group_files(directory, args.name)


def _layout(args: argparse.Namespace) -> Layout:
    directory = args.directory
    group = _group(args)
    if group is not None:
        raise CliError(
            f"{args.name!r} is a queue group of {len(group.shards)} shard(s); "
            f"'{args.command}' works on one queue: each shard is the queue {args.name!r} in "
            f"its directory, e.g. '{args.command} {os.path.join(group.path, '000000')} "
            f"{args.name}' ('ls {directory}' lists the shards)")
    lay = queue_modes(Layout(directory, args.name))
    if getattr(args, "file_mode", None) is not None:
        lay = dataclasses.replace(lay, file_mode=args.file_mode)
    if not queue_exists(lay):
        raise CliError(f"no queue named {args.name!r} in {directory}")
    return lay


def _analyze(args: argparse.Namespace, lay: Layout) -> tuple[QueueReport, RolesState]:
    with _progress(total_bytes(lay), not args.no_progress, f"scanning {lay.name}") as cb:
        return analyze_live(lay, args.min_msg_size, args.max_msg_size, cb)


def _roles_cell(roles: dict[str, Any]) -> str:
    p, c = roles["producer"], roles["consumer"]
    if p is None and c is None:
        return "-"
    return f"{'-' if p is None else p['pid']}/{'-' if c is None else c['pid']}"


def _pos(p: tuple[int, int]) -> str:
    return f"{p[0]},{p[1]}"


# ---------------------------------------------------------------------- ls


def _ls_entry(lay: Layout) -> dict[str, Any]:
    segs = lay.segments()
    size = 0
    for path in segs.values():
        with contextlib.suppress(FileNotFoundError):
            size += os.stat(path).st_size
    try:
        meta = load_meta(lay.meta_path)
    except ValueError:
        meta = None
    roles = roles_state(lay)
    if meta is not None:
        # The meta as of the last sync, plus what a running writer added since (a live
        # producer: what it has published).
        tail, write = unindexed_tail(lay, meta, limit=roles.limit)
        depth, read, meta_state = meta.depth + tail, meta.read, "ok"
    else:
        # No usable meta: count what a reader would find (as the queue does on open).
        rep = analyze(lay, limit=roles.limit)
        depth, read, write, meta_state = rep.depth, rep.read, rep.write, rep.meta_state
    bad = lay.bad_files()
    return {
        "name": lay.name,
        "depth": depth,
        "segments": len(segs),
        "bytes": size,
        "read_file_num": read[0],
        "read_pos": read[1],
        "write_file_num": write[0],
        "write_pos": write[1],
        "bad_files": len(bad),
        "bad_file_names": [os.path.basename(b) for b in bad],
        "locked_by_pid": holder(lay),
        "meta": meta_state,
        "empty_messages": os.path.exists(lay.empty_marker_path),
        "roles": roles.to_dict(),
    }


def _group_entry(group: GroupFiles) -> dict[str, Any]:
    shards = [{**_ls_entry(lay), "shard": num, "path": lay.directory}
              for num, lay in group.shards.items()]
    return {
        "name": group.name,
        "kind": "group",
        "path": group.path,
        "meta": "ok" if group.meta is not None else
                "missing" if group.meta_error is None else "unreadable",
        "depth": sum(s["depth"] for s in shards),
        "shards": shards,
        "segments": sum(s["segments"] for s in shards),
        "bytes": sum(s["bytes"] for s in shards),
        "bad_files": sum(s["bad_files"] for s in shards),
        "damaged_shards": list(group.damaged),
        "members": list(group.members),
        "producers": sorted({s["roles"]["producer"]["pid"] for s in shards
                             if s["roles"]["producer"] is not None}),
        "consumers": sorted({s["roles"]["consumer"]["pid"] for s in shards
                             if s["roles"]["consumer"] is not None}),
    }


def _ls_row(e: dict[str, Any], label: str) -> list[str]:
    return [
        label + ("" if e["meta"] == "ok" else f" (meta {e['meta']})"),
        str(e["depth"]), str(e["segments"]), str(e["bytes"]),
        f"{e['read_file_num']},{e['read_pos']}", f"{e['write_file_num']},{e['write_pos']}",
        str(e["bad_files"]),
        "-" if e["locked_by_pid"] is None else str(e["locked_by_pid"]),
        _roles_cell(e["roles"]),
    ]


def _pids(pids: list[int]) -> str:
    return ",".join(map(str, pids)) or "-"


def cmd_ls(args: argparse.Namespace) -> int:
    """List every queue and every group in a directory."""
    directory = args.directory
    try:
        names = queue_names(directory)
    except (FileNotFoundError, NotADirectoryError):
        raise CliError(f"not a directory: {directory}") from None
    groups = group_names(directory)
    entries = [{**_ls_entry(Layout(directory, n)), "kind": "queue"} for n in names]
    for g in groups:
        group = group_files(directory, g)
        if group is not None:  # unless removed since the listing
            entries.append(_group_entry(group))
    entries.sort(key=lambda e: (e["name"], e["kind"]))
    if args.json:
        _json_doc(entries)
        return EXIT_OK
    if not entries:
        _out(f"no queues in {directory}")
        return EXIT_OK
    rows = [["NAME", "DEPTH", "SEGMENTS", "BYTES", "READ", "WRITE", "BAD", "LOCKED BY",
             "PRODUCER/CONSUMER"]]
    for e in entries:
        if e["kind"] == "queue":
            rows.append(_ls_row(e, e["name"]))
            continue
        # A group: one line with its totals, then its shards (named GROUP/SHARD).
        label = f"{e['name']} (group, {len(e['shards'])} shard(s))"
        if e["meta"] != "ok":
            label += f" (group meta {e['meta']})"
        if e["members"]:
            label += f" (group consumers: pids {_pids(e['members'])})"
        if e["damaged_shards"]:
            label += f" (not a directory: {', '.join(e['damaged_shards'])})"
        rows.append([label, str(e["depth"]),
                     str(e["segments"]), str(e["bytes"]), "-", "-", str(e["bad_files"]), "-",
                     f"{_pids(e['producers'])}/{_pids(e['consumers'])}"])
        rows.extend(_ls_row(s, f"  {e['name']}/{s['shard']:06d}") for s in e["shards"])
    _table(rows, right=frozenset({1, 2, 3, 6}))
    return EXIT_OK


# ---------------------------------------------------------------------- inspect / verify


def _print_problems(problems: Sequence[Problem]) -> None:
    for p in problems:
        _out(f"  {p}")


def cmd_inspect(args: argparse.Namespace) -> int:
    """Show the meta file, every segment, and what is read and unread (a group: each
    shard's summary and the total)."""
    group = _group(args)
    if group is not None:
        return _inspect_group(args, group)
    lay = _layout(args)
    rep, roles = _analyze(args, lay)
    bad = [quarantine_summary(b, args.min_msg_size, args.max_msg_size) for b in rep.bad_files]
    if args.json:
        _json_doc({**rep.to_dict(), "quarantined": bad, "roles": roles.to_dict()})
        return EXIT_OK
    _out(f"queue     {rep.name} in {rep.directory}")
    m = rep.meta
    meta_file = os.path.basename(lay.meta_path)
    if m is None:
        _out(f"meta      {meta_file}: {rep.meta_state}" +
             (f" ({rep.meta_error})" if rep.meta_error else ""))
    else:
        _out(f"meta      {meta_file}: depth {m.depth}, read {_pos(m.read)}, "
             f"write {_pos(m.write)}")
    _out("lock      " + ("not open" if rep.locked_by_pid is None
                         else f"open in process {rep.locked_by_pid}"))
    _out(f"roles     {roles.describe()}")
    _out(f"segments  {len(rep.segments)} file(s), {rep.bytes_on_disk} bytes")
    if rep.segments:
        rows = [["  FILE", "SIZE", "RECORDS", "RANGE", "CONSUMED", "UNREAD", "ROLE", "PROBLEM"]]
        for s in rep.segments:
            prob = "-" if s.problem is None else f"{s.problem} @ {s.problem_offset}"
            rows.append(["  " + s.file, str(s.size), str(s.consumed + s.unread),
                         f"0..{s.end}", str(s.consumed), str(s.unread), s.role, prob])
        _table(rows, right=frozenset({1, 2, 4, 5}))
    unread = f"{rep.depth} message(s) unread, from {_pos(rep.read)} to {_pos(rep.write)}"
    _out(f"unread    {unread}")
    if m is not None:
        state = "consistent" if m.depth == rep.indexed_depth else "MISMATCH"
        tail = rep.depth - (rep.indexed_depth or 0)
        extra = f"; {tail} more past the meta's write position" if tail else ""
        _out(f"depth     meta {m.depth}, scan {rep.indexed_depth} ({state}){extra}")
    for q in bad:
        _out(f"quarantined {q['file']}: {q['size']} bytes, {q['records']} readable record(s) "
             f"before offset {q['readable_bytes']} (dump --quarantined shows them)")
    for n in rep.notes:
        if not n.endswith(": quarantined"):
            _out(f"note      {n}")
    if rep.problems:
        _out(f"problems  {len(rep.problems)}")
        _print_problems(rep.problems)
    else:
        _out("problems  none")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Scan every record; exit 0 when sound, 1 listing each problem (a group: every shard)."""
    group = _group(args)
    if group is not None:
        return _verify_group(args, group)
    lay = _layout(args)
    rep, roles = _analyze(args, lay)
    code = EXIT_OK if rep.sound else EXIT_PROBLEMS
    if args.json:
        _json_doc({"name": rep.name, "directory": rep.directory, "sound": rep.sound,
                   "depth": rep.depth, "segments": len(rep.segments),
                   "problems": [p.to_dict() for p in rep.problems],
                   "quarantined": [os.path.basename(b) for b in rep.bad_files],
                   "locked_by_pid": rep.locked_by_pid, "notes": list(rep.notes),
                   "roles": roles.to_dict()})
        return code
    if rep.sound:
        _out(f"{rep.name}: sound ({rep.depth} unread message(s) in "
             f"{len(rep.segments)} segment(s))")
    else:
        _out(f"{rep.name}: {len(rep.problems)} problem(s)")
        _print_problems(rep.problems)
    for b in rep.bad_files:
        _out(f"  quarantined {os.path.basename(b)} (not a problem: set aside earlier)")
    if roles.live:
        limit = "" if roles.limit is None else f"; read up to {_pos(roles.limit)}, published"
        _out(f"  note: roles held: {roles.describe()}{limit}")
    elif rep.locked_by_pid is not None:
        _out(f"  note: open in process {rep.locked_by_pid}; a stale meta is normal while "
             "it runs")
    return code


def _analyze_group(args: argparse.Namespace, group: GroupFiles
                   ) -> list[tuple[str, QueueReport, RolesState]]:
    """Each shard's report and roles, labelled ``NAME/SHARD``."""
    out = []
    for num, lay in group.shards.items():
        try:
            rep, roles = _analyze(args, lay)
        except QueueNotFound:
            continue  # an empty shard, or one removed (drained) since the listing
        out.append((group.shard_label(num), rep, roles))
    return out


def _group_meta_line(group: GroupFiles) -> str:
    m = group.meta
    if m is None:
        return "missing" if group.meta_error is None else f"unreadable ({group.meta_error})"
    return (f"version {m.version}, max_bytes_per_file {m.max_bytes_per_file}, "
            f"msg size {m.min_msg_size}..{m.max_msg_size}")


def _inspect_group(args: argparse.Namespace, group: GroupFiles) -> int:
    reports = _analyze_group(args, group)
    depth = sum(rep.depth for _, rep, _ in reports)
    if args.json:
        _json_doc({"name": group.name, "kind": "group", "directory": group.directory,
                   "path": group.path, "meta": _group_meta_line(group), "depth": depth,
                   "members": list(group.members),
                   "shards": [{**rep.to_dict(), "shard": label, "roles": roles.to_dict()}
                              for label, rep, roles in reports]})
        return EXIT_OK
    _out(f"group     {group.name} in {group.directory}")
    _out(f"meta      {_group_meta_line(group)}")
    _out("consumers " + (f"{len(group.members)} live: pids {_pids(list(group.members))}"
                         if group.members else "none live"))
    _out(f"shards    {len(reports)}, each a plain queue {group.name!r} in "
         f"{group.path}/SHARD ('inspect {group.path}/SHARD {group.name}' shows one in full)")
    if reports:
        rows = [["  SHARD", "DEPTH", "SEGMENTS", "BYTES", "READ", "WRITE", "PRODUCER",
                 "CONSUMER", "PROBLEMS"]]
        for label, rep, roles in reports:
            rows.append(["  " + label, str(rep.depth), str(len(rep.segments)),
                         str(rep.bytes_on_disk), _pos(rep.read), _pos(rep.write),
                         "-" if roles.producer is None else str(roles.producer.pid),
                         "-" if roles.consumer is None else str(roles.consumer.pid),
                         str(len(rep.problems))])
        _table(rows, right=frozenset({1, 2, 3, 8}))
    _out(f"unread    {depth} message(s) in the group")
    problems = [(label, p) for label, rep, _ in reports for p in rep.problems]
    problems += [(f"{group.name}/{d}", _not_a_dir(group, d)) for d in group.damaged]
    if problems:
        _out(f"problems  {len(problems)}")
        for label, p in problems:
            _out(f"  {label}: {p}")
    else:
        _out("problems  none")
    return EXIT_OK


def _not_a_dir(group: GroupFiles, shard: str) -> Problem:
    return Problem("damaged shard", ERROR, shard, 0,
                   f"{os.path.join(group.path, shard)} is not a directory: a shard is one")


def _verify_group(args: argparse.Namespace, group: GroupFiles) -> int:
    reports = _analyze_group(args, group)
    sound = (group.meta_error is None and not group.damaged
             and all(rep.sound for _, rep, _ in reports))
    code = EXIT_OK if sound else EXIT_PROBLEMS
    if args.json:
        _json_doc({"name": group.name, "kind": "group", "path": group.path, "sound": sound,
                   "meta": _group_meta_line(group), "damaged_shards": list(group.damaged),
                   "depth": sum(rep.depth for _, rep, _ in reports),
                   "shards": [{"shard": label, "sound": rep.sound, "depth": rep.depth,
                               "problems": [p.to_dict() for p in rep.problems],
                               "roles": roles.to_dict()} for label, rep, roles in reports]})
        return code
    if group.meta_error is not None:
        _out(f"{group.name}: group meta unreadable ({group.meta_error})")
    for d in group.damaged:
        _out(f"{group.name}/{d}: 1 problem(s)")
        _print_problems([_not_a_dir(group, d)])
    for label, rep, _ in reports:
        if rep.sound:
            _out(f"{label}: sound ({rep.depth} unread message(s) in "
                 f"{len(rep.segments)} segment(s))")
        else:
            _out(f"{label}: {len(rep.problems)} problem(s)")
            _print_problems(rep.problems)
    _out(f"{group.name}: " + ("sound" if sound else "problems found") +
         f" ({len(reports)} shard(s))")
    return code


# ---------------------------------------------------------------------- repair


def cmd_repair(args: argparse.Namespace) -> int:
    """Make a damaged queue consistent again, keeping every readable record."""
    lay = _layout(args)
    pid = lock_holder(lay.lock_path)  # every holder, a role being opened too
    if pid is not None:
        raise CliError(f"refusing to repair {lay.name!r}: it is open in process {pid}")
    if args.dry_run:
        plan = plan_repair(_analyze(args, lay)[0])
        if args.json:
            _json_doc({"name": lay.name, "dry_run": True, "needed": plan.needed,
                       "problems": [p.to_dict() for p in plan.report.problems],
                       "actions": [a.to_dict() for a in plan.actions]})
        elif plan.needed:
            _out(f"{lay.name}: {len(plan.actions)} repair(s) needed (dry run, nothing changed)")
            _print_problems(plan.report.problems)
            _out("would:")
            for a in plan.actions:
                _out(f"  {a}")
        else:
            _out(f"{lay.name}: nothing to repair")
        return EXIT_PROBLEMS if plan.needed else EXIT_OK
    try:
        with _progress(total_bytes(lay), not args.no_progress, f"scanning {lay.name}") as cb:
            plan, done = repair(lay, args.min_msg_size, args.max_msg_size, cb)
    except QueueLocked as exc:
        raise CliError(f"refusing to repair {lay.name!r}: {exc}") from None
    after = analyze(lay, args.min_msg_size, args.max_msg_size)
    if args.json:
        _json_doc({"name": lay.name, "dry_run": False, "needed": plan.needed,
                   "problems": [p.to_dict() for p in plan.report.problems],
                   "actions": [a.to_dict() for a in plan.actions], "done": done,
                   "sound": after.sound,
                   "remaining": [p.to_dict() for p in after.problems]})
    elif not plan.needed:
        _out(f"{lay.name}: nothing to repair")
    else:
        _out(f"{lay.name}: repaired")
        for d in done:
            _out(f"  {d}")
        if after.sound:
            _out(f"  now sound: {after.depth} unread message(s)")
        else:
            _out("  still not sound:")
            _print_problems(after.problems)
    return EXIT_OK if after.sound else EXIT_PROBLEMS


# ---------------------------------------------------------------------- dump


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
    lay = _layout(args)
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


# ---------------------------------------------------------------------- stats


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:,.1f}"


def cmd_stats(args: argparse.Namespace) -> int:
    """Depth and put/get rates from successive snapshots of the files."""
    group = _group(args)
    if group is not None:
        return _stats_group(args, group)
    lay = _layout(args)
    watcher = Watcher(lay, args.min_msg_size, args.max_msg_size)
    count = args.count if args.count is not None else (None if args.watch else 1)
    n = 0
    if not args.json:
        _out(f"{'TIME':8}  {'DEPTH':>10}  {'PUT/S':>12}  {'GET/S':>12}  {'BYTES':>12}  "
             "READ / WRITE")
    while True:
        s = watcher.sample(time.monotonic())
        roles = roles_state(lay)
        wall = time.time()
        if args.json:
            _json_line({"name": lay.name, "timestamp": wall, **s.to_dict(),
                        "roles": roles.to_dict()})
        else:
            clock = dt.datetime.fromtimestamp(wall).strftime("%H:%M:%S")
            _out(f"{clock:8}  {s.depth:>10}  {_rate(s.put_rate):>12}  {_rate(s.get_rate):>12}  "
                 f"{s.bytes_on_disk:>12}  {_pos(s.read)} / {_pos(s.write)}" +
                 ("" if not roles.live else f"  ({roles.describe()})"))
        sys.stdout.flush()
        n += 1
        if count is not None and n >= count:
            return EXIT_OK
        time.sleep(args.interval)


def _sum_rate(rates: list[float | None]) -> float | None:
    known = [r for r in rates if r is not None]
    return sum(known) if known else None


def _stats_group(args: argparse.Namespace, group: GroupFiles) -> int:
    """``stats`` of a group: a line per shard and the group's total, each sample.

    Shards that appear while it watches are added (their first sample has no rate);
    shards removed are dropped.
    """
    watchers: dict[int, Watcher] = {}
    count = args.count if args.count is not None else (None if args.watch else 1)
    n = 0
    if not args.json:
        _out(f"{'TIME':8}  {'SHARD':20}  {'DEPTH':>10}  {'PUT/S':>12}  {'GET/S':>12}  "
             f"{'BYTES':>12}  READ / WRITE")
    while True:
        now = group_files(group.directory, group.name)
        shards = {} if now is None else now.shards
        watchers = {num: watchers.get(num) or Watcher(lay, args.min_msg_size,
                                                      args.max_msg_size)
                    for num, lay in shards.items()}
        mono, wall = time.monotonic(), time.time()
        samples = [(group.shard_label(num), w.sample(mono), roles_state(w.layout))
                   for num, w in watchers.items()]
        depth = sum(s.depth for _, s, _ in samples)
        put = _sum_rate([s.put_rate for _, s, _ in samples])
        get = _sum_rate([s.get_rate for _, s, _ in samples])
        size = sum(s.bytes_on_disk for _, s, _ in samples)
        if args.json:
            _json_line({"name": group.name, "kind": "group", "timestamp": wall,
                        "depth": depth, "put_rate": put, "get_rate": get, "bytes": size,
                        "shards": [{"shard": label, **s.to_dict(), "roles": r.to_dict()}
                                   for label, s, r in samples]})
        else:
            clock = dt.datetime.fromtimestamp(wall).strftime("%H:%M:%S")
            for label, s, r in samples:
                _out(f"{clock:8}  {label:20}  {s.depth:>10}  {_rate(s.put_rate):>12}  "
                     f"{_rate(s.get_rate):>12}  {s.bytes_on_disk:>12}  "
                     f"{_pos(s.read)} / {_pos(s.write)}" +
                     ("" if not r.live else f"  ({r.describe()})"))
            _out(f"{clock:8}  {'TOTAL':20}  {depth:>10}  {_rate(put):>12}  {_rate(get):>12}  "
                 f"{size:>12}  {len(samples)} shard(s)")
        sys.stdout.flush()
        n += 1
        if count is not None and n >= count:
            return EXIT_OK
        time.sleep(args.interval)


# ---------------------------------------------------------------------- parser


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except QueueNotFound as exc:
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except PermissionError as exc:
        sys.stderr.write(f"aiodiskqueue: {as_queue_error(exc, args.directory)}\n")
        return EXIT_ERROR
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader went away (``| head``): stop quietly, and keep Python from
            # complaining again when it flushes stdout at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        sys.stderr.write(f"aiodiskqueue: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
